//! What a simulation measured, per tenant and for the cluster.

use crate::knobs::Knobs;

#[derive(Clone, Debug, PartialEq)]
pub struct TenantReport {
    pub tenant: String,
    pub model: String,
    pub approach: String,
    pub final_knobs: Knobs,
    pub final_replicas: u32,
    /// Requests that arrived after the warm-up.
    pub arrived: u64,
    pub completed: u64,
    /// Completed within the SLO in force when they completed.
    pub met: u64,
    /// Waited too long and were dropped (counted as misses).
    pub dropped: u64,
    /// Completed requests per second over the measured span.
    pub throughput: f64,
    pub p99_ms: f64,
}

impl TenantReport {
    /// Share of finished requests (completed or dropped) that met the SLO.
    pub fn slo_attainment(&self) -> f64 {
        let finished = self.completed + self.dropped;
        if finished == 0 {
            1.0
        } else {
            self.met as f64 / finished as f64
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    pub strategy: String,
    pub tenants: Vec<TenantReport>,
    /// Ready agents (GPUs) integrated over time.
    pub agent_seconds: f64,
    pub mean_agents: f64,
    pub peak_agents: u32,
    /// (time s, ready agents) at each decision tick.
    pub agents_over_time: Vec<(f64, u32)>,
}

impl SimReport {
    pub fn throughput(&self) -> f64 {
        self.tenants.iter().map(|t| t.throughput).sum()
    }

    /// Share of all finished requests that met their SLO.
    pub fn slo_attainment(&self) -> f64 {
        let met: u64 = self.tenants.iter().map(|t| t.met).sum();
        let finished: u64 = self.tenants.iter().map(|t| t.completed + t.dropped).sum();
        if finished == 0 {
            1.0
        } else {
            met as f64 / finished as f64
        }
    }

    /// Completed requests per agent-second: the efficiency the policies compete on.
    pub fn throughput_per_agent(&self) -> f64 {
        if self.mean_agents > 0.0 {
            self.throughput() / self.mean_agents
        } else {
            0.0
        }
    }
}
