//! The event loop: requests arrive per tenant, wait in a replica's queue, are served in batches of
//! up to the current batch size by up to `instances` concurrent instances, and complete. Every
//! `tick_s` the same decision loop as the operator's runs: knob controller per tenant, replica
//! count, placement, pool sizing; new agents and replicas become ready after a delay.
//!
//! Each tenant keeps a window of arrivals and completions cut at the last knob change, as the
//! agents do, and the controller steps on it under the same [`Evidence`](crate::Evidence) rule
//! as on the agents' reports. The window is one tick long here, where the agents keep 30 s: a
//! known difference (a 30 s window lags on/off load in replica decisions and repeats asks for
//! replicas on one violation, which this simulator does not model yet).
//!
//! Service time of a batch: a draw from the [`World`]'s measured distribution at (batch taken,
//! instances busy) ([`ServiceTimes`]), not from the [`LatencyModel`] the scaler predicts with;
//! times the [`Interference`] factor of the other tenants on the same agent when it starts.
//! The scaler, the replica rule and placement still see only the profile table.

use super::interference::Interference;
use super::report::{SimReport, TenantReport};
use super::rng::Rng;
use super::service::{Dist, ServiceModel, ServiceTimes};
use super::workload::{Arrivals, Workload};
use crate::demand::{Demand, demand};
use crate::dnnscaler::{Epoch, LatencyModel};
use crate::knob_policy::{Controller, Strategy};
use crate::knobs::{Bounds, Knobs};
use crate::placement::{AgentCapacity, CurrentReplica, place};
use crate::pool::{PoolAgent, PoolConfig, size_pool};
use crate::profile::{ProfileError, ProfileTable};
use crate::replicas::ReplicaConfig;
use crate::round::{Measured, RoundConfig, STEP_INTERVAL_S, TenantRound};
use crate::slo::{Slo, TenantObservation};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// The simulator's ground truth: how long batches take and how co-located tenants interfere.
#[derive(Clone, Debug, PartialEq)]
pub struct World {
    pub service: ServiceTimes,
    pub interference: Interference,
}

