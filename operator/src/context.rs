//! What the control loop and the health server share: the metrics, readiness and leadership.

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
        Context {
            leader,
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

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}
