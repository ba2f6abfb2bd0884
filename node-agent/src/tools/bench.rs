//! `cotenant-agent bench`: runs `instances` copies of a model concurrently at `batch`, each with
//! its share of the thread budget, for a fixed duration; prints throughput and latency
//! percentiles (and, with `COTENANT_PROFILE` set, where the time went per op kind; per node
//! with `COTENANT_PROFILE=node`).

use anyhow::{Context, bail};
use clap::Args;
use cotenant_executor::runtime::measure;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[arg(long)]
    pub model: PathBuf,
    /// Samples per run: the batch of the synthetic inputs, and what throughput counts.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// An input as NAME=path.npy (repeat for each input) instead of synthetic ones: the
    /// model's own values and shapes (`--batch` then only counts samples).
    #[arg(long = "input", value_name = "NAME=PATH")]
    pub inputs: Vec<String>,
    /// Concurrent instances of the model (weights shared).
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// How long to measure, e.g. 10s, 500ms, 2m.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Total thread budget, split evenly across instances (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Untimed runs per instance before measuring.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    #[command(flatten)]
    pub device: crate::device::DeviceArgs,
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => v,
        "ms" => v / 1e3,
        "m" | "min" => v * 60.0,
        _ => return Err(format!("bad duration unit in {s:?} (use ms, s, m)")),
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(secs))
}

pub fn main(a: BenchArgs) -> anyhow::Result<()> {
    if a.batch == 0 || a.instances == 0 {
        bail!("--batch and --instances must be at least 1");
    }
    let device = a.device.choose()?;
    let model = std::sync::Arc::new(super::load_model(&a.model, device.target())?);
    let threads = a.threads.unwrap_or_else(super::default_threads);
    let per_instance = (threads / a.instances).max(1);
    let inputs = match a.inputs.is_empty() {
        true => super::synthetic_inputs(&model, a.batch, 1),
        false => super::read_inputs(&a.inputs)?,
    };
    // Fail fast on a model that cannot run at all, with its error.
    let mut probe = device
        .place("bench", &model)
        .and_then(|p| p.engine(per_instance, None))
        .map_err(anyhow::Error::msg)?;
    let device_name = probe.name();
    probe
        .run(inputs.clone())
        .context("running the model once")?;
    drop(probe);
    let m = measure(
        &device,
        &model,
        &inputs,
        a.batch,
        a.instances,
        threads,
        a.duration,
        a.warmup,
    )
    .context("measuring the model")?;
    let lat = &m.latencies_ms;
    let elapsed = m.elapsed.as_secs_f64();
    let runs = lat.len();
    let throughput = m.throughput;
    let (p50, p95, p99) = (
        m.percentile_ms(50.0),
        m.percentile_ms(95.0),
        m.percentile_ms(99.0),
    );
    let mean = lat.iter().sum::<f64>() / runs.max(1) as f64;
    let weight_bytes = model.plan.weight_bytes();
    let peak = model.plan.peak_activation_bytes(a.batch).unwrap_or(0);
    if a.json {
        println!(
            "{{\"model\": {:?}, \"batch\": {}, \"instances\": {}, \"threads\": {}, \"device\": {device_name:?}, \"runs\": {runs}, \"elapsed_s\": {elapsed:.3}, \"throughput_per_s\": {throughput:.3}, \"mean_ms\": {mean:.3}, \"p50_ms\": {p50:.3}, \"p95_ms\": {p95:.3}, \"p99_ms\": {p99:.3}, \"weight_bytes\": {weight_bytes}, \"peak_activation_bytes\": {peak}}}",
            a.model.display().to_string(),
            a.batch,
            a.instances,
            threads
        );
    } else {
        println!(
            "model {} batch {} instances {} threads {} ({} per instance) on {device_name}",
            a.model.display(),
            a.batch,
            a.instances,
            threads,
            per_instance
        );
        println!("runs {runs} in {elapsed:.2}s: throughput {throughput:.1} samples/s");
        println!("latency ms: mean {mean:.2} p50 {p50:.2} p95 {p95:.2} p99 {p99:.2}");
        println!(
            "weights {:.1} MiB, peak activations at batch {} {:.1} MiB",
            weight_bytes as f64 / 1048576.0,
            a.batch,
            peak as f64 / 1048576.0
        );
    }
    let prof = model.plan.op_profile();
    if !prof.is_empty() {
        let total: f64 = prof.iter().map(|p| p.2.as_secs_f64()).sum();
        eprintln!("per-op time (COTENANT_PROFILE), all runs and instances:");
        for (op, n, d) in prof {
            eprintln!(
                "  {op:<24} {n:>8} calls {:>10.1} ms {:>5.1}%",
                d.as_secs_f64() * 1e3,
                100.0 * d.as_secs_f64() / total
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("0s").is_err() && parse_duration("x").is_err());
    }
}
