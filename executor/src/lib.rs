//! The executor: ONNX import → graph IR → rewrite passes → memory plan → a flat plan that a backend
//! runs; the multi-tenant runtime and the GACER planner sit on top. No Kubernetes, no HTTP.
