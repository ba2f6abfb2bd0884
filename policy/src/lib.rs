//! Pure decisions with no I/O and no Kubernetes: the DNNScaler profiler rule and scaler, replica
//! counts, placement, pool sizing, and a discrete-event simulator that evaluates them at scale.
//! The operator, the agent's standalone mode and the simulator all call the same functions.
