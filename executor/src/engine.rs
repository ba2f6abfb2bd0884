//! What one instance of a tenant runs its batches on, whatever the device: on the CPU, a backend
//! executing the plan's steps on host tensors; on a GPU, a device-resident instance (one copy up
//! per input, every step on its stream, one copy down per output, one host wait). The serving
//! runtime, DNNScaler's measurements and the GACER planner all go through this trait, so none of
//! them branches on the device.

use crate::backend::Backend;
use crate::error::RunError;
use crate::gacer::ModelProfile;
use crate::gpu::api::{DeviceApi, StreamId};
use crate::gpu::{Alone, Budget, GpuError, Instance, Weights};
use crate::plan::Model;
use crate::runtime::Seat;
use crate::tensor::Tensor;
use std::sync::Arc;
use std::time::Duration;

pub type Outputs = Vec<(String, Tensor)>;

pub trait Engine: Send {
    /// Where it computes, for logs and reports ("cpu(2 threads, avx512)", "cuda:0 ...").
    fn name(&self) -> String;
    /// Runs one batch on its own.
    fn run(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Outputs, RunError>;
    /// Runs one batch as `seat` of a co-schedule, under its GACER plan if it has one;
    /// `latency_bound` is what the batch may take (the plan search keeps to it).
    fn run_seated(
        &mut self,
        seat: &Seat,
        inputs: Vec<(String, Tensor)>,
        latency_bound: Option<Duration>,
    ) -> Result<Outputs, RunError>;
    /// Profiles every step at the batch of `inputs` for GACER: time alone over `reps` runs,
    /// launch footprint, and the time of one piece for each factor of `factors`.
    fn profile(
        &mut self,
        label: &str,
        inputs: &[(String, Tensor)],
        reps: usize,
        factors: &[usize],
    ) -> Result<ModelProfile, RunError>;
}

/// The CPU: a backend running the plan's steps.
pub struct HostEngine {
    model: Arc<Model>,
    backend: Box<dyn Backend>,
}

impl HostEngine {
    pub fn new(model: Arc<Model>, backend: Box<dyn Backend>) -> HostEngine {
        HostEngine { model, backend }
    }
}

impl Engine for HostEngine {
    fn name(&self) -> String {
        self.backend.name()
    }

    fn run(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Outputs, RunError> {
        self.model.plan.run(self.backend.as_ref(), inputs)
    }

    fn run_seated(
        &mut self,
        seat: &Seat,
        inputs: Vec<(String, Tensor)>,
        latency_bound: Option<Duration>,
    ) -> Result<Outputs, RunError> {
        seat.run(
            &self.model.plan,
            self.backend.as_ref(),
            inputs,
            latency_bound,
        )
    }

    fn profile(
        &mut self,
        label: &str,
        inputs: &[(String, Tensor)],
        reps: usize,
        factors: &[usize],
    ) -> Result<ModelProfile, RunError> {
        crate::gacer::profile_model(
            label,
            &self.model.plan,
            self.backend.as_ref(),
            inputs,
            reps,
            factors,
        )
    }
}

/// A GPU: one device-resident instance.
pub struct GpuEngine {
    instance: Instance,
    name: String,
}

impl GpuEngine {
    pub fn new(
        api: Arc<dyn DeviceApi>,
        model: Arc<Model>,
        weights: Arc<Weights>,
        budget: Arc<Budget>,
        stream: Option<StreamId>,
    ) -> Result<GpuEngine, GpuError> {
        let name = api.props().name.clone();
        Ok(GpuEngine {
            instance: Instance::new(api, model, weights, budget, stream)?,
            name,
        })
    }

    pub fn instance(&mut self) -> &mut Instance {
        &mut self.instance
    }
}

/// A GPU runtime failure as a run error: what the request got wrong stays the request's (a 4xx
/// at the agent), anything else is the device's (a 5xx).
pub(crate) fn run_error(e: GpuError) -> RunError {
    match e {
        GpuError::Request(r) => r,
        GpuError::Index { node, why } => RunError::Node {
            node,
            op: "Gather".into(),
            source: crate::error::OpError::Shape(why),
        },
        other => RunError::Device(other.to_string()),
    }
}

impl Engine for GpuEngine {
    fn name(&self) -> String {
        format!("gpu ({})", self.name)
    }

    fn run(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Outputs, RunError> {
        self.instance.run(inputs, &Alone).map_err(run_error)
    }

    fn run_seated(
        &mut self,
        seat: &Seat,
        inputs: Vec<(String, Tensor)>,
        latency_bound: Option<Duration>,
    ) -> Result<Outputs, RunError> {
        seat.run_on_device(&mut self.instance, inputs, latency_bound)
    }

    fn profile(
        &mut self,
        label: &str,
        inputs: &[(String, Tensor)],
        reps: usize,
        factors: &[usize],
    ) -> Result<ModelProfile, RunError> {
        crate::gacer::profile::profile_on_device(label, &mut self.instance, inputs, reps, factors)
    }
}