impl World {
    /// Service times from the profile table's own points, no interference: for a table (like
    /// the synthetic GPU one) with nothing measured apart from it.
    pub fn from_profile_table(table: &ProfileTable) -> World {
        World {
            service: ServiceTimes::from_profile_table(table),
            interference: Interference::none(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimConfig {
    pub tick_s: f64,
    pub replica_start_s: f64,
    pub agent_start_s: f64,
    pub agent_memory_bytes: u64,
    pub pool: PoolConfig,
    pub replicas: ReplicaConfig,
    /// Seconds between two knob steps of one tenant, as in the operator.
    pub step_interval_s: f64,
    pub seed: u64,
    /// A request waiting longer than this many SLOs is dropped (and counts as a miss).
    pub drop_after_slos: f64,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        let agent_memory_bytes = 16 << 30;
        SimConfig {
            tick_s: 2.0,
            replica_start_s: 5.0,
            agent_start_s: 30.0,
            agent_memory_bytes,
            pool: PoolConfig {
                min_agents: 1,
                max_agents: 1000,
                scale_down_delay_s: 60.0,
                agent_memory_bytes,
                agent_compute: 1.0,
            },
            replicas: ReplicaConfig::default(),
            step_interval_s: STEP_INTERVAL_S,
            seed: 1,
            drop_after_slos: 10.0,
        }
    }
}

enum Ev {
    Arrival {
        tenant: usize,
        generation: u64,
    },
    PhaseFlip {
        tenant: usize,
    },
    Done {
        tenant: usize,
        replica: u64,
        arrived: Vec<f64>,
        /// The batch's compute time.
        service_ms: f64,
    },
    ReplicaReady {
        tenant: usize,
        replica: u64,
    },
    AgentReady {
        agent: usize,
    },
    SloChange {
        tenant: usize,
        slo: Slo,
    },
    Tick,
}

struct Item {
    t: f64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, o: &Item) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Item) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    // Reversed: BinaryHeap pops the largest, the simulation wants the earliest.
    fn cmp(&self, o: &Item) -> Ordering {
        o.t.total_cmp(&self.t).then_with(|| o.seq.cmp(&self.seq))
    }
}

struct Replica {
    id: u64,
    agent: usize,
    ready: bool,
    queue: VecDeque<f64>,
    busy: u32,
    memory_bytes: u64,
}

struct Tenant {
    name: String,
    model_name: String,
    /// What batches really take (the world's measurements).
    truth: ServiceModel,
    dists: HashMap<Knobs, Dist>,
    slo: Slo,
    bounds: Bounds,
    arrivals: Arrivals,
    on: bool,
    generation: u64,
    /// The policy's round: knob controller, the model it predicts with, the replica rule.
    round: TenantRound,
    /// What the last round asked of the pool.
    demand: Demand,
    replicas: Vec<Replica>,
    /// Requests with no ready replica to go to.
    waiting: VecDeque<f64>,
    /// When the knobs last changed: the window reaches back no further.
    epoch_start: f64,
    /// Arrival times in the window.
    w_arrivals: VecDeque<f64>,
    /// The window's completed requests: when each finished, its latency, and its batch's
    /// compute time (no queueing), in ms.
    w_done: VecDeque<[f64; 3]>,
    arrived: u64,
    completed: u64,
    met: u64,
    dropped: u64,
    latencies: Vec<f32>,
}

impl Tenant {
    fn rate(&self) -> f64 {
        match self.arrivals {
            Arrivals::Poisson { rate } => rate,
            Arrivals::OnOff {
                rate_on, rate_off, ..
            } => {
                if self.on {
                    rate_on
                } else {
                    rate_off
                }
            }
        }
    }

