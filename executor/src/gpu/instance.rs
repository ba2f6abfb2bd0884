//! One instance of a model on a GPU: its stream, its arena (sized from the memory plan of the
//! largest input shapes it has run), pinned staging, and the tenant's shared weights. A batch is
//! one host-to-device copy per input, every step's work issued asynchronously on the stream
//! (GACER's pointers as event waits and records between streams), one device-to-host copy per
//! output, and one host wait — on an event recorded behind the outputs. A step without a device
//! path runs on the host between an explicit download and upload (the plan reports them).

use super::api::{BufferId, DevPtr, DeviceApi, DeviceError, EventId, PinnedId, StreamId};
use super::budget::{Budget, OverBudget, Reservation};
use super::layout::{self, Home, Layout, LayoutError, StepKind};
use super::lower::{self, Decline, Lowered, Operand, Place, Work};
use super::weights::Weights;
use crate::ops::Cx;
use crate::ops::Op;
use crate::ops::shape::ShapeOp;
use crate::plan::{Model, Src};
use crate::tensor::{DType, Data, Tensor};
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum GpuError {
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The request itself is wrong (checked as the CPU path checks it).
    #[error(transparent)]
    Request(#[from] crate::error::RunError),
    /// A request value the device would read out of range (a Gather index).
    #[error("node {node:?} (Gather): {why}")]
    Index { node: String, why: String },
    #[error("{0}")]
    Input(String),
    #[error("step {node} ({op}): {why}")]
    Step {
        node: String,
        op: String,
        why: String,
    },
}

/// How a batch's steps are coordinated with other streams (GACER) and resized.
pub trait Coordination {
    /// Events the stream waits on before step `step` (the pointers whose waiter it is).
    fn waits(&self, step: usize) -> Vec<EventId> {
        let _ = step;
        Vec::new()
    }
    /// The event recorded after step `step`, when another stream waits on it.
    fn signal(&self, step: usize) -> Option<EventId> {
        let _ = step;
        None
    }
    /// Pieces step `step` runs in.
    fn pieces(&self, step: usize) -> usize {
        let _ = step;
        1
    }
}

/// No other streams to mind: every step whole, no waits.
pub struct Alone;
impl Coordination for Alone {}

/// Pinned host memory that grows to the largest request.
struct Staging {
    buffer: Option<(PinnedId, u64)>,
}

impl Staging {
    fn ensure(&mut self, device: &dyn DeviceApi, bytes: u64) -> Result<PinnedId, DeviceError> {
        match self.buffer {
            Some((p, have)) if have >= bytes => Ok(p),
            other => {
                if let Some((p, _)) = other {
                    device.free_pinned(p);
                }
                let grown = bytes.max(1).next_power_of_two();
                let p = device.alloc_pinned(grown)?;
                self.buffer = Some((p, grown));
                Ok(p)
            }
        }
    }
}

struct Arena {
    buffer: BufferId,
    bytes: u64,
    _reserved: Reservation,
}

/// A batch being issued ([`Instance::begin`]).
pub struct Batch {
    layout: Arc<Layout>,
    base: DevPtr,
    /// The next step to issue.
    next: usize,
    timing: Vec<EventId>,
    /// Outputs coming down: (value, offset in the pinned buffer, arena offset, bytes).
    downs: Vec<(usize, u64, u64, u64)>,
    out_pin: Option<PinnedId>,
}

impl Batch {
    /// Steps issued so far.
    pub fn issued(&self) -> usize {
        self.next
    }
}

/// Per-step device timings of one batch, from timing events around each step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTimes {
    /// Per step: (start, end) in milliseconds from the batch's start on the stream (the record
    /// `Instance::started_after` compares).
    pub spans: Vec<(f32, f32)>,
}

pub struct Instance {
    device: Arc<dyn DeviceApi>,
    model: Arc<Model>,
    weights: Arc<Weights>,
    budget: Arc<Budget>,
    stream: StreamId,
    owns_stream: bool,
    /// Timing events recorded at a batch's start and behind its outputs.
    start: EventId,
    done: EventId,
    arena: Option<Arena>,
    inputs: Staging,
    outputs: Staging,
    fallback: Staging,
    layouts: HashMap<Vec<Vec<usize>>, Arc<Layout>>,
    /// Request inputs read directly as Gather indices: (input position, axis length, node).
    gather_checks: Vec<(usize, usize, String)>,
    timing: Vec<EventId>,
}

