//! GACER on the CPU backend (or, with `--device cuda` in a `cuda` build, on the GPU): how long
//! the search takes per plan for 2, 4 and 8 tenants of zoo models, and the three schedules
//! compared on the same tenant mixes (throughput and p99 per tenant). Prints markdown tables.
//!
//! ```sh
//! cargo run --release -p cotenant-executor --example gacer_search -- [--duration SECS] [--threads N] [--device cpu|auto|cuda]
//! ```
//!
//! On a GPU the mixes are the ones `device-check` reports: resnet50 + bert + mobilenet_v2 at
//! batch 1, 4 and 8, vgg16 + resnet18 and 4 × mobilenet_v2 at batch 1, each with the GPU's
//! utilisation during every schedule (sampled through `nvidia-smi`, NVML's command-line client,
//! where it exists) and the per-step timeline of one GACER round: which steps of one tenant ran
//! while which steps of the others did. `--device sim` runs the GPU flow on the simulated device.

use cotenant_executor::gacer::run::{TraceEvent, TraceKind};
use cotenant_executor::gacer::{
    CoRunOptions, CoRunReport, DeviceShape, MixTenant, ModelProfile, Schedule, SearchOptions, Stop,
    TenantWork, co_run, search,
};
use cotenant_executor::zoo::{self, ZooOptions};
use cotenant_executor::{DType, Device, DeviceRequest, Model, Target, Tensor};
use prost::Message;
use std::collections::HashMap;
use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

struct Args {
    duration: Duration,
    threads: usize,
    device: Device,
}

