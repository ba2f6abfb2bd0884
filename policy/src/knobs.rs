//! The two knobs DNNScaler moves (batch size and co-located instances) and the bounds a
//! `ModelTenant` puts on them and on its replica count.

use serde::{Deserialize, Serialize};

/// What one replica of a tenant runs with: `instances` copies of the model, each taking batches
/// of up to `batch` requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Knobs {
    pub batch: u32,
    pub instances: u32,
}

impl Knobs {
    pub const ONE: Knobs = Knobs {
        batch: 1,
        instances: 1,
    };

    pub fn new(batch: u32, instances: u32) -> Knobs {
        Knobs { batch, instances }
    }

    /// Requests one replica can hold in service at once.
    pub fn concurrency(self) -> u32 {
        self.batch.saturating_mul(self.instances)
    }
}

/// Which approach the user allows; `Auto` lets the profiler rule pick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApproachPolicy {
    #[default]
    Auto,
    Batching,
    MultiTenancy,
}

/// The scaling bounds of one tenant, as written in its `ModelTenant`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounds {
    pub approach: ApproachPolicy,
    pub max_batch: u32,
    pub max_instances: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            approach: ApproachPolicy::Auto,
            max_batch: 64,
            max_instances: 8,
            min_replicas: 1,
            max_replicas: 16,
        }
    }
}

impl Bounds {
    /// The bounds with zero maxima raised to one, so a sloppy spec cannot make every knob
    /// illegal (the CRD validates this too; the policy does not rely on it).
    pub fn sane(self) -> Bounds {
        let max_replicas = self.max_replicas.max(self.min_replicas).max(1);
        Bounds {
            max_batch: self.max_batch.max(1),
            max_instances: self.max_instances.max(1),
            max_replicas,
            ..self
        }
    }

    /// `knobs` pulled inside these bounds.
    pub fn clamp(self, knobs: Knobs) -> Knobs {
        let b = self.sane();
        Knobs {
            batch: knobs.batch.clamp(1, b.max_batch),
            instances: knobs.instances.clamp(1, b.max_instances),
        }
    }

    pub fn contains(self, knobs: Knobs) -> bool {
        self.clamp(knobs) == knobs
    }

    pub fn clamp_replicas(self, replicas: u32) -> u32 {
        let b = self.sane();
        replicas.clamp(b.min_replicas, b.max_replicas)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamp_keeps_knobs_inside_even_with_zero_maxima() {
        let b = Bounds {
            max_batch: 0,
            max_instances: 0,
            ..Bounds::default()
        };
        assert_eq!(b.clamp(Knobs::new(9, 9)), Knobs::ONE);
        assert_eq!(
            Bounds::default().clamp(Knobs::new(0, 100)),
            Knobs::new(1, 8)
        );
    }

    #[test]
    fn replicas_clamp_to_min_and_max() {
        let b = Bounds {
            min_replicas: 2,
            max_replicas: 4,
            ..Bounds::default()
        };
        assert_eq!(b.clamp_replicas(0), 2);
        assert_eq!(b.clamp_replicas(9), 4);
    }
}