impl Instance {
    /// An instance on `device` with its own stream, or on `stream` when one is given (the
    /// sequential schedule shares one).
    pub fn new(
        device: Arc<dyn DeviceApi>,
        model: Arc<Model>,
        weights: Arc<Weights>,
        budget: Arc<Budget>,
        stream: Option<StreamId>,
    ) -> Result<Instance, GpuError> {
        let (stream, owns_stream) = match stream {
            Some(s) => (s, false),
            None => (device.new_stream()?, true),
        };
        let start = device.new_event(true)?;
        let done = device.new_event(true)?;
        let gather_checks = gather_checks(&model);
        Ok(Instance {
            device,
            model,
            weights,
            budget,
            stream,
            owns_stream,
            start,
            done,
            arena: None,
            inputs: Staging { buffer: None },
            outputs: Staging { buffer: None },
            fallback: Staging { buffer: None },
            layouts: HashMap::new(),
            gather_checks,
            timing: Vec::new(),
        })
    }

    pub fn stream(&self) -> StreamId {
        self.stream
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn device(&self) -> &Arc<dyn DeviceApi> {
        &self.device
    }

    /// Arena bytes held now.
    pub fn arena_bytes(&self) -> u64 {
        self.arena.as_ref().map_or(0, |a| a.bytes)
    }

    /// The memory plan for inputs of these shapes; grows the arena when it needs more (never
    /// while work is in flight: every batch ends with a host wait).
    pub fn layout(&mut self, shapes: &[Vec<usize>]) -> Result<Arc<Layout>, GpuError> {
        if let Some(l) = self.layouts.get(shapes) {
            return Ok(l.clone());
        }
        let l = Arc::new(layout::build(&self.model.plan, shapes)?);
        if self.arena.as_ref().is_none_or(|a| a.bytes < l.arena_bytes) {
            // Every layout's uploads go into the new arena again.
            if let Some(old) = self.arena.take() {
                self.device.free(old.buffer);
            }
            self.layouts.clear();
            let reserved = self.budget.reserve(l.arena_bytes)?;
            let buffer = self.device.alloc(l.arena_bytes)?;
            self.arena = Some(Arena {
                buffer,
                bytes: l.arena_bytes,
                _reserved: reserved,
            });
        }
        let base = self.arena_base()?;
        for (off, data) in &l.uploads {
            self.device.upload_now(base.byte_add(*off), data)?;
        }
        self.layouts.insert(shapes.to_vec(), l.clone());
        Ok(l)
    }

    fn arena_base(&self) -> Result<DevPtr, GpuError> {
        self.arena
            .as_ref()
            .map(|a| DevPtr::new(a.buffer, 0))
            .ok_or_else(|| GpuError::Input("no arena".into()))
    }

    /// Runs one batch: the outputs in the model's order.
    pub fn run(
        &mut self,
        inputs: Vec<(String, Tensor)>,
        coord: &dyn Coordination,
    ) -> Result<Vec<(String, Tensor)>, GpuError> {
        let mut batch = self.begin(inputs, false)?;
        while self.issue_step(&mut batch, coord)? {}
        self.end(&mut batch)?;
        self.finish(batch).map(|(out, _)| out)
    }

    /// Runs one batch and times every step on the device with events.
    pub fn run_timed(
        &mut self,
        inputs: Vec<(String, Tensor)>,
        coord: &dyn Coordination,
    ) -> Result<(Vec<(String, Tensor)>, StepTimes), GpuError> {
        let mut batch = self.begin(inputs, true)?;
        while self.issue_step(&mut batch, coord)? {}
        self.end(&mut batch)?;
        self.finish(batch)
    }

    /// Starts a batch: checks the inputs, stages them in pinned memory and issues one copy up
    /// each. Its steps are then issued one by one ([`Instance::issue_step`]), so several
    /// instances' batches can be interleaved from one thread.
    pub fn begin(&mut self, inputs: Vec<(String, Tensor)>, timed: bool) -> Result<Batch, GpuError> {
        let model = self.model.clone();
        let plan = &model.plan;
        let values = plan.bind_inputs(inputs)?;
        let staged: Vec<&Tensor> = plan
            .inputs
            .iter()
            .map(|i| values[i.value].as_ref())
            .collect::<Option<_>>()
            .ok_or_else(|| GpuError::Input("an input is missing".into()))?;
        self.check_gathers(&staged)?;
        let shapes: Vec<Vec<usize>> = staged.iter().map(|t| t.shape.clone()).collect();
        let layout = self.layout(&shapes)?;
        let base = self.arena_base()?;
        let dev = self.device.clone();
        let timing = match timed {
            true => self.timing_events(2 * plan.steps.len())?,
            false => Vec::new(),
        };
        // Step times are measured from this record, as are offsets between instances (one
        // reference, so no gap between two records skews a timeline).
        dev.record(self.stream, self.start)?;
        let mut offsets = Vec::with_capacity(staged.len());
        let mut total = 0u64;
        for t in &staged {
            offsets.push(total);
            total += (t.bytes() as u64).div_ceil(layout::ALIGN) * layout::ALIGN;
        }
        let pin = self.inputs.ensure(dev.as_ref(), total)?;
        for ((i, t), off) in plan.inputs.iter().zip(&staged).zip(&offsets) {
            let bytes = crate::tensor_proto::to_le_bytes(&t.data);
            dev.write_pinned(pin, *off, &bytes)?;
            if let Home::Arena { offset, .. } = &layout.homes[i.value]
                && !bytes.is_empty()
            {
                dev.copy_htod(
                    self.stream,
                    pin,
                    *off,
                    base.byte_add(*offset),
                    bytes.len() as u64,
                )?;
            }
        }
        Ok(Batch {
            layout,
            base,
            next: 0,
            timing,
            downs: Vec::new(),
            out_pin: None,
        })
    }

    /// Issues the batch's next step (after its waits, before its signal); false once every step
    /// has been issued.
    pub fn issue_step(
        &mut self,
        b: &mut Batch,
        coord: &dyn Coordination,
    ) -> Result<bool, GpuError> {
        let model = self.model.clone();
        let Some(step) = model.plan.steps.get(b.next) else {
            return Ok(false);
        };
        let si = b.next;
        let dev = self.device.clone();
        for e in coord.waits(si) {
            dev.wait(self.stream, e)?;
        }
        // A step starts once its waits are over: its start is timed after them.
        if let Some(&t) = b.timing.get(2 * si) {
            dev.record(self.stream, t)?;
        }
        let fail = |why: String| GpuError::Step {
            node: step.node.clone(),
            op: step.op.name(),
            why,
        };
        let l = b.layout.clone();
        match &l.kinds[si] {
            StepKind::Host | StepKind::Alias => {}
            StepKind::Device => {
                let operands = self.operands(&l, b.base, &step.inputs);
                let mut place = RunPlace {
                    layout: &l,
                    step: si,
                    base: b.base,
                    outputs: &step.outputs,
                    next_param: 0,
                };
                let lowered = lower::lower(
                    &step.op,
                    &operands,
                    step.outputs.len(),
                    coord.pieces(si),
                    &mut place,
                )
                .map_err(|Decline(why)| fail(why))?;
                for w in lowered.pieces.iter().flatten() {
                    match w {
                        Work::Launch(launch) => dev.launch(self.stream, launch)?,
                        Work::Gemm(g) => dev.gemm(self.stream, g)?,
                    }
                }
            }
            StepKind::Fallback(_) => self.fallback(&l, b.base, si).map_err(|e| match e {
                GpuError::Device(d) => GpuError::Device(d),
                other => fail(other.to_string()),
            })?,
        }
        // The step's end is timed before its signal, so a waiter never starts before it ends.
        if let Some(&t) = b.timing.get(2 * si + 1) {
            dev.record(self.stream, t)?;
        }
        if let Some(e) = coord.signal(si) {
            dev.record(self.stream, e)?;
        }
        b.next += 1;
        Ok(b.next < model.plan.steps.len())
    }

    /// The work step `si` issues under `layout` in `pieces` pieces (nothing is issued): what
    /// GACER's footprints are read from.
    pub fn step_work(
        &self,
        layout: &Arc<Layout>,
        si: usize,
        pieces: usize,
    ) -> Result<Vec<Vec<Work>>, GpuError> {
        let step = &self.model.plan.steps[si];
        let base = self.arena_base()?;
        let operands = self.operands(layout, base, &step.inputs);
        let mut place = RunPlace {
            layout,
            step: si,
            base,
            outputs: &step.outputs,
            next_param: 0,
        };
        lower::lower(&step.op, &operands, step.outputs.len(), pieces, &mut place)
            .map(|l| l.pieces)
            .map_err(|Decline(why)| GpuError::Step {
                node: step.node.clone(),
                op: step.op.name(),
                why,
            })
    }

    /// What the compiled code of `kernel` needs per thread and block on this device.
    pub fn kernel_attributes(&self, kernel: super::api::Kernel) -> super::api::KernelAttributes {
        self.device.kernel_attributes(kernel)
    }

    /// Issues the batch's copies down and the record of its end.
    pub fn end(&mut self, b: &mut Batch) -> Result<(), GpuError> {
        let dev = self.device.clone();
        let mut total = 0u64;
        for (_, src) in &self.model.plan.outputs {
            if let Src::Value(v) = src
                && let Home::Arena { offset, bytes, .. } = &b.layout.homes[*v]
            {
                b.downs.push((*v, total, *offset, *bytes));
                total += bytes.div_ceil(layout::ALIGN) * layout::ALIGN;
            }
        }
        let out_pin = self.outputs.ensure(dev.as_ref(), total)?;
        for &(_, at, offset, bytes) in &b.downs {
            if bytes > 0 {
                dev.copy_dtoh(self.stream, b.base.byte_add(offset), out_pin, at, bytes)?;
            }
        }
        b.out_pin = Some(out_pin);
        dev.record(self.stream, self.done)?;
        Ok(())
    }

    /// Waits for the batch (the one host wait) and reads its outputs.
    pub fn finish(&mut self, b: Batch) -> Result<(Vec<(String, Tensor)>, StepTimes), GpuError> {
        let dev = self.device.clone();
        dev.sync_event(self.done)?;
        let plan = &self.model.plan;
        let mut times = StepTimes::default();
        if !b.timing.is_empty() {
            times.spans = (0..plan.steps.len())
                .map(|s| {
                    let a = dev.elapsed_ms(self.start, b.timing[2 * s])?;
                    let e = dev.elapsed_ms(self.start, b.timing[2 * s + 1])?;
                    Ok((a, e))
                })
                .collect::<Result<_, DeviceError>>()?;
        }
        let mut result = Vec::with_capacity(plan.outputs.len());
        for (name, src) in &plan.outputs {
            let t = match src {
                Src::Const(c) => (*plan.constants[*c]).clone(),
                Src::Value(v) => match &b.layout.homes[*v] {
                    Home::Host { value, .. } => (**value).clone(),
                    Home::Const(c) => (*plan.constants[*c]).clone(),
                    Home::Arena {
                        dtype,
                        shape,
                        bytes,
                        ..
                    } => {
                        let at = b.downs.iter().find(|d| d.0 == *v).map_or(0, |d| d.1);
                        let pin = b
                            .out_pin
                            .ok_or_else(|| GpuError::Input("batch not ended".into()))?;
                        let mut raw = vec![0u8; *bytes as usize];
                        dev.read_pinned(pin, at, &mut raw)?;
                        Tensor::new(
                            shape.clone(),
                            crate::tensor_proto::from_le_bytes(*dtype, &raw),
                        )
                        .map_err(|e| GpuError::Input(e.to_string()))?
                    }
                    Home::None => {
                        return Err(GpuError::Input(format!("output {name} is not computed")));
                    }
                },
            };
            result.push((name.clone(), t));
        }
        Ok((result, times))
    }

    /// Milliseconds from this instance's last batch start to `other`'s (both finished).
    pub fn started_after(&self, other: &Instance) -> Result<f32, GpuError> {
        Ok(self.device.elapsed_ms(self.start, other.start)?)
    }

    /// The last finished batch's time on the device, from its start to its outputs being on the
    /// host, in milliseconds.
    pub fn last_batch_ms(&self) -> Result<f32, GpuError> {
        Ok(self.device.elapsed_ms(self.start, self.done)?)
    }

    fn timing_events(&mut self, n: usize) -> Result<Vec<EventId>, GpuError> {
        while self.timing.len() < n {
            self.timing.push(self.device.new_event(true)?);
        }
        Ok(self.timing[..n].to_vec())
    }

    /// The operands of a step's inputs under layout `l`.
    fn operands<'l>(
        &'l self,
        l: &'l Layout,
        base: DevPtr,
        inputs: &[Option<Src>],
    ) -> Vec<Option<Operand<'l>>> {
        let plan = &self.model.plan;
        inputs
            .iter()
            .map(|i| {
                i.and_then(|src| match src {
                    Src::Const(c) => plan.constants.get(c).map(|t| Operand {
                        dtype: t.dtype(),
                        shape: &t.shape,
                        at: self.weights.at(c),
                        host: Some(&**t),
                    }),
                    Src::Value(v) => match &l.homes[v] {
                        Home::Arena {
                            dtype,
                            shape,
                            offset,
                            ..
                        } => Some(Operand {
                            dtype: *dtype,
                            shape,
                            at: Some(base.byte_add(*offset)),
                            host: None,
                        }),
                        Home::Host { value, param } => Some(Operand {
                            dtype: value.dtype(),
                            shape: &value.shape,
                            at: param.map(|o| base.byte_add(o)),
                            host: Some(&**value),
                        }),
                        Home::Const(c) => plan.constants.get(*c).map(|t| Operand {
                            dtype: t.dtype(),
                            shape: &t.shape,
                            at: self.weights.at(*c),
                            host: Some(&**t),
                        }),
                        Home::None => None,
                    },
                })
            })
            .collect()
    }

    /// A step on the host: its device inputs come down (with a host wait), it runs, its
    /// outputs go up.
    fn fallback(&mut self, l: &Layout, base: DevPtr, si: usize) -> Result<(), GpuError> {
        let model = self.model.clone();
        let step = &model.plan.steps[si];
        let dev = self.device.clone();
        let mut downs = Vec::new();
        let mut total = 0u64;
        for src in step.inputs.iter().flatten() {
            if let Src::Value(v) = src
                && let Home::Arena { offset, bytes, .. } = &l.homes[*v]
            {
                downs.push((*v, total, *offset, *bytes));
                total += bytes.div_ceil(layout::ALIGN) * layout::ALIGN;
            }
        }
        let pin = self.fallback.ensure(dev.as_ref(), total.max(1))?;
        for &(_, at, offset, bytes) in &downs {
            if bytes > 0 {
                dev.copy_dtoh(self.stream, base.byte_add(offset), pin, at, bytes)?;
            }
        }
        dev.record(self.stream, self.done)?;
        dev.sync_event(self.done)?;
        let plan = &model.plan;
        let mut owned: Vec<Option<Tensor>> = Vec::with_capacity(step.inputs.len());
        for i in &step.inputs {
            owned.push(match i {
                None => None,
                Some(Src::Const(c)) => Some((*plan.constants[*c]).clone()),
                Some(Src::Value(v)) => match &l.homes[*v] {
                    Home::Arena {
                        dtype,
                        shape,
                        bytes,
                        ..
                    } => {
                        let at = downs.iter().find(|d| d.0 == *v).map_or(0, |d| d.1);
                        let mut raw = vec![0u8; *bytes as usize];
                        dev.read_pinned(pin, at, &mut raw)?;
                        Some(
                            Tensor::new(
                                shape.clone(),
                                crate::tensor_proto::from_le_bytes(*dtype, &raw),
                            )
                            .map_err(|e| GpuError::Input(e.to_string()))?,
                        )
                    }
                    Home::Host { value, .. } => Some((**value).clone()),
                    Home::Const(c) => Some((*plan.constants[*c]).clone()),
                    Home::None => None,
                },
            });
        }
        let refs: Vec<Option<&Tensor>> = owned.iter().map(Option::as_ref).collect();
        let outs = step
            .op
            .eval(&Cx::new(1), &refs)
            .map_err(|e| GpuError::Input(e.to_string()))?;
        // Up again, after the inputs' bytes (the downloads above are complete).
        let mut ups = Vec::new();
        let mut total = 0u64;
        for (k, t) in outs.iter().enumerate() {
            if let Some(&v) = step.outputs.get(k)
                && let Home::Arena { offset, bytes, .. } = &l.homes[v]
            {
                let data = crate::tensor_proto::to_le_bytes(&t.data);
                if data.len() as u64 > *bytes {
                    return Err(GpuError::Input(format!(
                        "output {k} is {} bytes, planned for {bytes}",
                        data.len()
                    )));
                }
                ups.push((total, *offset, data));
                total += (*bytes).div_ceil(layout::ALIGN) * layout::ALIGN;
            }
        }
        let pin = self.fallback.ensure(dev.as_ref(), total.max(1))?;
        for (at, offset, data) in &ups {
            dev.write_pinned(pin, *at, data)?;
            if !data.is_empty() {
                dev.copy_htod(
                    self.stream,
                    pin,
                    *at,
                    base.byte_add(*offset),
                    data.len() as u64,
                )?;
            }
        }
        Ok(())
    }

    /// Request values read directly as Gather indices must be in range: the kernel cannot raise.
    fn check_gathers(&self, staged: &[&Tensor]) -> Result<(), GpuError> {
        for (input, len, node) in &self.gather_checks {
            let Some(t) = staged.get(*input) else {
                continue;
            };
            let ids: Vec<i64> = match &t.data {
                Data::I64(v) => v.clone(),
                Data::I32(v) => v.iter().map(|&x| x as i64).collect(),
                _ => continue,
            };
            if let Some(bad) = ids
                .iter()
                .find(|&&i| i < -(*len as i64) || i >= *len as i64)
            {
                return Err(GpuError::Index {
                    node: node.clone(),
                    why: format!("index {bad} out of range [-{len}, {len})"),
                });
            }
        }
        Ok(())
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // The last batch ended with a host wait, so nothing is in flight.
        if let Some(a) = self.arena.take() {
            self.device.free(a.buffer);
        }
        for s in [&mut self.inputs, &mut self.outputs, &mut self.fallback] {
            if let Some((p, _)) = s.buffer.take() {
                self.device.free_pinned(p);
            }
        }
        self.device.free_event(self.start);
        self.device.free_event(self.done);
        for e in self.timing.drain(..) {
            self.device.free_event(e);
        }
        if self.owns_stream {
            self.device.free_stream(self.stream);
        }
    }
}

