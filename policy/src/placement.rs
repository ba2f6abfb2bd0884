//! Placement: which agent runs each replica of each tenant.
//!
//! Replicas are bin-packed by device memory (weights plus peak activations at the tenant's
//! knobs, a hard limit) and predicted load (the device share from the profile, a limit for new
//! replicas only, so a load forecast that rises does not reshuffle running replicas). Replicas of
//! one tenant go to different agents. Placement is stable: a running replica stays where it is
//! while it still fits, and only the missing replicas are placed (best fit, largest first).
//! A replica that must move is replaced before it goes: while the tenant has no other ready
//! replica it is held running (`hold_until_replaced`) and stops only in a later round, once its
//! replacement reports ready.
//!
//! Invariant: when no agent is over its memory on input, none is after the plan, counting
//! everything that keeps running (kept replicas at the larger of old and new footprint, held ones
//! at their current footprint, new ones at the new footprint).

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentCapacity {
    pub agent: String,
    pub memory_bytes: u64,
    /// Device share available, 1.0 for one GPU.
    pub compute: f64,
    /// False while the agent drains: it keeps what it runs but takes nothing new.
    pub schedulable: bool,
}

/// What one tenant wants: `replicas` replicas, each needing `memory_bytes` and `load`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaDemand {
    pub tenant: String,
    pub replicas: u32,
    pub memory_bytes: u64,
    pub load: f64,
}

