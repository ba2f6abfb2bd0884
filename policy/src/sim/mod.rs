//! Discrete-event cluster simulator.