/// Gather steps whose indices are a model input, with the data axis length (a constant's).
fn gather_checks(model: &Model) -> Vec<(usize, usize, String)> {
    let plan = &model.plan;
    let mut checks = Vec::new();
    for s in &plan.steps {
        let Op::Shape(ShapeOp::Gather { axis }) = &s.op else {
            continue;
        };
        let (Some(Some(Src::Const(c))), Some(Some(Src::Value(v)))) =
            (s.inputs.first(), s.inputs.get(1))
        else {
            continue;
        };
        let Some(data) = plan.constants.get(*c) else {
            continue;
        };
        // A scalar has no axis to gather along (the op itself refuses it).
        let Ok(axis) = crate::tensor::axis_in(*axis, data.rank()) else {
            continue;
        };
        if let Some(pos) = plan.inputs.iter().position(|i| i.value == *v)
            && matches!(plan.inputs[pos].dtype, DType::I64 | DType::I32)
        {
            checks.push((pos, data.shape[axis], s.node.clone()));
        }
    }
    checks
}

/// Addresses of the running batch, from the layout.
struct RunPlace<'a> {
    layout: &'a Layout,
    step: usize,
    base: DevPtr,
    outputs: &'a [usize],
    next_param: usize,
}

impl Place for RunPlace<'_> {
    fn output(&mut self, k: usize, bytes: u64) -> Lowered<DevPtr> {
        let v = *self
            .outputs
            .get(k)
            .ok_or_else(|| Decline(format!("no output {k}")))?;
        match &self.layout.homes[v] {
            Home::Arena {
                offset,
                bytes: have,
                ..
            } if bytes <= *have => Ok(self.base.byte_add(*offset)),
            Home::Arena { bytes: have, .. } => Err(Decline(format!(
                "output {k} is {bytes} bytes, planned for {have}"
            ))),
            _ => Err(Decline(format!("output {k} has no place in the arena"))),
        }
    }
    fn scratch(&mut self, index: usize, bytes: u64) -> Lowered<DevPtr> {
        match self.layout.scratch[self.step].get(index) {
            Some(&(offset, have)) if bytes <= have => Ok(self.base.byte_add(offset)),
            _ => Err(Decline(format!(
                "scratch {index} of {bytes} bytes was not planned"
            ))),
        }
    }
    fn param(&mut self, data: &[u8]) -> Lowered<DevPtr> {
        let off = self.layout.params[self.step]
            .get(self.next_param)
            .copied()
            .ok_or_else(|| Decline("a parameter was not planned".into()))?;
        let _ = data;
        self.next_param += 1;
        Ok(self.base.byte_add(off))
    }
}
