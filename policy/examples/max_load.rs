//! Closed-loop "maximum throughput at the SLO", the DNNScaler paper's own comparison, in the
//! simulator: for each model, the highest Poisson rate one replica on one device holds with at
//! least 99% of the offered requests answered within the SLO (dropped and unfinished requests
//! count as misses), under static b=1 m=1, DNNScaler and Clipper AIMD, found by bisection.
//!
//! The policies see a profile table; batches take what a separate measured truth says
//! (`policy/data/cpu-service-times.json` for the CPU; the synthetic GPU table is its own truth).
//! SLO = `--slo-factor` (5) x the truth's batch-1 p50, as `node-agent/bench/agent_bench.py
//! --max-load` sets it on a real agent.
//!
//! `cargo run --release -p cotenant-policy --example max_load [-- --json out.json] [--seed N]
//! [--warmup 10] [--measure 20] [--slo-factor 5]`

use cotenant_policy::sim::{
    Arrivals, Interference, ServiceTimes, SimConfig, TenantSpec, Workload, World, simulate,
};
use cotenant_policy::{Bounds, Knobs, ProfileTable, ScalerConfig, Slo, Strategy};
use std::path::Path;

const TARGET: f64 = 0.99;

fn policies() -> [(&'static str, Strategy); 3] {
    [
        ("static b=1 m=1", Strategy::Static(Knobs::ONE)),
        ("DNNScaler", Strategy::DnnScaler(ScalerConfig::default())),
        ("Clipper AIMD", Strategy::Aimd { decrease: 0.9 }),
    ]
}

struct Setup {
    name: &'static str,
    table: ProfileTable,
    origin: String,
    world: World,
}

/// Share of the requests offered after the warm-up that completed within the SLO.
fn attainment(
    s: &Setup,
    span: (f64, f64),
    model: &str,
    slo: Slo,
    rate: f64,
    strategy: Strategy,
    seed: u64,
) -> Result<f64, Box<dyn std::error::Error>> {
    let w = Workload {
        tenants: vec![TenantSpec {
            tenant: model.into(),
            model: model.into(),
            slo,
            // As the agent benchmark's tenant; one replica, so only the knobs differ.
            bounds: Bounds {
                max_batch: 32,
                max_instances: 8,
                min_replicas: 1,
                max_replicas: 1,
                ..Bounds::default()
            },
            arrivals: Arrivals::Poisson { rate },
            slo_changes: Vec::new(),
        }],
        duration_s: span.0 + span.1,
        warmup_s: span.0,
    };
    let mut cfg = SimConfig {
        seed,
        ..SimConfig::default()
    };
    cfg.pool.max_agents = 1;
    let r = simulate(&w, &s.table, &s.origin, &s.world, strategy, &cfg)?;
    let t = &r.tenants[0];
    Ok(if t.arrived == 0 {
        1.0
    } else {
        t.met as f64 / t.arrived as f64
    })
}

/// Bisection over the offered rate in (0, `hi`]: the highest rate found held.
fn max_load(
    s: &Setup,
    span: (f64, f64),
    model: &str,
    slo: Slo,
    hi: f64,
    strategy: Strategy,
    seed: u64,
) -> Result<f64, Box<dyn std::error::Error>> {
    let (mut lo, mut hi) = (0.0, hi);
    for _ in 0..12 {
        let mid = (lo + hi) / 2.0;
        if attainment(s, span, model, slo, mid, strategy, seed)? >= TARGET {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seed: u64 = arg("--seed").and_then(|v| v.parse().ok()).unwrap_or(1);
    let slo_factor: f64 = arg("--slo-factor")
        .and_then(|v| v.parse().ok())
        .unwrap_or(5.0);
    // Warm-up and measured seconds per trial: as the real agent's benchmark by default.
    let span = (
        arg("--warmup").and_then(|v| v.parse().ok()).unwrap_or(10.0),
        arg("--measure")
            .and_then(|v| v.parse().ok())
            .unwrap_or(20.0),
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cpu_profile = root.join("data/cpu-profile.json");
    let gpu = root.join("profiles/gpu-synthetic.json");
    let gpu_table = ProfileTable::load(&gpu)?;
    let setups = [
        Setup {
            name: "simulator, CPU (measured truth)",
            table: ProfileTable::load(&cpu_profile)?,
            origin: cpu_profile.display().to_string(),
            world: World {
                service: ServiceTimes::load(&root.join("data/cpu-service-times.json"))?,
                interference: Interference::none(),
            },
        },
        Setup {
            name: "simulator, GPU (SYNTHETIC)",
            world: World::from_profile_table(&gpu_table),
            table: gpu_table,
            origin: gpu.display().to_string(),
        },
    ];
    let mut json = Vec::new();
    println!(
        "Highest Poisson load (requests/s) held at >= {:.0}% SLO attainment over the offered requests; \
         one replica on one device; SLO = {slo_factor} x batch-1 p50; {} s measured after {} s of warm-up per trial; \
         12 bisection steps; seed {seed}.\n",
        TARGET * 100.0,
        span.1,
        span.0
    );
    println!(
        "| device | model | SLO ms | static b=1 m=1 | DNNScaler | Clipper AIMD | DNNScaler / static | DNNScaler / AIMD |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for s in &setups {
        for m in &s.world.service.models {
            if s.table.get(&m.model, &s.origin).is_err() {
                continue;
            }
            let p50 = m.dist(Knobs::ONE).quantile(0.5);
            let slo = Slo::p99((slo_factor * p50 * 10.0).round() / 10.0);
            // Twice the best throughput anywhere on the truth's grid bounds the search.
            let hi = 2.0
                * m.points
                    .iter()
                    .map(|p| f64::from(p.batch * p.instances) * 1e3 / p.mean_ms)
                    .fold(0.0, f64::max);
            let mut loads = Vec::new();
            for (label, strategy) in policies() {
                let l = max_load(s, span, &m.model, slo, hi, strategy, seed)?;
                json.push(format!(
                    "{{\"device\": {:?}, \"model\": {:?}, \"slo_ms\": {}, \"policy\": {label:?}, \"max_load\": {l:.2}}}",
                    s.name, m.model, slo.latency_ms
                ));
                loads.push(l);
            }
            let ratio = |a: f64, b: f64| {
                if b > 0.0 {
                    format!("{:.2}", a / b)
                } else {
                    "-".into()
                }
            };
            println!(
                "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} |",
                s.name,
                m.model,
                slo.latency_ms,
                loads[0],
                loads[1],
                loads[2],
                ratio(loads[1], loads[0]),
                ratio(loads[1], loads[2])
            );
        }
    }
    if let Some(path) = arg("--json") {
        std::fs::write(&path, format!("[\n{}\n]\n", json.join(",\n")))?;
        println!("\nwrote {path}");
    }
    Ok(())
}
