//! What the control loop and the health server share: the metrics, readiness and leadership.

use crate::metrics::{Published, Snapshot};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};

/// Shared state of the operator.
pub struct Context {
    pub registry: Registry,
    /// Reconciliations by `controller` and `result` (`ok` or `error`).
    pub reconciliations: Family<Vec<(String, String)>, Counter>,
    ready: AtomicBool,
    /// 1 while this replica leads.
    leader: prometheus_client::metrics::gauge::Gauge,
    /// The tenants and pools as the leader's latest round decided them.
    published: Published,
}

impl Context {
    pub fn new() -> Context {
        let mut registry = Registry::with_prefix("cotenant_operator");
        let reconciliations = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "reconciliations",
            "Reconciliations by controller and result",
            reconciliations.clone(),
        );
        let leader = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        let published = Published::default();
        registry.register_collector(Box::new(published.clone()));
        Context {
            leader,
            published,
            registry,
            reconciliations,
            ready: AtomicBool::new(false),
        }
    }

    pub fn count(&self, controller: &str, result: &str) {
        self.reconciliations
            .get_or_create(&vec![
                ("controller".to_string(), controller.to_string()),
                ("result".to_string(), result.to_string()),
            ])
            .inc();
    }

    /// Ready once the watches have listed everything once.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// A follower publishes no tenant or pool series: only the leader's rounds are current.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if !leading {
            self.published.replace(Snapshot::default());
        }
    }

    /// Replaces the tenants and pools `/metrics` shows with what a round just decided.
    pub fn publish(&self, snapshot: Snapshot) {
        self.published.replace(snapshot);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::PoolGauges;

    fn encoded(context: &Context) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &context.registry).expect("encode");
        out
    }

    #[test]
    fn a_follower_publishes_no_tenant_or_pool_series() {
        let context = Context::new();
        context.set_leader(true);
        context.publish(Snapshot {
            tenants: vec![],
            pools: vec![PoolGauges {
                name: "gpus".into(),
                agents: 1,
                ready_agents: 1,
                pending_agents: 0,
                max_agents: 2,
            }],
        });
        assert!(encoded(&context).contains(r#"cotenant_operator_pool_max_agents{pool="gpus"} 2"#));
        context.set_leader(false);
        let out = encoded(&context);
        assert!(!out.contains("pool=\"gpus\""), "{out}");
        assert!(out.contains("cotenant_operator_leader 0"), "{out}");
    }
}
