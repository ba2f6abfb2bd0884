//! Benchmarks of the policy crate, printed as markdown tables:
//! 1. one decision loop (DNNScaler step for every tenant, replicas, placement, pool sizing) over
//!    10,000 tenants and 1,000 agents: time per phase and peak RSS;
//! 2. DNNScaler vs static knobs vs Clipper-style AIMD batching in the cluster simulator, on the
//!    same workload (Poisson and on/off arrivals, SLO tightened mid-run), for each profile table.
//!
//! `cargo run --release -p cotenant-policy --example simulate [-- --quick] [--seed N]`

use cotenant_policy::dnnscaler::{LatencyModel, ScalerConfig, ScalerState, choose_approach, step};
use cotenant_policy::placement::{AgentCapacity, CurrentReplica, ReplicaDemand, place};
use cotenant_policy::pool::{PoolAgent, PoolConfig, size_pool};
use cotenant_policy::replicas::{ReplicaConfig, ReplicaInput, ReplicaState};
use cotenant_policy::sim::{
    Arrivals, Interference, Rng, ServiceTimes, SimConfig, SimReport, TenantSpec, Workload, World,
    simulate,
};
use cotenant_policy::{
    Bounds, Epoch, Knobs, ProfileTable, Slo, Strategy, TenantObservation, demand,
};
use std::path::Path;
use std::time::Instant;

