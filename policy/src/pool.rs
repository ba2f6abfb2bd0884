//! Pool sizing: how many agents (GPU pods) a pool runs. Replicas that fit nowhere ask for more
//! agents (up to `max_agents`); agents idle for longer than the scale-down delay are drained and,
//! once empty, removed, in two phases so nothing new lands on an agent about to go. The pool
//! never goes below `min_agents`. Draining agents are taken back before new ones are asked for.

use crate::placement::Unplaced;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolConfig {
    pub min_agents: u32,
    pub max_agents: u32,
    pub scale_down_delay_s: f64,
    /// What one new agent offers, to count how many the unplaced replicas need.
    pub agent_memory_bytes: u64,
    pub agent_compute: f64,
}

/// One agent of the pool as the operator sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolAgent {
    pub agent: String,
    /// False while its pod is still pending (e.g. waiting for a node).
    pub ready: bool,
    pub draining: bool,
    /// Runs an outdated pod template and is being replaced: it drains, it is never undrained,
    /// it is removed once empty even at the pool's minimum, and it does not count against
    /// `max_agents`, so its replacement can start first.
    pub replacing: bool,
    /// Replicas it runs or holds.
    pub replicas: u32,
    /// Since when it has run no replica; `None` while it runs some.
    pub idle_since: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolDecision {
    /// New agents to create.
    pub add: u32,
    /// Agents to stop draining because demand came back.
    pub undrain: Vec<String>,
    /// Agents to mark draining (phase one).
    pub drain: Vec<String>,
    /// Drained, empty agents to delete (phase two).
    pub remove: Vec<String>,
    /// Tenants whose replica is larger than a whole new agent: more agents will not help.
    pub too_big: Vec<String>,
}

/// Empty agents the unplaced replicas need, packed first-fit decreasing with one replica of a
/// tenant per agent; replicas too big for any agent are returned apart.
pub fn agents_needed(unplaced: &[Unplaced], cfg: &PoolConfig) -> (u32, Vec<String>) {
    let mut items: Vec<&Unplaced> = Vec::new();
    let mut too_big = Vec::new();
    for u in unplaced {
        if u.memory_bytes > cfg.agent_memory_bytes || u.load > cfg.agent_compute + 1e-9 {
            too_big.push(u.tenant.clone());
        } else {
            items.push(u);
        }
    }
    items.sort_by(|a, b| {
        b.memory_bytes
            .cmp(&a.memory_bytes)
            .then_with(|| a.tenant.cmp(&b.tenant))
    });
    // (memory used, load used, tenants) per new agent.
    let mut bins: Vec<(u64, f64, Vec<usize>)> = Vec::new();
    for (t, u) in items.iter().enumerate() {
        let mut left = u.replicas;
        for bin in bins.iter_mut() {
            if left == 0 {
                break;
            }
            if bin.0.saturating_add(u.memory_bytes) <= cfg.agent_memory_bytes
                && bin.1 + u.load <= cfg.agent_compute + 1e-9
                && !bin.2.contains(&t)
            {
                bin.0 = bin.0.saturating_add(u.memory_bytes);
                bin.1 += u.load;
                bin.2.push(t);
                left -= 1;
            }
        }
        for _ in 0..left {
            bins.push((u.memory_bytes, u.load, vec![t]));
        }
    }
    (bins.len().min(u32::MAX as usize) as u32, too_big)
}