    fn queued(&self) -> usize {
        self.waiting.len() + self.replicas.iter().map(|r| r.queue.len()).sum::<usize>()
    }
}

struct Agent {
    name: String,
    ready: bool,
    draining: bool,
    alive: bool,
    idle_since: Option<f64>,
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    interference: &'a Interference,
    /// Per agent, the tenants with a replica there.
    hosted: Vec<Vec<usize>>,
    warmup_s: f64,
    now: f64,
    seq: u64,
    next_replica: u64,
    heap: BinaryHeap<Item>,
    /// Service-time noise.
    rng: Rng,
    /// One stream per tenant for its arrivals and phases, so every policy sees the same requests.
    arrival_rng: Vec<Rng>,
    tenants: Vec<Tenant>,
    agents: Vec<Agent>,
    agent_seconds: f64,
    peak_agents: u32,
    agents_over_time: Vec<(f64, u32)>,
}

/// Runs `workload` with `strategy` choosing knobs; the policies see the profiles of `table`
/// (`origin` names it in errors), batches take what `world` says.
pub fn simulate(
    workload: &Workload,
    table: &ProfileTable,
    origin: &str,
    world: &World,
    strategy: Strategy,
    cfg: &SimConfig,
) -> Result<SimReport, ProfileError> {
    let mut tenants = Vec::with_capacity(workload.tenants.len());
    for spec in &workload.tenants {
        let profile = table.get(&spec.model, origin)?;
        let model = LatencyModel::from_profile(profile);
        let truth = world
            .service
            .get(&spec.model)
            .ok_or_else(|| ProfileError::UnknownModel {
                path: world.service.source.clone(),
                model: spec.model.clone(),
            })?
            .clone();
        tenants.push(Tenant {
            truth,
            dists: HashMap::new(),
            name: spec.tenant.clone(),
            model_name: spec.model.clone(),
            demand: demand(&model, Knobs::ONE, 0.0, 0),
            round: TenantRound::new(
                Controller::new(strategy, profile, &spec.slo, &spec.bounds),
                model,
                spec.bounds.sane().min_replicas,
            ),
            slo: spec.slo,
            bounds: spec.bounds,
            arrivals: spec.arrivals,
            on: true,
            generation: 0,
            replicas: Vec::new(),
            waiting: VecDeque::new(),
            epoch_start: 0.0,
            w_arrivals: VecDeque::new(),
            w_done: VecDeque::new(),
            arrived: 0,
            completed: 0,
            met: 0,
            dropped: 0,
            latencies: Vec::new(),
        });
    }
    let mut sim = Sim {
        cfg,
        interference: &world.interference,
        hosted: Vec::new(),
        warmup_s: workload.warmup_s,
        now: 0.0,
        seq: 0,
        next_replica: 0,
        heap: BinaryHeap::new(),
        rng: Rng::new(cfg.seed),
        arrival_rng: (0..workload.tenants.len() as u64)
            .map(|i| Rng::new(cfg.seed.wrapping_mul(1_000_003).wrapping_add(i + 1)))
            .collect(),
        tenants,
        agents: Vec::new(),
        agent_seconds: 0.0,
        peak_agents: 0,
        agents_over_time: Vec::new(),
    };
    for (i, spec) in workload.tenants.iter().enumerate() {
        sim.schedule_arrival(i);
        if let Arrivals::OnOff { mean_on_s, .. } = spec.arrivals {
            let d = sim.arrival_rng[i].exp(mean_on_s);
            sim.push(d, Ev::PhaseFlip { tenant: i });
        }
        for &(t, slo) in &spec.slo_changes {
            sim.push(t, Ev::SloChange { tenant: i, slo });
        }
    }
    // Warm start: the pool and the replicas the first decisions ask for are there at time zero.
    for _ in 0..3 {
        sim.tick(true);
    }
    sim.push(cfg.tick_s, Ev::Tick);
    while let Some(item) = sim.heap.pop() {
        if item.t > workload.duration_s {
            break;
        }
        sim.now = item.t;
        sim.handle(item.ev);
    }
    Ok(sim.report(strategy, workload.duration_s))
}

impl Sim<'_> {
    fn push(&mut self, at: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Item {
            t: at,
            seq: self.seq,
            ev,
        });
    }

    fn schedule_arrival(&mut self, tenant: usize) {
        let rate = self.tenants[tenant].rate();
        if rate > 0.0 {
            let at = self.now + self.arrival_rng[tenant].exp(1.0 / rate);
            let generation = self.tenants[tenant].generation;
            self.push(at, Ev::Arrival { tenant, generation });
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrival { tenant, generation } => {
                if generation != self.tenants[tenant].generation {
                    return;
                }
                let t = &mut self.tenants[tenant];
                t.w_arrivals.push_back(self.now);
                if self.now >= self.warmup_s {
                    t.arrived += 1;
                }
                let now = self.now;
                self.route(tenant, now);
                self.schedule_arrival(tenant);
            }
            Ev::PhaseFlip { tenant } => {
                let t = &mut self.tenants[tenant];
                t.on = !t.on;
                t.generation += 1;
                if let Arrivals::OnOff {
                    mean_on_s,
                    mean_off_s,
                    ..
                } = t.arrivals
                {
                    let mean = if t.on { mean_on_s } else { mean_off_s };
                    let at = self.now + self.arrival_rng[tenant].exp(mean);
                    self.push(at, Ev::PhaseFlip { tenant });
                }
                self.schedule_arrival(tenant);
            }
            Ev::Done {
                tenant,
                replica,
                arrived,
                service_ms,
            } => {
                let now = self.now;
                let t = &mut self.tenants[tenant];
                for a in arrived {
                    let lat = (now - a) * 1e3;
                    t.w_done.push_back([now, lat, service_ms]);
                    if a >= self.warmup_s {
                        t.completed += 1;
                        t.met += u64::from(lat <= t.slo.latency_ms);
                        t.latencies.push(lat as f32);
                    }
                }
                if let Some(r) = t.replicas.iter().position(|r| r.id == replica) {
                    t.replicas[r].busy = t.replicas[r].busy.saturating_sub(1);
                    self.dispatch(tenant, r);
                }
            }
            Ev::ReplicaReady { tenant, replica } => {
                let t = &mut self.tenants[tenant];
                if let Some(r) = t.replicas.iter_mut().find(|r| r.id == replica) {
                    r.ready = true;
                    let waiting: Vec<f64> = t.waiting.drain(..).collect();
                    for a in waiting {
                        self.route(tenant, a);
                    }
                }
            }
            Ev::AgentReady { agent } => self.agents[agent].ready = true,
            Ev::SloChange { tenant, slo } => self.tenants[tenant].slo = slo,
            Ev::Tick => {
                self.tick(false);
                let at = self.now + self.cfg.tick_s;
                self.push(at, Ev::Tick);
            }
        }
    }

    /// Sends a request (arrived at `arrived`) to the ready replica with the least work queued.
    fn route(&mut self, tenant: usize, arrived: f64) {
        let t = &mut self.tenants[tenant];
        let best = t
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.ready)
            .min_by_key(|(_, r)| r.queue.len() + r.busy as usize)
            .map(|(i, _)| i);
        match best {
            Some(r) => {
                t.replicas[r].queue.push_back(arrived);
                self.dispatch(tenant, r);
            }
            None => t.waiting.push_back(arrived),
        }
    }

    /// Starts batches on idle instances of replica `r` while requests wait.
    fn dispatch(&mut self, tenant: usize, r: usize) {
        let now = self.now;
        let warmup = self.warmup_s;
        let t = &mut self.tenants[tenant];
        let knobs = t.round.controller.knobs();
        let max_wait = t.slo.latency_ms * self.cfg.drop_after_slos / 1e3;
        let rep = &mut t.replicas[r];
        while let Some(&a) = rep.queue.front()
            && now - a > max_wait
        {
            rep.queue.pop_front();
            if a >= warmup {
                t.dropped += 1;
            }
        }
        loop {
            let rep = &self.tenants[tenant].replicas[r];
            if !(rep.ready && rep.busy < knobs.instances && !rep.queue.is_empty()) {
                break;
            }
            let slowdown = self.slowdown(tenant, rep.agent);
            let t = &mut self.tenants[tenant];
            let rep = &mut t.replicas[r];
            let n = (knobs.batch as usize).min(rep.queue.len());
            let arrived: Vec<f64> = rep.queue.drain(..n).collect();
            rep.busy += 1;
            let k = Knobs::new(n as u32, rep.busy);
            let id = rep.id;
            let truth = &t.truth;
            let dist = t.dists.entry(k).or_insert_with(|| truth.dist(k));
            let service_ms = dist.draw(&mut self.rng) * slowdown;
            self.seq += 1;
            self.heap.push(Item {
                t: now + service_ms / 1e3,
                seq: self.seq,
                ev: Ev::Done {
                    tenant,
                    replica: id,
                    arrived,
                    service_ms,
                },
            });
        }
    }

    /// How much the other tenants on `agent` slow a batch of `tenant` that starts now.
    fn slowdown(&self, tenant: usize, agent: usize) -> f64 {
        let Some(hosted) = self.hosted.get(agent) else {
            return 1.0;
        };
        let others = hosted.iter().filter(|&&j| j != tenant).map(|&j| {
            let o = &self.tenants[j];
            let busy = o
                .replicas
                .iter()
                .filter(|r| r.agent == agent)
                .map(|r| r.busy)
                .sum::<u32>();
            (o.model_name.as_str(), busy)
        });
        self.interference
            .factor(&self.tenants[tenant].model_name, others)
    }

    /// The operator's decision loop, once.
    fn tick(&mut self, instant: bool) {
        let now = self.now;
        let tick_s = self.cfg.tick_s;
        // 1. Each tenant's round: knobs, replicas and what it asks of the pool.
        let round_cfg = RoundConfig {
            step_interval_s: self.cfg.step_interval_s,
            replicas: self.cfg.replicas,
        };
        for t in &mut self.tenants {
            let start = t.epoch_start.max(now - tick_s);
            while t.w_arrivals.front().is_some_and(|&a| a < start) {
                t.w_arrivals.pop_front();
            }
            while t.w_done.front().is_some_and(|d| d[0] < start) {
                t.w_done.pop_front();
            }
            // As the agents do: a rate over at least a millisecond.
            let span = (now - start).max(1e-3);
            let mut lat: Vec<f64> = t.w_done.iter().map(|d| d[1]).collect();
            let mut compute: Vec<f64> = t.w_done.iter().map(|d| d[2]).collect();
            let completed = lat.len() as u64;
            let p = t.slo.percentile;
            let knobs = t.round.controller.knobs();
            let arrival_rate = t.w_arrivals.len() as f64 / span;
            // One replica's share, as the operator divides its replicas' reports.
            let n = t.replicas.iter().filter(|r| r.ready).count().max(1) as f64;
            let measured = if instant {
                Measured {
                    per_replica: None,
                    arrival_rate: t.arrivals.mean_rate(),
                }
            } else {
                Measured {
                    per_replica: Some(TenantObservation {
                        arrival_rate: arrival_rate / n,
                        throughput: completed as f64 / span / n,
                        latency_at_percentile_ms: percentile(&mut lat, p).unwrap_or(f64::NAN),
                        queue_depth: t.queued().min(u32::MAX as usize) as u32,
                        completed,
                        compute_at_percentile_ms: percentile(&mut compute, p),
                        epoch: Some(Epoch {
                            knobs,
                            seconds: now - t.epoch_start,
                        }),
                    }),
                    arrival_rate,
                }
            };
            let o = t.round.round(&measured, &t.slo, &t.bounds, &round_cfg, now);
            if o.knobs != knobs {
                // A new epoch: what the old knobs measured is no evidence about the new ones.
                t.epoch_start = now;
                t.w_arrivals.clear();
                t.w_done.clear();
            }
            t.demand = o.demand;
        }
        // 2. Placement.
        let live: Vec<usize> = (0..self.agents.len())
            .filter(|&a| self.agents[a].alive && self.agents[a].ready)
            .collect();
        let capacity: Vec<AgentCapacity> = live
            .iter()
            .map(|&a| AgentCapacity {
                agent: self.agents[a].name.clone(),
                memory_bytes: self.cfg.agent_memory_bytes,
                compute: self.cfg.pool.agent_compute,
                schedulable: !self.agents[a].draining,
            })
            .collect();
        let mut demands = Vec::with_capacity(self.tenants.len());
        let mut current = Vec::new();
        for t in &self.tenants {
            demands.push(t.demand.for_tenant(t.name.clone()));
            for r in &t.replicas {
                current.push(CurrentReplica {
                    tenant: t.name.clone(),
                    agent: self.agents[r.agent].name.clone(),
                    ready: r.ready,
                    memory_bytes: r.memory_bytes,
                });
            }
        }
        let plan = place(&capacity, &demands, &current);
        let agent_ix: HashMap<String, usize> = self
            .agents
            .iter()
            .enumerate()
            .filter(|(_, a)| a.alive)
            .map(|(i, a)| (a.name.clone(), i))
            .collect();
        let tenant_ix: HashMap<String, usize> = self
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let mut requeue: Vec<(usize, f64)> = Vec::new();
        for p in &plan.stop {
            let (Some(&t), Some(&a)) = (
                tenant_ix.get(p.tenant.as_str()),
                agent_ix.get(p.agent.as_str()),
            ) else {
                continue;
            };
            let tenant = &mut self.tenants[t];
            if let Some(i) = tenant.replicas.iter().position(|r| r.agent == a) {
                let r = tenant.replicas.swap_remove(i);
                requeue.extend(r.queue.into_iter().map(|x| (t, x)));
            }
        }
        for p in &plan.keep {
            let (Some(&t), Some(&a)) = (
                tenant_ix.get(p.tenant.as_str()),
                agent_ix.get(p.agent.as_str()),
            ) else {
                continue;
            };
            let tenant = &mut self.tenants[t];
            let mem = tenant.demand.memory_bytes;
            if let Some(r) = tenant.replicas.iter_mut().find(|r| r.agent == a) {
                // The agent applies the new knobs before the next round.
                r.memory_bytes = mem;
            }
        }
        let mut started = Vec::new();
        for p in &plan.start {
            let (Some(&t), Some(&a)) = (
                tenant_ix.get(p.tenant.as_str()),
                agent_ix.get(p.agent.as_str()),
            ) else {
                continue;
            };
            self.next_replica += 1;
            let tenant = &mut self.tenants[t];
            tenant.replicas.push(Replica {
                id: self.next_replica,
                agent: a,
                ready: false,
                queue: VecDeque::new(),
                busy: 0,
                memory_bytes: tenant.demand.memory_bytes,
            });
            started.push((t, self.next_replica));
        }
        let delay = if instant {
            0.0
        } else {
            self.cfg.replica_start_s
        };
        for (tenant, replica) in started {
            if instant {
                self.handle(Ev::ReplicaReady { tenant, replica });
            } else {
                self.push(now + delay, Ev::ReplicaReady { tenant, replica });
            }
        }
        for (t, a) in requeue {
            self.route(t, a);
        }
        // 3. Pool.
        let mut hosted = vec![0u32; self.agents.len()];
        self.hosted = vec![Vec::new(); self.agents.len()];
        for (i, t) in self.tenants.iter().enumerate() {
            for r in &t.replicas {
                hosted[r.agent] += 1;
                if self.hosted[r.agent].last() != Some(&i) {
                    self.hosted[r.agent].push(i);
                }
            }
        }
        let mut pool = Vec::new();
        for (i, a) in self.agents.iter_mut().enumerate().filter(|(_, a)| a.alive) {
            a.idle_since = match (hosted[i], a.idle_since) {
                (0, None) => Some(now),
                (0, s) => s,
                _ => None,
            };
            pool.push(PoolAgent {
                agent: a.name.clone(),
                ready: a.ready,
                draining: a.draining,
                replacing: false,
                replicas: hosted[i],
                idle_since: a.idle_since,
            });
        }
        let d = size_pool(&pool, &plan.unplaced, &self.cfg.pool, now);
        let by_name: HashMap<String, usize> = self
            .agents
            .iter()
            .enumerate()
            .filter(|(_, a)| a.alive)
            .map(|(i, a)| (a.name.clone(), i))
            .collect();
        for n in &d.undrain {
            if let Some(&i) = by_name.get(n) {
                self.agents[i].draining = false;
            }
        }
        for n in &d.drain {
            if let Some(&i) = by_name.get(n) {
                self.agents[i].draining = true;
            }
        }
        for n in &d.remove {
            if let Some(&i) = by_name.get(n) {
                self.agents[i].alive = false;
            }
        }
        for _ in 0..d.add {
            let i = self.agents.len();
            self.agents.push(Agent {
                name: format!("agent-{i}"),
                ready: instant,
                draining: false,
                alive: true,
                idle_since: None,
            });
            if !instant {
                self.push(now + self.cfg.agent_start_s, Ev::AgentReady { agent: i });
            }
        }
        // Pending agents are not billed: their pod waits for a node that does not exist yet.
        let billed = self.agents.iter().filter(|a| a.alive && a.ready).count() as u32;
        if !instant {
            self.agent_seconds += billed as f64 * tick_s;
            self.peak_agents = self.peak_agents.max(billed);
            self.agents_over_time.push((now, billed));
        }
    }

    fn report(self, strategy: Strategy, duration_s: f64) -> SimReport {
        let measured_s = (duration_s - self.warmup_s).max(1e-9);
        let tenants = self
            .tenants
            .into_iter()
            .map(|mut t| {
                t.latencies.sort_by(f32::total_cmp);
                let p99 = if t.latencies.is_empty() {
                    f64::NAN
                } else {
                    t.latencies[((t.latencies.len() - 1) as f64 * 0.99).round() as usize] as f64
                };
                let knobs = t.round.controller.knobs();
                TenantReport {
                    tenant: t.name,
                    model: t.model_name,
                    approach: t.round.controller.approach(),
                    final_knobs: knobs,
                    final_replicas: t.round.replicas.replicas,
                    arrived: t.arrived,
                    completed: t.completed,
                    met: t.met,
                    dropped: t.dropped,
                    throughput: t.completed as f64 / measured_s,
                    p99_ms: p99,
                }
            })
            .collect();
        SimReport {
            strategy: strategy.name(),
            tenants,
            agent_seconds: self.agent_seconds,
            mean_agents: self.agent_seconds / duration_s,
            peak_agents: self.peak_agents,
            agents_over_time: self.agents_over_time,
        }
    }
}