fn args() -> Result<Args> {
    let mut a = Args {
        duration: Duration::from_secs(6),
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        device: Device::Cpu,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--duration" => a.duration = Duration::from_secs_f64(value.parse()?),
            "--threads" => a.threads = value.parse()?,
            "--device" => {
                let (device, why) =
                    Device::choose(value.parse::<DeviceRequest>()?, 0, u64::MAX, false)?;
                eprintln!("gacer_search: {why}");
                a.device = device;
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(a)
}

/// Zoo models, loaded once each.
struct Zoo(HashMap<&'static str, Arc<Model>>);

impl Zoo {
    fn get(&mut self, name: &'static str) -> Result<Arc<Model>> {
        if let Some(m) = self.0.get(name) {
            return Ok(m.clone());
        }
        let o = ZooOptions {
            seed: 1,
            ..Default::default()
        };
        let bytes = zoo::build(name, &o)?.encode_to_vec();
        let m = Arc::new(Model::from_bytes_for(&bytes, Target::Gpu)?);
        self.0.insert(name, m.clone());
        Ok(m)
    }
}

/// A batch of seeded inputs in [-1, 1) (token ids, as the example inputs give them).
fn inputs(model: &Model, batch: usize, seed: u64) -> Result<Vec<(String, Tensor)>> {
    let mut rng = zoo::Rng::new(seed);
    model
        .plan
        .example_inputs(batch)
        .into_iter()
        .map(|(n, t)| {
            if t.dtype() != DType::F32 {
                return Ok((n, t));
            }
            let v = (0..t.len()).map(|_| rng.uniform() * 2.0 - 1.0).collect();
            Ok((n, Tensor::f32(t.shape.clone(), v)?))
        })
        .collect()
}

fn profile(
    zoo: &mut Zoo,
    cache: &mut HashMap<(&'static str, usize), Arc<ModelProfile>>,
    name: &'static str,
    batch: usize,
    (device, threads): (&Device, usize),
) -> Result<Arc<ModelProfile>> {
    if let Some(p) = cache.get(&(name, batch)) {
        return Ok(p.clone());
    }
    let m = zoo.get(name)?;
    let mut engine = device.place(name, &m)?.engine(threads, None)?;
    let p = Arc::new(engine.profile(name, &inputs(&m, batch, 7)?, 2, &[2, 4])?);
    cache.insert((name, batch), p.clone());
    Ok(p)
}

fn search_cost(zoo: &mut Zoo, device: &Device, threads: usize) -> Result<()> {
    let cycle: [&'static str; 4] = ["resnet18", "mobilenet_v2", "squeezenet", "resnet50"];
    let batch = 2;
    let mut profiles = HashMap::new();
    println!("## Search cost\n");
    let shape = match device {
        Device::Cpu => DeviceShape::h200(),
        gpu => gpu.shape(1, threads),
    };
    println!(
        "Profiles measured on {} at batch {batch} ({threads} CPU threads); the search scores \
         plans for the {} device shape. Median of 5 searches.\n",
        if device.is_gpu() {
            "the GPU"
        } else {
            "this CPU"
        },
        shape.name
    );
    println!(
        "| tenants | models | steps | ms per plan | pointers | split steps | predicted round ms (unregulated → plan) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for n in [2usize, 4, 8] {
        let names: Vec<&'static str> = (0..n).map(|i| cycle[i % cycle.len()]).collect();
        let mix: Vec<MixTenant> = names
            .iter()
            .map(|&name| {
                Ok(MixTenant {
                    profile: profile(zoo, &mut profiles, name, batch, (device, threads))?,
                    latency_bound: None,
                })
            })
            .collect::<Result<_>>()?;
        let mut times = Vec::new();
        let mut plan = None;
        for _ in 0..5 {
            let t0 = Instant::now();
            plan = Some(search(&mix, &shape, &SearchOptions::default()));
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let plan = plan.ok_or("no search ran")?;
        let unregulated = unregulated_makespan(&mix, &shape);
        let steps: usize = mix.iter().map(|t| t.profile.steps.len()).sum();
        let splits = plan.splits.iter().flatten().filter(|&&k| k > 1).count();
        println!(
            "| {n} | {} | {steps} | {:.2} | {} | {splits} | {:.2} → {:.2} |",
            names.join(" + "),
            times[times.len() / 2],
            plan.pointers.len(),
            unregulated * 1e3,
            plan.predicted_makespan * 1e3
        );
    }
    println!();
    Ok(())
}

fn unregulated_makespan(mix: &[MixTenant], device: &DeviceShape) -> f64 {
    let profiles: Vec<ModelProfile> = mix.iter().map(|t| (*t.profile).clone()).collect();
    let model = cotenant_executor::gacer::CostModel {
        profiles: &profiles,
        device,
        latency_bounds: vec![None; mix.len()],
    };
    let counts: Vec<usize> = profiles.iter().map(|p| p.steps.len()).collect();
    model
        .predict(&cotenant_executor::gacer::GacerPlan::unregulated(&counts))
        .map_or(f64::NAN, |p| p.makespan)
}

/// GPU utilisation sampled every 100 ms by `nvidia-smi` while a schedule runs.
struct Utilisation {
    child: Option<std::process::Child>,
}

impl Utilisation {
    fn start(gpu: bool) -> Utilisation {
        let child = gpu
            .then(|| {
                std::process::Command::new("nvidia-smi")
                    .args([
                        "--query-gpu=utilization.gpu",
                        "--format=csv,noheader,nounits",
                        "-lms",
                        "100",
                    ])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .ok()
            })
            .flatten();
        Utilisation { child }
    }

    /// Mean utilisation in percent over the samples, if any were taken.
    fn stop(self) -> Option<f64> {
        let mut child = self.child?;
        let _ = child.kill();
        let out = child.wait_with_output().ok()?;
        let samples: Vec<f64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        (!samples.is_empty()).then(|| samples.iter().sum::<f64>() / samples.len() as f64)
    }
}

/// Which steps of each tenant ran while another tenant's steps ran, from one round's trace.
fn print_timeline(trace: &[TraceEvent], tenants: &[TenantWork]) {
    let mut running: Vec<(usize, usize)> = Vec::new();
    // Per (tenant, step): the other tenants' steps seen running alongside it.
    let mut alongside: std::collections::BTreeMap<(usize, usize), Vec<(usize, usize)>> =
        Default::default();
    for e in trace {
        let me = (e.step.tenant, e.step.step);
        match e.kind {
            TraceKind::Start => {
                for &other in &running {
                    if other.0 != me.0 {
                        alongside.entry(me).or_default().push(other);
                        alongside.entry(other).or_default().push(me);
                    }
                }
                running.push(me);
            }
            TraceKind::Finish => running.retain(|&r| r != me),
        }
    }
    let steps: usize = tenants.iter().map(|t| t.model.plan.steps.len()).sum();
    println!(
        "Timeline of one GACER round: {} of {steps} steps ran alongside another tenant's.\n",
        alongside.len()
    );
    println!("| tenant | step | op | ran alongside (tenant:step) |");
    println!("|---|---|---|---|");
    for ((t, s), others) in alongside.iter().take(40) {
        let mut others = others.clone();
        others.sort();
        others.dedup();
        // Runs of consecutive steps of one tenant as "tenant:first-last".
        let mut list: Vec<String> = Vec::new();
        let mut i = 0;
        while i < others.len() {
            let (o, first) = others[i];
            let mut last = first;
            while i + 1 < others.len() && others[i + 1] == (o, last + 1) {
                i += 1;
                last += 1;
            }
            list.push(match last == first {
                true => format!("{o}:{first}"),
                false => format!("{o}:{first}-{last}"),
            });
            i += 1;
        }
        println!(
            "| {t} | {s} | {} | {} |",
            tenants[*t].model.plan.steps[*s].op.name(),
            list.join(" ")
        );
    }
    println!();
}

fn compare(
    zoo: &mut Zoo,
    a: &Args,
    title: &str,
    names: &[&'static str],
    batch: usize,
) -> Result<()> {
    let mut tenants = Vec::new();
    for (i, &name) in names.iter().enumerate() {
        let model = zoo.get(name)?;
        tenants.push(TenantWork {
            name: format!("{name}#{i}"),
            inputs: inputs(&model, batch, i as u64)?,
            model,
        });
    }
    // Profiles at the threads each tenant's stream gets under multi-stream and gacer.
    let per_stream = (a.threads / names.len()).max(1);
    let mut cache = HashMap::new();
    let mix: Vec<MixTenant> = names
        .iter()
        .map(|&name| {
            Ok(MixTenant {
                profile: profile(zoo, &mut cache, name, batch, (&a.device, per_stream))?,
                latency_bound: None,
            })
        })
        .collect::<Result<_>>()?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let device = a.device.shape(cores, per_stream);
    let t0 = Instant::now();
    let plan = search(&mix, &device, &SearchOptions::default());
    let search_ms = t0.elapsed().as_secs_f64() * 1e3;
    // The plan the same profiles give for a GPU, executed here: what its pieces and pointers
    // cost on the CPU.
    let gpu_plan = search(&mix, &DeviceShape::h200(), &SearchOptions::default());
    let opts = CoRunOptions {
        threads: a.threads,
        warmup_rounds: 1,
        stop: Stop::After(a.duration),
        trace: false,
        device: a.device.clone(),
    };
    println!("### {title} (batch {batch}, {} threads)\n", a.threads);
    println!(
        "GACER plan for `{}`: {} pointers, {} resized steps, searched in {search_ms:.1} ms; \
         predicted round {:.1} ms.\n",
        device.name,
        plan.pointers.len(),
        plan.splits.iter().flatten().filter(|&&k| k > 1).count(),
        plan.predicted_makespan * 1e3
    );
    let mut schedules = vec![
        Schedule::Sequential,
        Schedule::MultiStream,
        Schedule::gacer(plan),
    ];
    let mut names = vec!["sequential", "multi-stream", "gacer"];
    // On a GPU the plan was searched for it already.
    if !a.device.is_gpu() {
        println!(
            "`gacer-h200` runs the plan searched for the H200 shape from the same profiles: {} \
             pointers, {} resized steps.\n",
            gpu_plan.pointers.len(),
            gpu_plan.splits.iter().flatten().filter(|&&k| k > 1).count(),
        );
        schedules.push(Schedule::gacer(gpu_plan));
        names.push("gacer-h200");
    }
    let mut reports: Vec<CoRunReport> = Vec::new();
    let mut utilisation = Vec::new();
    for s in &schedules {
        let sampler = Utilisation::start(a.device.is_gpu());
        reports.push(co_run(&tenants, s, &opts)?);
        utilisation.push(sampler.stop());
    }
    print!("| tenant |");
    for n in &names {
        print!(" {n} rows/s | {n} p99 ms |");
    }
    println!();
    println!("|---|{}", "---|---|".repeat(reports.len()));
    for (i, tenant) in tenants.iter().enumerate() {
        print!("| {} |", tenant.name);
        for r in &reports {
            let t = &r.tenants[i];
            print!(" {:.2} | {:.1} |", t.throughput, t.percentile_ms(99.0));
        }
        println!();
    }
    print!("| **all** |");
    for r in &reports {
        print!(" **{:.2}** | |", r.throughput());
    }
    println!();
    let base = reports[1].throughput();
    let ratios: Vec<String> = names
        .iter()
        .zip(&reports)
        .filter(|(n, _)| **n != "multi-stream")
        .map(|(n, r)| format!("{n} {:.2}x", r.throughput() / base))
        .collect();
    println!("\nThroughput vs multi-stream: {}.\n", ratios.join(", "));
    if a.device.is_gpu() {
        let util: Vec<String> = names
            .iter()
            .zip(&utilisation)
            .map(|(n, u)| match u {
                Some(u) => format!("{n} {u:.0}%"),
                None => format!("{n} n/a"),
            })
            .collect();
        println!("GPU utilisation (nvidia-smi): {}.\n", util.join(", "));
        // One more GACER round, traced on the device.
        let traced = CoRunOptions {
            warmup_rounds: 1,
            stop: Stop::Rounds(1),
            trace: true,
            ..opts.clone()
        };
        let report = co_run(&tenants, &schedules[2], &traced)?;
        print_timeline(&report.trace, &tenants);
    }
    Ok(())
}

fn main() -> Result<()> {
    let a = args()?;
    let mut zoo = Zoo(HashMap::new());
    search_cost(&mut zoo, &a.device, a.threads)?;
    let on = if a.device.is_gpu() { "GPU" } else { "CPU" };
    println!("## Schedules on the {on} backend\n");
    println!(
        "Closed loop: every tenant runs its batch again as soon as the last one finished; \
         {:.0} s measured per schedule after one warm-up round.\n",
        a.duration.as_secs_f64()
    );
    if a.device.is_gpu() {
        let heterogeneous = ["resnet50", "bert", "mobilenet_v2"];
        for batch in [1, 4, 8] {
            compare(
                &mut zoo,
                &a,
                "resnet50 + bert + mobilenet_v2",
                &heterogeneous,
                batch,
            )?;
        }
        compare(&mut zoo, &a, "vgg16 + resnet18", &["vgg16", "resnet18"], 1)?;
        compare(&mut zoo, &a, "4 × mobilenet_v2", &["mobilenet_v2"; 4], 1)?;
        return Ok(());
    }
    compare(
        &mut zoo,
        &a,
        "resnet18 + mobilenet_v2 + squeezenet",
        &["resnet18", "mobilenet_v2", "squeezenet"],
        1,
    )?;
    compare(&mut zoo, &a, "4 × mobilenet_v2", &["mobilenet_v2"; 4], 1)?;
    compare(
        &mut zoo,
        &a,
        "resnet18 + mobilenet_v2 + squeezenet",
        &["resnet18", "mobilenet_v2", "squeezenet"],
        4,
    )?;
    Ok(())
}