fn peak_rss_mib() -> f64 {
    // VmHWM is the resident-set high-water mark in kB (Linux only; 0 elsewhere).
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// An SLO for `model`: `factor` times its batch-1 p99, so every model has room to batch.
fn slo_for(table: &ProfileTable, model: &str, factor: f64) -> Slo {
    let p99 = table
        .models
        .iter()
        .find(|m| m.model == model)
        .and_then(|m| m.point(Knobs::ONE))
        .map_or(100.0, |p| p.p99_ms);
    Slo::p99((p99 * factor).round().max(1.0))
}

fn decision_loop(table: &ProfileTable, tenants: usize, agents: usize) {
    let mut rng = Rng::new(42);
    let bounds = Bounds {
        max_batch: 32,
        max_replicas: 64,
        ..Bounds::default()
    };
    let models: Vec<LatencyModel> = table
        .models
        .iter()
        .map(LatencyModel::from_profile)
        .collect();
    let started = Instant::now();
    let mut states: Vec<(usize, Slo, ScalerState, ReplicaState, f64)> = (0..tenants)
        .map(|i| {
            let m = i % table.models.len();
            let slo = slo_for(table, &table.models[m].model, 4.0);
            let c = choose_approach(&table.models[m], &slo, &bounds);
            let rate = 5.0 + rng.unit() * 60.0;
            (
                m,
                slo,
                ScalerState::new(c.approach, c.knobs, ScalerConfig::default()),
                ReplicaState::new(1),
                rate,
            )
        })
        .collect();
    let setup_ms = ms(started);
    let capacity: Vec<AgentCapacity> = (0..agents)
        .map(|a| AgentCapacity {
            agent: format!("agent-{a}"),
            memory_bytes: 16 << 30,
            compute: 1.0,
            schedulable: true,
        })
        .collect();
    let pool_cfg = PoolConfig {
        min_agents: 1,
        max_agents: 2 * agents as u32,
        scale_down_delay_s: 300.0,
        agent_memory_bytes: 16 << 30,
        agent_compute: 1.0,
    };
    let mut current: Vec<CurrentReplica> = Vec::new();
    let mut rows = Vec::new();
    for round in 0..3 {
        let now = round as f64 * 2.0;
        let t0 = Instant::now();
        let mut wants = Vec::with_capacity(tenants);
        for (m, slo, s, _, rate) in &mut states {
            let lat = slo.latency_ms * (0.5 + rng.unit() * 0.7);
            let obs = TenantObservation {
                arrival_rate: *rate,
                throughput: *rate,
                latency_at_percentile_ms: lat,
                queue_depth: 0,
                completed: 100,
                compute_at_percentile_ms: None,
                epoch: Some(Epoch {
                    knobs: s.knobs,
                    seconds: 60.0,
                }),
            };
            wants.push(step(s, &obs, slo, &bounds, &models[*m]));
        }
        let scaler_ms = ms(t0);
        let t1 = Instant::now();
        let cfg = ReplicaConfig::default();
        let demands: Vec<ReplicaDemand> = states
            .iter_mut()
            .zip(&wants)
            .enumerate()
            .map(|(i, ((m, _, s, r, rate), want))| {
                let model = &models[*m];
                let input = ReplicaInput {
                    arrival_rate: *rate,
                    per_replica_throughput: model.throughput(s.knobs),
                    scaler_wants_more: *want == cotenant_policy::Decision::NeedReplicas,
                };
                let replicas = r.decide(&input, &bounds, &cfg, now);
                demand(model, s.knobs, *rate, replicas).for_tenant(format!("tenant-{i}"))
            })
            .collect();
        let replicas_ms = ms(t1);
        let t2 = Instant::now();
        let plan = place(&capacity, &demands, &current);
        let place_ms = ms(t2);
        let t3 = Instant::now();
        let mut hosted = std::collections::HashMap::<&str, u32>::new();
        for p in plan
            .keep
            .iter()
            .chain(&plan.start)
            .chain(&plan.hold_until_replaced)
        {
            *hosted.entry(p.agent.as_str()).or_default() += 1;
        }
        let pool: Vec<PoolAgent> = capacity
            .iter()
            .map(|a| {
                let n = hosted.get(a.agent.as_str()).copied().unwrap_or(0);
                PoolAgent {
                    agent: a.agent.clone(),
                    ready: true,
                    draining: false,
                    replacing: false,
                    replicas: n,
                    idle_since: (n == 0).then_some(0.0),
                }
            })
            .collect();
        let d = size_pool(&pool, &plan.unplaced, &pool_cfg, now);
        let pool_ms = ms(t3);
        let replicas: usize = demands.iter().map(|d| d.replicas as usize).sum();
        rows.push(format!(
            "| {round} | {replicas} | {} | {} | {} | {} | {scaler_ms:.1} | {replicas_ms:.1} | {place_ms:.1} | {pool_ms:.1} | {:.1} |",
            plan.keep.len(),
            plan.start.len(),
            plan.unplaced.iter().map(|u| u.replicas).sum::<u32>(),
            d.add,
            scaler_ms + replicas_ms + place_ms + pool_ms
        ));
        // Next round starts from this one's result, every replica ready: the steady state.
        let memory: std::collections::HashMap<&str, u64> = demands
            .iter()
            .map(|d| (d.tenant.as_str(), d.memory_bytes))
            .collect();
        current = plan
            .keep
            .iter()
            .chain(&plan.start)
            .chain(&plan.hold_until_replaced)
            .map(|p| CurrentReplica {
                tenant: p.tenant.clone(),
                agent: p.agent.clone(),
                ready: true,
                memory_bytes: memory.get(p.tenant.as_str()).copied().unwrap_or(0),
            })
            .collect();
    }
    println!("### One decision loop: {tenants} tenants, {agents} agents\n");
    println!(
        "Setup (profiler rule for every tenant): {setup_ms:.1} ms. Round 0 places everything from an empty cluster; rounds 1–2 start from the previous round's placement with new observations.\n"
    );
    println!(
        "| round | replicas wanted | kept | started | unplaced | agents to add | scaler ms | replicas ms | placement ms | pool ms | total ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!(
        "\nPeak RSS of the process so far: {:.1} MiB\n",
        peak_rss_mib()
    );
}

fn workload(
    table: &ProfileTable,
    tenants: usize,
    rate_scale: f64,
    duration_s: f64,
    seed: u64,
) -> Workload {
    let mut rng = Rng::new(seed.wrapping_add(6));
    let bounds = Bounds {
        max_batch: 32,
        max_instances: 8,
        min_replicas: 1,
        max_replicas: 64,
        ..Bounds::default()
    };
    let specs = (0..tenants)
        .map(|i| {
            let model = table.models[i % table.models.len()].model.clone();
            let base = table.models[i % table.models.len()]
                .point(Knobs::ONE)
                .map_or(1.0, |p| p.throughput);
            let slo = slo_for(table, &model, 4.0);
            // Between 0.5 and 3 times what one replica at (1,1) serves.
            let rate = base * rate_scale * (0.5 + 2.5 * rng.unit());
            let arrivals = if i % 2 == 0 {
                Arrivals::Poisson { rate }
            } else {
                Arrivals::OnOff {
                    rate_on: 1.8 * rate,
                    rate_off: 0.2 * rate,
                    mean_on_s: 20.0,
                    mean_off_s: 20.0,
                }
            };
            TenantSpec {
                tenant: format!("{model}-{i}"),
                model,
                slo,
                bounds,
                arrivals,
                // Half of the tenants get an SLO 40% tighter halfway through.
                slo_changes: if i % 4 < 2 {
                    vec![(
                        duration_s / 2.0,
                        Slo::p99((slo.latency_ms * 0.6).round().max(1.0)),
                    )]
                } else {
                    Vec::new()
                },
            }
        })
        .collect();
    Workload {
        tenants: specs,
        duration_s,
        warmup_s: 60.0,
    }
}

fn compare(
    path: &Path,
    world: &World,
    tenants: usize,
    rate_scale: f64,
    duration_s: f64,
    seed: u64,
) -> Result<(), cotenant_policy::ProfileError> {
    let table = ProfileTable::load(path)?;
    let origin = path.display().to_string();
    let w = workload(&table, tenants, rate_scale, duration_s, seed);
    let cfg = SimConfig {
        seed,
        ..SimConfig::default()
    };
    let strategies = [
        Strategy::DnnScaler(ScalerConfig::default()),
        Strategy::Static(Knobs::ONE),
        Strategy::Static(Knobs::new(8, 1)),
        Strategy::Aimd { decrease: 0.9 },
        // Sensitivity: how much of the SLO one batch may take, the rest left for queueing.
        Strategy::DnnScaler(ScalerConfig {
            service_share: 0.6,
            ..ScalerConfig::default()
        }),
        Strategy::DnnScaler(ScalerConfig {
            service_share: 1.0,
            ..ScalerConfig::default()
        }),
    ];
    println!(
        "### Policies compared on `{}`, {}\n",
        path.file_name()
            .map_or(origin.clone(), |f| f.to_string_lossy().into()),
        if world.interference == Interference::none() {
            "no interference"
        } else if world.interference.synthetic {
            "SYNTHETIC interference"
        } else {
            "measured interference"
        }
    );
    println!(
        "Profile source (what the policies see): {}; device: {}.\n\nService times (what batches take): {}.\n\nInterference: {}\n",
        table.source, table.device, world.service.source, world.interference.source
    );
    println!(
        "{tenants} tenants over {} models, {duration_s} s simulated ({} s warm-up not measured), decisions every {} s; \
         half Poisson, half on/off (1.8x / 0.2x the mean rate, 20 s phases); SLO = 4x the batch-1 p99, tightened to 0.6x \
         at {} s for half of the tenants. Same replica (20% headroom), placement and pool rules for all.\n",
        table.models.len(),
        w.warmup_s,
        cfg.tick_s,
        duration_s / 2.0
    );
    println!(
        "| policy | GPUs (agents) mean | peak | throughput req/s | req/s per GPU | SLO attainment | worst tenant attainment | sim wall s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut reports: Vec<SimReport> = Vec::new();
    for s in strategies {
        let t = Instant::now();
        let r = simulate(&w, &table, &origin, world, s, &cfg)?;
        let worst = r
            .tenants
            .iter()
            .map(|t| t.slo_attainment())
            .fold(1.0, f64::min);
        println!(
            "| {} | {:.2} | {} | {:.1} | {:.1} | {:.2}% | {:.2}% | {:.1} |",
            r.strategy,
            r.mean_agents,
            r.peak_agents,
            r.throughput(),
            r.throughput_per_agent(),
            100.0 * r.slo_attainment(),
            100.0 * worst,
            t.elapsed().as_secs_f64()
        );
        reports.push(r);
    }
    if let Some(d) = reports.first() {
        println!(
            "\nDNNScaler per model (approach chosen by the profiler rule, knobs at the end):\n"
        );
        println!(
            "| model | approach | final knobs (b, m) | replicas | throughput req/s | p99 ms | SLO attainment |"
        );
        println!("|---|---|---|---|---|---|---|");
        for t in d.tenants.iter().take(table.models.len() * 2) {
            println!(
                "| {} | {} | ({}, {}) | {} | {:.1} | {:.1} | {:.2}% |",
                t.tenant,
                t.approach,
                t.final_knobs.batch,
                t.final_knobs.instances,
                t.final_replicas,
                t.throughput,
                t.p99_ms,
                100.0 * t.slo_attainment()
            );
        }
    }
    println!();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--seed N` draws another workload (rates, arrivals, service noise).
    let seed = args
        .iter()
        .position(|a| a == "--seed")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let gpu = root.join("profiles/gpu-synthetic.json");
    let table = ProfileTable::load(&gpu)?;
    // The synthetic GPU table is its own truth, with synthetic interference.
    let gpu_world = World {
        service: ServiceTimes::from_profile_table(&table),
        interference: Interference::load(&root.join("data/gpu-interference-synthetic.json"))?,
    };
    if quick {
        decision_loop(&table, 1000, 100);
        compare(&gpu, &gpu_world, 8, 1.0, 200.0, seed)?;
    } else {
        decision_loop(&table, 10_000, 1000);
        // Each device without interference and with it, to show what co-location costs.
        let alone = World {
            interference: Interference::none(),
            ..gpu_world.clone()
        };
        compare(&gpu, &alone, 40, 1.0, 600.0, seed)?;
        compare(&gpu, &gpu_world, 40, 1.0, 600.0, seed)?;
        // The CPU: policies see a short profile, batches take a separate, longer measurement,
        // co-located tenants slow each other by the measured factors.
        let cpu_world = World {
            service: ServiceTimes::load(&root.join("data/cpu-service-times.json"))?,
            interference: Interference::load(&root.join("data/cpu-interference.json"))?,
        };
        let cpu = root.join("data/cpu-profile.json");
        let alone = World {
            interference: Interference::none(),
            ..cpu_world.clone()
        };
        compare(&cpu, &alone, 12, 1.0, 600.0, seed)?;
        compare(&cpu, &cpu_world, 12, 1.0, 600.0, seed)?;
    }
    println!("Peak RSS at the end: {:.1} MiB", peak_rss_mib());
    Ok(())
}