/// The value at percentile `p` (0..=100) of `v`, nearest rank; `None` when empty.
fn percentile(v: &mut [f64], p: f64) -> Option<f64> {
    let last = v.len().checked_sub(1)?;
    let i = (last as f64 * p.clamp(0.0, 100.0) / 100.0).round() as usize;
    Some(*v.select_nth_unstable_by(i, f64::total_cmp).1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dnnscaler::ScalerConfig;
    use crate::sim::workload::TenantSpec;

    fn table() -> ProfileTable {
        let text = include_str!("../../profiles/gpu-synthetic.json");
        ProfileTable::parse(text, "gpu-synthetic.json").unwrap()
    }

    fn world() -> World {
        World::from_profile_table(&table())
    }

    fn one_tenant(model: &str, slo_ms: f64, arrivals: Arrivals) -> Workload {
        Workload {
            tenants: vec![TenantSpec {
                tenant: "t".into(),
                model: model.into(),
                slo: Slo::p99(slo_ms),
                bounds: Bounds {
                    max_batch: 32,
                    max_replicas: 64,
                    ..Bounds::default()
                },
                arrivals,
                slo_changes: vec![(150.0, Slo::p99(slo_ms * 0.6))],
            }],
            duration_s: 300.0,
            warmup_s: 60.0,
        }
    }

    #[test]
    fn same_seed_same_result() {
        let w = one_tenant("resnet50", 28.0, Arrivals::Poisson { rate: 400.0 });
        let cfg = SimConfig::default();
        let a = simulate(
            &w,
            &table(),
            "t",
            &world(),
            Strategy::DnnScaler(ScalerConfig::default()),
            &cfg,
        )
        .unwrap();
        let b = simulate(
            &w,
            &table(),
            "t",
            &world(),
            Strategy::DnnScaler(ScalerConfig::default()),
            &cfg,
        )
        .unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn dnnscaler_batches_a_big_net_and_meets_its_slo() {
        let w = one_tenant("resnet50", 28.0, Arrivals::Poisson { rate: 400.0 });
        let r = simulate(
            &w,
            &table(),
            "t",
            &world(),
            Strategy::DnnScaler(ScalerConfig::default()),
            &SimConfig::default(),
        )
        .unwrap();
        let t = &r.tenants[0];
        assert_eq!(t.approach, "Batching");
        assert!(t.final_knobs.batch > 1, "{t:?}");
        assert!(t.slo_attainment() > 0.97, "{t:?}");
        assert!((t.throughput - 400.0).abs() < 20.0, "{t:?}");
        assert!(r.mean_agents >= 1.0);
    }

    #[test]
    fn unknown_model_is_a_typed_error() {
        let w = one_tenant("nope", 28.0, Arrivals::Poisson { rate: 1.0 });
        let err = simulate(
            &w,
            &table(),
            "gpu-synthetic.json",
            &world(),
            Strategy::DnnScaler(ScalerConfig::default()),
            &SimConfig::default(),
        );
        assert!(matches!(err, Err(ProfileError::UnknownModel { .. })));
    }

    #[test]
    fn bursty_arrivals_scale_replicas_and_agents() {
        let bursty = Arrivals::OnOff {
            rate_on: 1500.0,
            rate_off: 50.0,
            mean_on_s: 30.0,
            mean_off_s: 30.0,
        };
        let w = one_tenant("vgg16", 41.0, bursty);
        let r = simulate(
            &w,
            &table(),
            "t",
            &world(),
            Strategy::Static(Knobs::ONE),
            &SimConfig::default(),
        )
        .unwrap();
        let most = r.agents_over_time.iter().map(|x| x.1).max().unwrap_or(0);
        let least = r.agents_over_time.iter().map(|x| x.1).min().unwrap_or(0);
        assert!(most > least, "{:?}", r.agents_over_time);
        let aimd = Strategy::Aimd { decrease: 0.9 };
        let other = simulate(&w, &table(), "t", &world(), aimd, &SimConfig::default()).unwrap();
        assert_eq!(
            r.tenants[0].arrived, other.tenants[0].arrived,
            "every policy sees the same requests"
        );
    }

    /// One tenant at static knobs, one agent, and a world whose batches take `slow` times what
    /// the profile says, with two tenants interfering by `pair`.
    fn run_world(slow: f64, pair: f64, tenants: usize, rate: f64) -> SimReport {
        let table = table();
        let mut world = world();
        for m in &mut world.service.models {
            for p in &mut m.points {
                p.mean_ms *= slow;
                p.p99_ms *= slow;
            }
        }
        world.interference.default_pair = pair;
        let mut w = one_tenant("squeezenet", 20.0, Arrivals::Poisson { rate });
        w.tenants[0].slo_changes.clear();
        w.tenants[0].bounds.max_replicas = 1;
        let spec = w.tenants[0].clone();
        for i in 1..tenants {
            w.tenants.push(TenantSpec {
                tenant: format!("t{i}"),
                ..spec.clone()
            });
        }
        let mut cfg = SimConfig::default();
        cfg.pool.max_agents = 1;
        simulate(&w, &table, "t", &world, Strategy::Static(Knobs::ONE), &cfg).unwrap()
    }

    #[test]
    fn service_times_come_from_the_world_not_the_profile() {
        // squeezenet at (1,1) serves 500/s in the synthetic profile: 300/s fits.
        let fits = run_world(1.0, 1.0, 1, 300.0);
        assert!(
            fits.tenants[0].slo_attainment() > 0.99,
            "{:?}",
            fits.tenants[0]
        );
        // A world 2x slower than the profile cannot serve it, whatever the scaler's model says.
        let slow = run_world(2.0, 1.0, 1, 300.0);
        assert!(
            slow.tenants[0].slo_attainment() < 0.9,
            "{:?}",
            slow.tenants[0]
        );
    }

    #[test]
    fn co_located_tenants_interfere() {
        let apart = run_world(1.0, 1.0, 2, 150.0);
        let together = run_world(1.0, 2.0, 2, 150.0);
        assert!(
            together.tenants[0].p99_ms > apart.tenants[0].p99_ms * 1.2,
            "{} vs {}",
            together.tenants[0].p99_ms,
            apart.tenants[0].p99_ms
        );
    }
}