/// A replica running (or starting) now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurrentReplica {
    pub tenant: String,
    pub agent: String,
    pub ready: bool,
    /// Footprint at the knobs it runs with now.
    pub memory_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Placement {
    pub tenant: String,
    pub agent: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Unplaced {
    pub tenant: String,
    pub replicas: u32,
    pub memory_bytes: u64,
    pub load: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PlacementPlan {
    /// Running replicas that stay (with the tenant's new knobs).
    pub keep: Vec<Placement>,
    /// Replicas to start.
    pub start: Vec<Placement>,
    /// Replicas that must go but stay running, with the knobs they run now (their footprint is
    /// counted as it is), until a replacement is ready.
    pub hold_until_replaced: Vec<Placement>,
    /// Replicas to stop now.
    pub stop: Vec<Placement>,
    /// Replicas that fit on no agent: the pool needs more agents.
    pub unplaced: Vec<Unplaced>,
}

struct AgentUse {
    memory: u64,
    load: f64,
    tenants: Vec<usize>,
}

/// Plans placement for every tenant in `demands` given what runs now, with no limit on the
/// number of replicas per agent. Replicas of tenants with no demand are stopped, as are replicas
/// on agents that no longer exist (they are gone anyway).
pub fn place(
    agents: &[AgentCapacity],
    demands: &[ReplicaDemand],
    current: &[CurrentReplica],
) -> PlacementPlan {
    place_at_most(agents, demands, current, usize::MAX)
}

/// [`place`] with at most `slots` replicas on any agent: one agent's list of assignments is
/// bounded (the API refuses a longer one), whatever memory says, and a model whose size is not
/// known yet must not pile onto the first agent.
pub fn place_at_most(
    agents: &[AgentCapacity],
    demands: &[ReplicaDemand],
    current: &[CurrentReplica],
    slots: usize,
) -> PlacementPlan {
    let agent_ix: HashMap<&str, usize> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| (a.agent.as_str(), i))
        .collect();
    let tenant_ix: HashMap<&str, usize> = demands
        .iter()
        .enumerate()
        .map(|(i, d)| (d.tenant.as_str(), i))
        .collect();
    let mut used: Vec<AgentUse> = agents
        .iter()
        .map(|_| AgentUse {
            memory: 0,
            load: 0.0,
            tenants: Vec::new(),
        })
        .collect();
    let mut plan = PlacementPlan::default();
    let here = |r: &CurrentReplica| Placement {
        tenant: r.tenant.clone(),
        agent: r.agent.clone(),
    };
    // Everything running occupies its agent now; per tenant, ready replicas first so the ones
    // kept are the ones serving.
    let mut by_tenant: Vec<Vec<&CurrentReplica>> = vec![Vec::new(); demands.len()];
    for r in current {
        let Some(&a) = agent_ix.get(r.agent.as_str()) else {
            plan.stop.push(here(r));
            continue;
        };
        used[a].memory = used[a].memory.saturating_add(r.memory_bytes);
        match tenant_ix.get(r.tenant.as_str()) {
            Some(&t) => by_tenant[t].push(r),
            None => {
                used[a].memory = used[a].memory.saturating_sub(r.memory_bytes);
                plan.stop.push(here(r));
            }
        }
    }
    // Replicas per agent now: a tenant that scales down keeps its replicas on the busiest
    // agents, so that the emptiest ones drain and the pool can shrink.
    let mut on_agent: HashMap<&str, usize> = HashMap::new();
    for r in current {
        *on_agent.entry(r.agent.as_str()).or_default() += 1;
    }
    let mut kept = vec![0u32; demands.len()];
    for (t, replicas) in by_tenant.iter_mut().enumerate() {
        let d = &demands[t];
        replicas.sort_by(|x, y| {
            y.ready
                .cmp(&x.ready)
                .then_with(|| on_agent[y.agent.as_str()].cmp(&on_agent[x.agent.as_str()]))
                .then_with(|| x.agent.cmp(&y.agent))
        });
        let mut kept_ready = false;
        let mut displaced: Vec<&CurrentReplica> = Vec::new();
        for r in replicas.iter() {
            let Some(&a) = agent_ix.get(r.agent.as_str()) else {
                continue;
            };
            let u = &mut used[a];
            let grow = d.memory_bytes.saturating_sub(r.memory_bytes);
            let fits = agents[a].schedulable
                && !u.tenants.contains(&t)
                && u.tenants.len() < slots
                && u.memory.saturating_add(grow) <= agents[a].memory_bytes;
            if fits && kept[t] < d.replicas {
                u.memory = u.memory.saturating_add(grow);
                u.load += d.load;
                u.tenants.push(t);
                kept[t] += 1;
                kept_ready |= r.ready;
                plan.keep.push(here(r));
            } else if fits {
                // More replicas than wanted: scale down.
                u.memory = u.memory.saturating_sub(r.memory_bytes);
                plan.stop.push(here(r));
            } else {
                displaced.push(r);
            }
        }
        for r in displaced {
            let Some(&a) = agent_ix.get(r.agent.as_str()) else {
                continue;
            };
            if r.ready && !kept_ready && d.replicas > 0 {
                // The tenant's only ready replica: keep serving until the replacement is ready.
                kept_ready = true;
                used[a].tenants.push(t);
                plan.hold_until_replaced.push(here(r));
            } else {
                used[a].memory = used[a].memory.saturating_sub(r.memory_bytes);
                plan.stop.push(here(r));
            }
        }
    }
    // The missing replicas, largest first, each on the agent it fills best.
    let mut order: Vec<usize> = (0..demands.len())
        .filter(|&t| demands[t].replicas > kept[t])
        .collect();
    order.sort_by(|&x, &y| {
        let (dx, dy) = (&demands[x], &demands[y]);
        dy.memory_bytes
            .cmp(&dx.memory_bytes)
            .then_with(|| dx.tenant.cmp(&dy.tenant))
    });
    for t in order {
        let d = &demands[t];
        let mut missing = d.replicas - kept[t];
        while missing > 0 {
            let best = agents
                .iter()
                .enumerate()
                .filter(|(a, cap)| {
                    let u = &used[*a];
                    cap.schedulable
                        && !u.tenants.contains(&t)
                        && u.tenants.len() < slots
                        && u.memory.saturating_add(d.memory_bytes) <= cap.memory_bytes
                        && u.load + d.load <= cap.compute + 1e-9
                })
                .min_by_key(|(a, cap)| {
                    (
                        cap.memory_bytes
                            .saturating_sub(used[*a].memory)
                            .saturating_sub(d.memory_bytes),
                        *a,
                    )
                })
                .map(|(a, _)| a);
            let Some(a) = best else { break };
            let u = &mut used[a];
            u.memory = u.memory.saturating_add(d.memory_bytes);
            u.load += d.load;
            u.tenants.push(t);
            plan.start.push(Placement {
                tenant: d.tenant.clone(),
                agent: agents[a].agent.clone(),
            });
            missing -= 1;
        }
        if missing > 0 {
            plan.unplaced.push(Unplaced {
                tenant: d.tenant.clone(),
                replicas: missing,
                memory_bytes: d.memory_bytes,
                load: d.load,
            });
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn agent(name: &str, memory_bytes: u64) -> AgentCapacity {
        AgentCapacity {
            agent: name.into(),
            memory_bytes,
            compute: 1.0,
            schedulable: true,
        }
    }

    fn demand(tenant: &str, replicas: u32, memory_bytes: u64) -> ReplicaDemand {
        ReplicaDemand {
            tenant: tenant.into(),
            replicas,
            memory_bytes,
            load: 0.1,
        }
    }

    fn running(tenant: &str, agent: &str, memory_bytes: u64) -> CurrentReplica {
        CurrentReplica {
            tenant: tenant.into(),
            agent: agent.into(),
            ready: true,
            memory_bytes,
        }
    }

    fn at(tenant: &str, agent: &str) -> Placement {
        Placement {
            tenant: tenant.into(),
            agent: agent.into(),
        }
    }

    #[test]
    fn spreads_replicas_of_a_tenant_and_reports_what_does_not_fit() {
        let plan = place(&[agent("a", 10), agent("b", 10)], &[demand("t", 3, 4)], &[]);
        assert_eq!(plan.start.len(), 2);
        assert_ne!(plan.start[0].agent, plan.start[1].agent);
        assert_eq!(plan.unplaced[0].replicas, 1);
    }

    #[test]
    fn best_fit_packs_and_keeps_running_replicas_in_place() {
        let agents = [agent("a", 10), agent("b", 10)];
        let current = [running("x", "b", 6)];
        let plan = place(&agents, &[demand("x", 1, 6), demand("y", 1, 4)], &current);
        assert_eq!(plan.keep, vec![at("x", "b")]);
        // y fills b exactly rather than opening a.
        assert_eq!(plan.start, vec![at("y", "b")]);
    }

    /// A tenant that scales down keeps the replica that shares its agent, whatever the names,
    /// so the agent it alone held empties and the pool can shrink.
    #[test]
    fn scaling_down_keeps_replicas_on_the_busiest_agents() {
        let agents = [agent("a", 10), agent("b", 10)];
        let current = [
            running("x", "a", 2),
            running("x", "b", 2),
            running("y", "b", 2),
        ];
        let plan = place(&agents, &[demand("x", 1, 2), demand("y", 1, 2)], &current);
        assert_eq!(plan.stop, vec![at("x", "a")]);
        assert!(plan.keep.contains(&at("x", "b")) && plan.keep.contains(&at("y", "b")));
    }

    #[test]
    fn a_move_places_the_new_replica_before_removing_the_old() {
        let mut agents = [agent("a", 10), agent("b", 10)];
        agents[0].schedulable = false; // a drains
        let plan = place(&agents, &[demand("x", 1, 6)], &[running("x", "a", 6)]);
        assert_eq!(plan.hold_until_replaced, vec![at("x", "a")]);
        assert_eq!(plan.start, vec![at("x", "b")]);
        assert!(plan.stop.is_empty());
        // Next round the replacement is ready: the old one stops.
        let current = [running("x", "a", 6), running("x", "b", 6)];
        let plan = place(&agents, &[demand("x", 1, 6)], &current);
        assert_eq!(plan.keep, vec![at("x", "b")]);
        assert_eq!(plan.stop, vec![at("x", "a")]);
    }

    #[test]
    fn no_agent_takes_more_replicas_than_its_slots() {
        let agents = [agent("a", 100), agent("b", 100)];
        let demands: Vec<ReplicaDemand> = (0..5).map(|i| demand(&format!("t{i}"), 1, 0)).collect();
        let plan = place_at_most(&agents, &demands, &[], 2);
        let on = |a: &str| plan.start.iter().filter(|p| p.agent == a).count();
        assert_eq!((on("a"), on("b")), (2, 2));
        assert_eq!(plan.unplaced.len(), 1);
        // Running replicas beyond the slots move (held until replaced) rather than stay.
        let current: Vec<CurrentReplica> =
            (0..3).map(|i| running(&format!("t{i}"), "a", 0)).collect();
        let plan = place_at_most(&agents, &demands[..3], &current, 2);
        assert_eq!(plan.keep.iter().filter(|p| p.agent == "a").count(), 2);
        assert_eq!(plan.hold_until_replaced.len() + plan.stop.len(), 1);
    }

    #[test]
    fn bigger_knobs_that_no_longer_fit_move_and_scale_down_stops_extras() {
        let agents = [agent("a", 10), agent("b", 10)];
        let current = [running("x", "a", 4), running("y", "a", 5)];
        let plan = place(&agents, &[demand("x", 1, 8), demand("y", 1, 5)], &current);
        assert_eq!(plan.keep, vec![at("y", "a")]);
        assert_eq!(plan.hold_until_replaced, vec![at("x", "a")]);
        assert_eq!(plan.start, vec![at("x", "b")]);
        let plan = place(
            &agents,
            &[demand("x", 1, 4)],
            &[running("x", "a", 4), running("x", "b", 4)],
        );
        assert_eq!((plan.keep.len(), plan.stop.len()), (1, 1));
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    fn agents(n: usize, mem: &[u64]) -> Vec<AgentCapacity> {
        (0..n)
            .map(|i| AgentCapacity {
                agent: format!("a{i}"),
                memory_bytes: mem[i % mem.len()],
                compute: 1.0,
                schedulable: true,
            })
            .collect()
    }

    fn demands(spec: &[(u32, u64, f64)]) -> Vec<ReplicaDemand> {
        spec.iter()
            .enumerate()
            .map(|(i, &(replicas, memory_bytes, load))| ReplicaDemand {
                tenant: format!("t{i}"),
                replicas,
                memory_bytes,
                load,
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// From any state an earlier plan produced, with new demands (other knobs, other
        /// counts) and agents draining or gone: no agent goes over its memory, no tenant loses
        /// its last ready replica, replicas of a tenant stay apart, and every wanted replica is
        /// kept, started or reported unplaced.
        #[test]
        fn plans_keep_the_invariants(
            mem in prop::collection::vec(5u64..40, 1..4),
            n_agents in 1usize..8,
            before in prop::collection::vec((0u32..4, 1u64..12, 0.0f64..0.5), 1..10),
            after in prop::collection::vec((0u32..4, 1u64..12, 0.0f64..0.5), 1..10),
            ready_bits in any::<u64>(),
            drain_bits in any::<u8>(),
            gone_bits in any::<u8>(),
        ) {
            let all = agents(n_agents, &mem);
            let first = demands(&before);
            let plan0 = place(&all, &first, &[]);
            let mem0: HashMap<&str, u64> = first.iter().map(|d| (d.tenant.as_str(), d.memory_bytes)).collect();
            let current: Vec<CurrentReplica> = plan0
                .start
                .iter()
                .enumerate()
                .map(|(i, p)| CurrentReplica {
                    tenant: p.tenant.clone(),
                    agent: p.agent.clone(),
                    ready: ready_bits >> (i % 64) & 1 == 1,
                    memory_bytes: mem0[p.tenant.as_str()],
                })
                .collect();
            let mut now_agents: Vec<AgentCapacity> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| gone_bits >> i & 1 == 0)
                .map(|(i, a)| AgentCapacity { schedulable: drain_bits >> i & 1 == 0, ..a.clone() })
                .collect();
            now_agents.sort_by(|a, b| a.agent.cmp(&b.agent));
            let second = demands(&after);
            let plan = place(&now_agents, &second, &current);

            let want: HashMap<&str, &ReplicaDemand> = second.iter().map(|d| (d.tenant.as_str(), d)).collect();
            let cur_mem: HashMap<(&str, &str), u64> = current.iter().map(|r| ((r.tenant.as_str(), r.agent.as_str()), r.memory_bytes)).collect();
            // Memory.
            for a in &now_agents {
                let mut used = 0u64;
                for p in plan.keep.iter().filter(|p| p.agent == a.agent) {
                    used += cur_mem[&(p.tenant.as_str(), p.agent.as_str())].max(want[p.tenant.as_str()].memory_bytes);
                }
                for p in plan.hold_until_replaced.iter().filter(|p| p.agent == a.agent) {
                    used += cur_mem[&(p.tenant.as_str(), p.agent.as_str())];
                }
                for p in plan.start.iter().filter(|p| p.agent == a.agent) {
                    used += want[p.tenant.as_str()].memory_bytes;
                }
                prop_assert!(used <= a.memory_bytes, "agent {} uses {used} of {}", a.agent, a.memory_bytes);
            }
            // A ready replica survives for every tenant that had one on a live agent.
            let live: HashSet<&str> = now_agents.iter().map(|a| a.agent.as_str()).collect();
            let stopped: HashSet<(&str, &str)> = plan.stop.iter().map(|p| (p.tenant.as_str(), p.agent.as_str())).collect();
            for d in second.iter().filter(|d| d.replicas > 0) {
                let had = current.iter().any(|r| r.tenant == d.tenant && r.ready && live.contains(r.agent.as_str()));
                let has = current.iter().any(|r| {
                    r.tenant == d.tenant && r.ready && live.contains(r.agent.as_str())
                        && !stopped.contains(&(r.tenant.as_str(), r.agent.as_str()))
                });
                prop_assert!(!had || has, "tenant {} lost its last ready replica", d.tenant);
            }
            // Apart, and accounted for.
            let mut seen = HashSet::new();
            for p in plan.keep.iter().chain(&plan.start) {
                prop_assert!(seen.insert((p.tenant.clone(), p.agent.clone())), "two replicas of {} on {}", p.tenant, p.agent);
            }
            for d in &second {
                let placed = plan.keep.iter().chain(&plan.start).filter(|p| p.tenant == d.tenant).count() as u32;
                let unplaced: u32 = plan.unplaced.iter().filter(|u| u.tenant == d.tenant).map(|u| u.replicas).sum();
                prop_assert_eq!(placed + unplaced, d.replicas);
            }
        }

        /// Over many rounds — knobs (footprints) and counts changing, agents starting to drain,
        /// each plan applied at once and started replicas ready only by the next round — every
        /// tenant that ever had a ready replica has one at every moment, and no agent is ever
        /// over its memory.
        #[test]
        fn moves_never_leave_a_tenant_without_a_ready_replica(
            mem in prop::collection::vec(8u64..40, 1..4),
            n_agents in 2usize..8,
            rounds in prop::collection::vec(
                (prop::collection::vec((1u32..4, 1u64..10), 4), any::<u8>()),
                1..8,
            ),
        ) {
            let mut agents = agents(n_agents, &mem);
            let mut current: Vec<CurrentReplica> = Vec::new();
            let mut served: HashSet<String> = HashSet::new();
            for (spec, drain_bits) in rounds {
                // Replicas started last round are ready now; agents may start draining.
                for r in &mut current {
                    r.ready = true;
                }
                for (i, a) in agents.iter_mut().enumerate() {
                    a.schedulable &= drain_bits >> i & 1 == 0;
                }
                let spec: Vec<(u32, u64, f64)> = spec.into_iter().map(|(n, m)| (n, m, 0.1)).collect();
                let want = demands(&spec);
                let plan = place(&agents, &want, &current);
                let stopped: HashSet<(String, String)> =
                    plan.stop.iter().map(|p| (p.tenant.clone(), p.agent.clone())).collect();
                current.retain(|r| !stopped.contains(&(r.tenant.clone(), r.agent.clone())));
                let footprint: HashMap<&str, u64> =
                    want.iter().map(|d| (d.tenant.as_str(), d.memory_bytes)).collect();
                for r in &mut current {
                    let kept = plan.keep.iter().any(|p| p.tenant == r.tenant && p.agent == r.agent);
                    if kept {
                        r.memory_bytes = r.memory_bytes.max(footprint[r.tenant.as_str()]);
                    }
                }
                for p in &plan.start {
                    current.push(CurrentReplica {
                        tenant: p.tenant.clone(),
                        agent: p.agent.clone(),
                        ready: false,
                        memory_bytes: footprint[p.tenant.as_str()],
                    });
                }
                for t in &served {
                    prop_assert!(
                        current.iter().any(|r| &r.tenant == t && r.ready),
                        "tenant {t} has no ready replica: {current:?}"
                    );
                }
                for a in &agents {
                    let used: u64 = current.iter().filter(|r| r.agent == a.agent).map(|r| r.memory_bytes).sum();
                    prop_assert!(used <= a.memory_bytes, "agent {} at {used} of {}", a.agent, a.memory_bytes);
                }
                // Between rounds the agents apply the new knobs, except to replicas held until
                // replaced: those keep serving with what they run.
                for r in &mut current {
                    let held = plan.hold_until_replaced.iter().any(|p| p.tenant == r.tenant && p.agent == r.agent);
                    if !held {
                        r.memory_bytes = footprint[r.tenant.as_str()];
                    }
                }
                served.extend(current.iter().filter(|r| r.ready).map(|r| r.tenant.clone()));
            }
        }
    }
}
