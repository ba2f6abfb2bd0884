//! Pure decisions with no I/O and no Kubernetes: the DNNScaler profiler rule and scaler, the
//! per-tenant knob policies ([`Strategy`], [`Controller`]), replica counts, placement, pool
//! sizing, and a discrete-event simulator that evaluates them at scale.
//! The operator, the agent's standalone mode and the simulator all call the same functions.
//!
//! Nothing here reads a clock: time arrives as `now_s` (seconds on any monotonic origin).
//! The only I/O is [`profile::ProfileTable::load`], which reads a profile file for callers that
//! want it; everything else takes plain values.
//!
//! One decision round, as the operator (and [`sim`]) runs it every report interval:
//! 1. once per tenant, after profiling: [`choose_approach`] picks the approach and starting
//!    knobs (inside [`Controller::new`] for the simulator and the standalone agent),
//!    [`LatencyModel::from_profile`] builds the model, [`TenantRound::new`] holds both with the
//!    replica rule's state;
//! 2. per tenant and window, [`TenantRound::round`]: the controller ([`step`] for DNNScaler)
//!    moves the knobs (or asks for a replica) once the window holds enough [`Evidence`] measured
//!    since the knobs last changed (its [`Epoch`]), at most every [`STEP_INTERVAL_S`]; then
//!    [`ReplicaState::decide`] sets the replica count from the arrival rate and
//!    [`LatencyModel::throughput`] at the knobs, and [`demand`] says what placement must find;
//! 3. for the pool: [`place`] with every tenant's [`ReplicaDemand`] (from [`demand`]: footprint
//!    from [`LatencyModel::memory_bytes`], load from the arrival rate, the throughput at the
//!    knobs and [`LatencyModel::gpu_util`]) and the running replicas; apply `stop` and `start`,
//!    leave `hold_until_replaced` running as it is;
//! 4. [`size_pool`] with the plan's `unplaced` replicas: add, undrain, drain, remove agents.

pub mod demand;
pub mod dnnscaler;
pub mod knob_policy;
pub mod knobs;
pub mod placement;
pub mod pool;
pub mod profile;
pub mod replicas;
pub mod round;
pub mod sim;
pub mod slo;

pub use demand::{Demand, demand};
pub use dnnscaler::{
    Approach, ApproachChoice, Decision, Epoch, Evidence, LatencyModel, Learned, ScalerConfig,
    ScalerState, choose_approach, step,
};
pub use knob_policy::{Controller, Strategy};
pub use knobs::{ApproachPolicy, Bounds, Knobs};
pub use placement::{
    AgentCapacity, CurrentReplica, Placement, PlacementPlan, ReplicaDemand, place, place_at_most,
};
pub use pool::{PoolAgent, PoolConfig, PoolDecision, size_pool};
pub use profile::{Profile, ProfileError, ProfilePoint, ProfileTable};
pub use replicas::{ReplicaConfig, ReplicaInput, ReplicaState};
pub use round::{Measured, Outcome, RoundConfig, STEP_INTERVAL_S, TenantRound};
pub use slo::{Slo, TenantObservation};