pub fn size_pool(
    agents: &[PoolAgent],
    unplaced: &[Unplaced],
    cfg: &PoolConfig,
    now_s: f64,
) -> PoolDecision {
    let min = cfg.min_agents;
    let max = cfg.max_agents.max(min);
    let (mut need, too_big) = agents_needed(unplaced, cfg);
    let mut d = PoolDecision {
        too_big,
        ..PoolDecision::default()
    };
    // Agents being replaced leave once empty; their replacements may start meanwhile.
    let total = agents.iter().filter(|a| !a.replacing).count() as u32;
    if need > 0 {
        for a in agents.iter().filter(|a| a.draining && !a.replacing) {
            if need == 0 {
                break;
            }
            d.undrain.push(a.agent.clone());
            need -= 1;
        }
        let pending = agents.iter().filter(|a| !a.ready && !a.replacing).count() as u32;
        d.add = need.saturating_sub(pending).min(max.saturating_sub(total));
    }
    d.add = d.add.max(min.saturating_sub(total));
    d.remove.extend(
        agents
            .iter()
            .filter(|a| a.replacing && a.replicas == 0)
            .map(|a| a.agent.clone()),
    );
    if need > 0 || !unplaced.is_empty() && d.too_big.len() < unplaced.len() {
        return d;
    }
    // Phase two first: drained agents that emptied go, as long as the pool keeps its minimum.
    let mut remaining = total;
    for a in agents
        .iter()
        .filter(|a| a.draining && !a.replacing && a.replicas == 0)
    {
        if remaining <= min {
            break;
        }
        d.remove.push(a.agent.clone());
        remaining -= 1;
    }
    // Phase one: idle long enough, oldest idle first.
    let mut idle: Vec<(&PoolAgent, f64)> = agents
        .iter()
        .filter(|a| a.ready && !a.draining && a.replicas == 0)
        .filter_map(|a| a.idle_since.map(|s| (a, s)))
        .filter(|(_, s)| now_s - s >= cfg.scale_down_delay_s)
        .collect();
    idle.sort_by(|x, y| x.1.total_cmp(&y.1).then_with(|| x.0.agent.cmp(&y.0.agent)));
    let mut staying = agents.iter().filter(|a| !a.draining).count() as u32;
    for (a, _) in idle {
        if staying <= min {
            break;
        }
        d.drain.push(a.agent.clone());
        staying -= 1;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> PoolConfig {
        PoolConfig {
            min_agents: 1,
            max_agents: 4,
            scale_down_delay_s: 300.0,
            agent_memory_bytes: 10,
            agent_compute: 1.0,
        }
    }

    fn agent(name: &str, replicas: u32, idle_since: Option<f64>) -> PoolAgent {
        PoolAgent {
            agent: name.into(),
            ready: true,
            draining: false,
            replacing: false,
            replicas,
            idle_since,
        }
    }

    #[test]
    fn an_agent_being_replaced_is_never_undrained_and_goes_once_empty_even_at_the_minimum() {
        let cfg = PoolConfig {
            min_agents: 1,
            max_agents: 1,
            ..cfg()
        };
        let old = PoolAgent {
            draining: true,
            replacing: true,
            ..agent("old", 1, None)
        };
        // Its replica needs a place: the replacement starts beside it, past maxAgents.
        let d = size_pool(
            std::slice::from_ref(&old),
            &[unplaced("x", 1, 5)],
            &cfg,
            0.0,
        );
        assert_eq!((d.add, d.undrain.len(), d.remove.len()), (1, 0, 0));
        // Empty: it goes, though the pool is at its minimum; the new agent keeps the minimum.
        let empty = PoolAgent { replicas: 0, ..old };
        let d = size_pool(&[empty, agent("new", 1, None)], &[], &cfg, 10.0);
        assert_eq!(d.remove, vec!["old".to_string()]);
        assert_eq!(d.add, 0);
    }

    fn unplaced(tenant: &str, replicas: u32, memory_bytes: u64) -> Unplaced {
        Unplaced {
            tenant: tenant.into(),
            replicas,
            memory_bytes,
            load: 0.1,
        }
    }

    #[test]
    fn unplaced_replicas_ask_for_agents_up_to_the_maximum() {
        // Two replicas of one tenant need two agents even though they would fit in one.
        let (n, _) = agents_needed(&[unplaced("t", 2, 3), unplaced("u", 1, 4)], &cfg());
        assert_eq!(n, 2);
        let d = size_pool(&[agent("a", 1, None)], &[unplaced("t", 9, 3)], &cfg(), 0.0);
        assert_eq!(d.add, 3);
        let d = size_pool(&[], &[unplaced("big", 1, 11)], &cfg(), 0.0);
        assert_eq!(
            (d.add, d.too_big.clone()),
            (1, vec!["big".to_string()]),
            "min_agents still holds"
        );
    }

    #[test]
    fn pending_and_draining_agents_count_before_new_ones() {
        let mut pending = agent("p", 0, None);
        pending.ready = false;
        let mut draining = agent("d", 0, Some(0.0));
        draining.draining = true;
        let d = size_pool(&[pending, draining], &[unplaced("t", 3, 3)], &cfg(), 0.0);
        assert_eq!((d.add, d.undrain.clone()), (1, vec!["d".to_string()]));
    }

    #[test]
    fn idle_agents_drain_after_the_delay_then_go_never_below_min() {
        let agents = [agent("a", 0, Some(0.0)), agent("b", 0, Some(100.0))];
        assert!(size_pool(&agents, &[], &cfg(), 200.0).drain.is_empty());
        let d = size_pool(&agents, &[], &cfg(), 1000.0);
        assert_eq!(d.drain, vec!["a".to_string()], "b stays: min_agents is 1");
        let mut drained = agents.clone();
        drained[0].draining = true;
        let d = size_pool(&drained, &[], &cfg(), 1000.0);
        assert_eq!(d.remove, vec!["a".to_string()]);
        assert!(d.drain.is_empty());
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The pool never shrinks below `min_agents` nor grows past `max_agents` through a
        /// decision, only drains idle agents, and only removes drained empty ones.
        #[test]
        fn pool_stays_within_min_and_max(
            min in 0u32..4,
            span in 0u32..6,
            agents in prop::collection::vec((any::<bool>(), any::<bool>(), 0u32..3, prop::option::of(0.0f64..1000.0)), 0..10),
            unplaced in prop::collection::vec((1u32..4, 1u64..15), 0..4),
            now in 0.0f64..2000.0,
        ) {
            let cfg = PoolConfig { min_agents: min, max_agents: min + span, scale_down_delay_s: 300.0, agent_memory_bytes: 10, agent_compute: 1.0 };
            let agents: Vec<PoolAgent> = agents
                .into_iter()
                .enumerate()
                .map(|(i, (ready, draining, replicas, idle))| PoolAgent {
                    agent: format!("a{i}"),
                    ready,
                    draining,
                    replacing: false,
                    replicas,
                    idle_since: if replicas == 0 { idle } else { None },
                })
                .collect();
            let unplaced: Vec<Unplaced> = unplaced
                .into_iter()
                .enumerate()
                .map(|(i, (replicas, memory_bytes))| Unplaced { tenant: format!("t{i}"), replicas, memory_bytes, load: 0.1 })
                .collect();
            let d = size_pool(&agents, &unplaced, &cfg, now);
            let total = agents.len() as u32;
            let after = total + d.add - d.remove.len() as u32;
            prop_assert!(after >= min.min(total + d.add), "{after} below min {min}");
            prop_assert!(d.add == 0 || total + d.add <= cfg.max_agents.max(min), "{total} + {} past max", d.add);
            let staying = agents.iter().filter(|a| !a.draining).count() as u32 + d.undrain.len() as u32 + d.add - d.drain.len() as u32;
            prop_assert!(d.drain.is_empty() || staying >= min, "drained below min");
            for n in &d.drain {
                let a = agents.iter().find(|a| &a.agent == n).unwrap();
                prop_assert!(a.replicas == 0 && !a.draining && a.idle_since.is_some_and(|s| now - s >= 300.0));
            }
            for n in &d.remove {
                let a = agents.iter().find(|a| &a.agent == n).unwrap();
                prop_assert!(a.draining && a.replicas == 0);
            }
        }
    }
}
