//! The flat execution plan: steps in order, each reading constants or earlier values, with every
//! activation freed right after its last use (liveness-based memory plan). Reports the numbers
//! placement needs: weight bytes and peak activation bytes at a batch size.

use crate::backend::{Backend, CpuBackend};
use crate::error::{ImportError, RunError};
use crate::graph::{Dim, Graph, GraphInput};
use crate::memory::{Ledger, MemoryBudget};
use crate::ops::Op;
use crate::ops::quant::QuantOp;
use crate::tensor::{DType, Tensor};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Computes one step's outputs from its op and inputs (see `Plan::run_step`).
pub type StepExec<'a> =
    dyn Fn(&Op, &[Option<&Tensor>]) -> Result<Vec<Tensor>, crate::error::OpError> + 'a;

/// Where a step input comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Src {
    Const(usize),
    Value(usize),
}

#[derive(Clone, Debug)]
pub struct Step {
    pub node: String,
    pub op: Op,
    pub inputs: Vec<Option<Src>>,
    pub outputs: Vec<usize>,
    /// Values whose last reader is this step: freed once it has run.
    pub frees: Vec<usize>,
}

/// Time spent per op kind (or per node), for `COTENANT_PROFILE`.
struct Profile {
    by_node: bool,
    times: Mutex<HashMap<String, (usize, Duration)>>,
}

pub struct Plan {
    pub steps: Vec<Step>,
    pub constants: Vec<Arc<Tensor>>,
    pub inputs: Vec<GraphInput>,
    pub outputs: Vec<(String, Src)>,
    /// The batch symbol, where every sample is computed from that sample alone (see
    /// `passes::separable_batch`): a batch can then run in parts, one per lane of the backend.
    pub separable_batch: Option<String>,
    /// Why requests must not share a batch although every input starts with a symbolic
    /// dimension (see `passes::batch_refusal`).
    pub batch_refusal: Option<String>,
    n_values: usize,
    profile: Option<Profile>,
    /// Bytes of every value at batch 1 and 2, measured once (see `peak_activation_bytes`).
    value_bytes: Mutex<HashMap<usize, Arc<Vec<usize>>>>,
    /// What this plan's runs may hold at once (see `memory`); none: unlimited.
    budget: Option<Arc<MemoryBudget>>,
}

impl Plan {
    /// Flattens an (optimised) graph into a plan.
    pub fn build(g: &Graph) -> Result<Plan, ImportError> {
        let mut constants = Vec::new();
        let mut const_idx = HashMap::new();
        let mut src_of = |v: usize| -> Src {
            if let Some(t) = g.constants.get(&v) {
                let i = *const_idx.entry(v).or_insert_with(|| {
                    constants.push(t.clone());
                    constants.len() - 1
                });
                Src::Const(i)
            } else {
                Src::Value(v)
            }
        };
        let mut steps: Vec<Step> = g
            .nodes
            .iter()
            .map(|n| Step {
                node: n.name.clone(),
                op: n.op.clone(),
                inputs: n.inputs.iter().map(|i| i.map(&mut src_of)).collect(),
                outputs: n.outputs.clone(),
                frees: vec![],
            })
            .collect();
        let outputs: Vec<(String, Src)> = g
            .outputs
            .iter()
            .map(|&v| (g.value_names[v].clone(), src_of(v)))
            .collect();
        // Weights the CPU reads in another order, reordered once here.
        for s in &mut steps {
            for (c, k) in crate::ops::conv::weighted_convs(&mut s.op) {
                if let Some(Some(Src::Const(w))) = s.inputs.get(k) {
                    crate::ops::conv::pack_filter(c, &constants[*w]);
                }
            }
        }
        drop_packed_weights(&mut steps, &mut constants, &outputs);
        // Liveness: a value dies after its last reader, unless it is a graph output.
        let mut last = vec![None; g.value_names.len()];
        for (i, s) in steps.iter().enumerate() {
            for src in s.inputs.iter().flatten() {
                if let Src::Value(v) = src {
                    last[*v] = Some(i);
                }
            }
            // Outputs nobody reads die right away.
            for &o in &s.outputs {
                if last[o].is_none() {
                    last[o] = Some(i);
                }
            }
        }
        for (_, s) in &outputs {
            if let Src::Value(v) = s {
                last[*v] = None;
            }
        }
        for (v, l) in last.iter().enumerate() {
            if let Some(i) = l {
                steps[*i].frees.push(v);
            }
        }
        let profile = std::env::var("COTENANT_PROFILE").ok().map(|v| Profile {
            by_node: v == "node",
            times: Mutex::new(HashMap::new()),
        });
        Ok(Plan {
            steps,
            constants,
            inputs: g.inputs.clone(),
            outputs,
            separable_batch: crate::passes::separable_batch(g),
            batch_refusal: crate::passes::batch_refusal(g),
            n_values: g.value_names.len(),
            profile,
            value_bytes: Mutex::new(HashMap::new()),
            budget: None,
        })
    }

    /// Bytes of all weights and other constants the plan holds, with the weights kernels hold
    /// reordered (the int8 ones hold theirs only so).
    pub fn weight_bytes(&self) -> usize {
        let conv = |c: &crate::ops::conv::ConvAttrs| {
            c.packed.as_ref().map_or(0, |f| f.bytes())
                + c.nhwc_filter.as_ref().map_or(0, |f| f.bytes())
        };
        let packed: usize = self
            .steps
            .iter()
            .filter_map(|s| match &s.op {
                Op::Conv(c) => Some(conv(c)),
                Op::PointwiseDepthwise(f) => Some(
                    conv(&f.pointwise) + conv(&f.depthwise) + f.project.as_ref().map_or(0, conv),
                ),
                Op::Quant(QuantOp::QConv(q)) => Some(q.w.bytes()),
                Op::Quant(QuantOp::PackedMatMul(m)) => Some(m.b.bytes()),
                Op::Quant(QuantOp::PackedConv(c)) => Some(c.bytes()),
                Op::Rnn(r) => r.quantized_r.as_ref().map(|q| q.bytes()),
                Op::MatMul {
                    packed: Some(f), ..
                } => Some(f.bytes()),
                _ => None,
            })
            .sum();
        self.constants.iter().map(|t| t.bytes()).sum::<usize>() + packed
    }

    /// Names of the model's inputs and outputs.
    pub fn input_names(&self) -> Vec<String> {
        self.inputs.iter().map(|i| i.name.clone()).collect()
    }
    pub fn output_names(&self) -> Vec<String> {
        self.outputs.iter().map(|o| o.0.clone()).collect()
    }

    /// Zero-filled inputs at `batch` (symbolic dims other than the first become 1).
    pub fn example_inputs(&self, batch: usize) -> Vec<(String, Tensor)> {
        self.inputs
            .iter()
            .map(|i| {
                let t = Tensor::zeros(i.dtype, i.example_shape(batch))
                    .unwrap_or_else(|_| Tensor::scalar_f32(0.0));
                (i.name.clone(), t)
            })
            .collect()
    }

    /// Holds every later run of this plan, and of the bodies of its control-flow steps, to
    /// `budget` (see `memory`).
    pub fn set_memory_budget(&mut self, budget: Arc<MemoryBudget>) {
        for s in &self.steps {
            if let Op::Control(c) = &s.op {
                c.set_memory_budget(&budget);
            }
        }
        self.budget = Some(budget);
    }

    pub fn memory_budget(&self) -> Option<&MemoryBudget> {
        self.budget.as_deref()
    }

    /// How many values the plan's steps and inputs index: a run keeps one slot for each.
    pub fn value_count(&self) -> usize {
        self.n_values
    }

    /// Peak bytes of live activations during one run at `batch`, under the plan's liveness
    /// (every value freed after its last reader). Value sizes are measured by runs on zeros at
    /// batch 1 and 2 (held to the plan's memory budget) and extrapolated to `batch`
    /// (`memory::extrapolate`): a large batch is never run to learn its size.
    pub fn peak_activation_bytes(&self, batch: usize) -> Result<usize, RunError> {
        let one = self.value_bytes(1)?;
        if batch <= 1 {
            return Ok(self.peak_of(&one));
        }
        let two = self.value_bytes(2)?;
        Ok(self.peak_of(&crate::memory::extrapolate(&one, &two, batch)))
    }

    /// [`Plan::peak_activation_bytes`] when its measurements are already made; never runs.
    pub fn measured_peak_activation_bytes(&self, batch: usize) -> Option<usize> {
        let measured = self.value_bytes.lock().unwrap_or_else(|e| e.into_inner());
        let one = measured.get(&1)?;
        if batch <= 1 {
            return Some(self.peak_of(one));
        }
        let two = measured.get(&2)?;
        Some(self.peak_of(&crate::memory::extrapolate(one, two, batch)))
    }

    /// Bytes of every value in one run on zeros at `batch`, measured once.
    fn value_bytes(&self, batch: usize) -> Result<Arc<Vec<usize>>, RunError> {
        if let Some(v) = self
            .value_bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&batch)
        {
            return Ok(v.clone());
        }
        let backend = CpuBackend::new(1);
        let mut sizes = vec![0usize; self.n_values];
        self.run_inner(&backend, self.example_inputs(batch), Some(&mut sizes))?;
        let sizes = Arc::new(sizes);
        self.value_bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(batch, sizes.clone());
        Ok(sizes)
    }

    /// The peak of live bytes over the steps, for values of `sizes` bytes.
    fn peak_of(&self, sizes: &[usize]) -> usize {
        let mut live = 0usize;
        let mut peak = 0usize;
        // Inputs are live from the start.
        for i in &self.inputs {
            live = live.saturating_add(sizes[i.value]);
        }
        for s in &self.steps {
            let sum = |vs: &[usize]| vs.iter().fold(0usize, |a, &v| a.saturating_add(sizes[v]));
            live = live.saturating_add(sum(&s.outputs));
            peak = peak.max(live);
            live = live.saturating_sub(sum(&s.frees));
        }
        peak.max(live)
    }

    /// Runs the plan on named inputs; returns the outputs in the model's order.
    pub fn run(
        &self,
        backend: &dyn Backend,
        inputs: Vec<(String, Tensor)>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        self.run_inner(backend, inputs, None)
    }

    fn check_inputs(&self, inputs: Vec<(String, Tensor)>) -> Result<Vec<Option<Tensor>>, RunError> {
        let mut values: Vec<Option<Tensor>> = vec![None; self.n_values];
        let mut symbols: HashMap<String, usize> = HashMap::new();
        for (name, t) in inputs {
            let decl = self.inputs.iter().find(|i| i.name == name).ok_or_else(|| {
                RunError::UnknownInput {
                    name: name.clone(),
                    expected: self.input_names(),
                }
            })?;
            let bad = |expected: String, got: String| RunError::BadInput {
                name: name.clone(),
                expected,
                got,
            };
            if t.dtype() != decl.dtype {
                return Err(bad(format!("{:?}", decl.dtype), format!("{:?}", t.dtype())));
            }
            if let Some(dims) = &decl.dims {
                if dims.len() != t.rank() {
                    return Err(bad(
                        format!("rank {} {dims:?}", dims.len()),
                        format!("shape {:?}", t.shape),
                    ));
                }
                // Concrete dimensions, and the symbols that axes of different inputs share
                // (`import` gives unknown and repeated-within-one-input axes symbols of their
                // own, so no other symbol constrains anything).
                for (d, &got) in dims.iter().zip(&t.shape) {
                    match d {
                        Dim::Fixed(v) if *v != got => {
                            return Err(bad(format!("{dims:?}"), format!("shape {:?}", t.shape)));
                        }
                        Dim::Symbol(s) if *symbols.entry(s.clone()).or_insert(got) != got => {
                            return Err(bad(
                                format!("{s} = {}", symbols[s]),
                                format!("shape {:?}", t.shape),
                            ));
                        }
                        _ => {}
                    }
                }
            }
            values[decl.value] = Some(t);
        }
        for i in &self.inputs {
            if values[i.value].is_none() {
                return Err(RunError::MissingInput(i.name.clone()));
            }
        }
        Ok(values)
    }

    fn run_inner(
        &self,
        backend: &dyn Backend,
        inputs: Vec<(String, Tensor)>,
        mut sizes: Option<&mut Vec<usize>>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let lanes = backend.batch_lanes();
        if sizes.is_none()
            && let Some(rows) = self.lane_rows(lanes.len(), &inputs)
        {
            return self.run_in_lanes(backend, &lanes, inputs, &rows);
        }
        let mut values = self.check_inputs(inputs)?;
        if let Some(sz) = sizes.as_deref_mut() {
            for (v, t) in values.iter().enumerate() {
                if let Some(t) = t {
                    sz[v] = t.bytes();
                }
            }
        }
        let mut result: Result<(), RunError> = Ok(());
        backend.scope(&mut || result = self.run_steps(backend, &mut values, sizes.as_deref_mut()));
        result?;
        self.collect_outputs(&values)
    }

    /// How many rows of the batch each of `lanes` lanes runs, where splitting pays: the plan's
    /// batch separates, every input has the same first dimension, and the parts are even or
    /// many (3 rows on 2 lanes would leave one lane idle a third of the time; the whole pool on
    /// one batch does better).
    fn lane_rows(&self, lanes: usize, inputs: &[(String, Tensor)]) -> Option<Vec<usize>> {
        self.separable_batch.as_ref()?;
        let batch = *inputs.first()?.1.shape.first()?;
        if lanes < 2
            || batch < lanes
            || !(batch.is_multiple_of(lanes) || batch >= 4 * lanes)
            || inputs.iter().any(|(_, t)| t.shape.first() != Some(&batch))
        {
            return None;
        }
        Some(
            (0..lanes)
                .map(|i| batch / lanes + usize::from(i < batch % lanes))
                .collect(),
        )
    }

    /// Runs `rows[i]` rows of the batch on lane `i`, all at once on the backend's threads, and
    /// joins the lanes' outputs along the batch axis. Each lane has its own caches, and the
    /// operators of one lane never wait for another's.
    fn run_in_lanes(
        &self,
        backend: &dyn Backend,
        lanes: &[&dyn Backend],
        inputs: Vec<(String, Tensor)>,
        rows: &[usize],
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let mut parts = Some(crate::tensor::split_rows(inputs, rows));
        let mut results = Vec::new();
        backend.scope(&mut || {
            if let Some(parts) = parts.take() {
                results = parts
                    .into_par_iter()
                    .zip(lanes)
                    .map(|(part, lane)| self.run_inner(*lane, part, None))
                    .collect();
            }
        });
        let results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
        (0..self.outputs.len())
            .map(|o| {
                let name = self.outputs[o].0.clone();
                let parts: Vec<&Tensor> = results.iter().map(|r| &r[o].1).collect();
                let joined = Tensor::cat_rows(&parts).map_err(|source| RunError::Node {
                    node: name.clone(),
                    op: "joining the batch lanes' outputs".into(),
                    source,
                })?;
                Ok((name, joined))
            })
            .collect()
    }

    /// The model's outputs, in order, from a value table after every step ran.
    pub fn collect_outputs(
        &self,
        values: &[Option<Tensor>],
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        self.outputs
            .iter()
            .map(|(name, src)| {
                let t = match src {
                    Src::Const(c) => Some((*self.constants[*c]).clone()),
                    Src::Value(v) => values[*v].clone(),
                };
                t.map(|t| (name.clone(), t))
                    .ok_or_else(|| RunError::MissingOutput(name.clone()))
            })
            .collect()
    }

    fn run_steps(
        &self,
        backend: &dyn Backend,
        values: &mut [Option<Tensor>],
        mut sizes: Option<&mut Vec<usize>>,
    ) -> Result<(), RunError> {
        let mut ledger = Ledger::new(self.memory_budget());
        let inputs = values.iter().flatten().map(Tensor::bytes).sum();
        ledger.take(inputs, "inputs", "the request's tensors")?;
        for s in &self.steps {
            let exec = |op: &Op, refs: &[Option<&Tensor>]| backend.execute(op, refs);
            self.run_one(backend, &exec, values, s, sizes.as_deref_mut(), &mut ledger)?;
        }
        Ok(())
    }

    /// Binds named inputs to a fresh value table, for callers that run the steps one by one
    /// (the GACER schedules); checked exactly as `run` checks them.
    pub fn bind_inputs(
        &self,
        inputs: Vec<(String, Tensor)>,
    ) -> Result<Vec<Option<Tensor>>, RunError> {
        self.check_inputs(inputs)
    }

    /// Runs step `index` on a value table made by `bind_inputs`: reads its inputs, computes its
    /// outputs with `exec` (normally `backend.execute`; GACER passes one that runs the op in
    /// pieces), stores them and frees the values it was the last reader of. Call inside
    /// `backend.scope`.
    pub fn run_step(
        &self,
        backend: &dyn Backend,
        exec: &StepExec<'_>,
        values: &mut [Option<Tensor>],
        index: usize,
    ) -> Result<(), RunError> {
        let s = self
            .steps
            .get(index)
            .ok_or_else(|| RunError::MissingOutput(format!("step {index} of the plan")))?;
        // Held to the budget for its own allocations only; the schedule owns the value table.
        let mut ledger = Ledger::new(self.memory_budget());
        self.run_one(backend, exec, values, s, None, &mut ledger)
    }

    fn run_one(
        &self,
        backend: &dyn Backend,
        exec: &StepExec<'_>,
        values: &mut [Option<Tensor>],
        s: &Step,
        mut sizes: Option<&mut Vec<usize>>,
        ledger: &mut Ledger<'_>,
    ) -> Result<(), RunError> {
        {
            let started = self.profile.as_ref().map(|_| Instant::now());
            let node_err = |source| RunError::Node {
                node: s.node.clone(),
                op: s.op.name(),
                source,
            };
            // A reshape of a value that dies here just relabels its buffer instead of copying it.
            let moved = match (&s.op, s.inputs.first()) {
                (Op::Shape(sh), Some(Some(Src::Value(v))))
                    if sh.is_reshape() && s.frees.contains(v) && values[*v].is_some() =>
                {
                    let refs: Vec<Option<&Tensor>> = s
                        .inputs
                        .iter()
                        .map(|i| i.and_then(|src| self.get(values, &src)))
                        .collect();
                    let x = refs.first().copied().flatten().map(|t| t.shape.clone());
                    let x = x.ok_or(RunError::MissingOutput(s.node.clone()))?;
                    let shape = sh.reshape_target(&x, &refs).map_err(node_err)?;
                    let t = values[*v]
                        .take()
                        .ok_or(RunError::MissingOutput(s.node.clone()))?;
                    // The same buffer comes back as the output and is held again below.
                    ledger.give(t.bytes());
                    Some(vec![t.reshaped(shape).map_err(node_err)?])
                }
                _ => None,
            };
            let outs = match moved {
                Some(o) => o,
                None => {
                    let mut refs: Vec<Option<&Tensor>> = Vec::with_capacity(s.inputs.len());
                    for (k, i) in s.inputs.iter().enumerate() {
                        match i {
                            None => refs.push(None),
                            Some(src) => {
                                refs.push(Some(self.get(values, src).ok_or_else(|| {
                                    node_err(crate::error::OpError::MissingInput(k))
                                })?))
                            }
                        }
                    }
                    // What the op is about to allocate, reserved before it does.
                    let op = s.op.name();
                    let reserve = crate::ops::size::allocation(&s.op, &refs)
                        .map_err(node_err)?
                        .unwrap_or(0);
                    ledger.take(reserve, &s.node, &op)?;
                    let outs = exec(&s.op, &refs).map_err(node_err);
                    ledger.give(reserve);
                    outs?
                }
            };
            let made = outs.iter().take(s.outputs.len()).map(Tensor::bytes).sum();
            ledger.take(made, &s.node, &s.op.name())?;
            for (k, t) in outs.into_iter().enumerate() {
                if let Some(&o) = s.outputs.get(k) {
                    if let Some(sz) = sizes.as_deref_mut() {
                        sz[o] = t.bytes();
                    }
                    values[o] = Some(t);
                }
            }
            for &f in &s.frees {
                if let Some(t) = values[f].take() {
                    ledger.give(t.bytes());
                    backend.recycle(t);
                }
            }
            if let (Some(p), Some(t0)) = (&self.profile, started) {
                let key = if p.by_node {
                    format!("{} {}", s.node, s.op.name())
                } else {
                    s.op.name()
                };
                let mut p = p.times.lock().unwrap_or_else(|e| e.into_inner());
                let e = p.entry(key).or_insert((0, Duration::ZERO));
                e.0 += 1;
                e.1 += t0.elapsed();
            }
        }
        Ok(())
    }

    fn get<'a>(&'a self, values: &'a [Option<Tensor>], src: &Src) -> Option<&'a Tensor> {
        match src {
            Src::Const(c) => self.constants.get(*c).map(|t| &**t),
            Src::Value(v) => values.get(*v).and_then(|t| t.as_ref()),
        }
    }

    /// Accumulated time per op kind (only with `COTENANT_PROFILE` set; per node, named
    /// "node op", with `COTENANT_PROFILE=node`), slowest first.
    pub fn op_profile(&self) -> Vec<(String, usize, Duration)> {
        let Some(p) = &self.profile else {
            return vec![];
        };
        let mut v: Vec<_> = p
            .times
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, (n, d))| (k.clone(), *n, *d))
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.2));
        v
    }
}

/// Frees the ONNX copy of weights that an NHWC Conv holds packed and nothing else reads: the
/// Conv then takes its geometry from the packed filter (`ops::conv`), and the model holds its
/// weights once.
fn drop_packed_weights(
    steps: &mut [Step],
    constants: &mut [Arc<Tensor>],
    outputs: &[(String, Src)],
) {
    let mut readers = vec![0usize; constants.len()];
    let consts = steps
        .iter()
        .flat_map(|s| s.inputs.iter().flatten())
        .chain(outputs.iter().map(|(_, src)| src));
    for src in consts {
        if let Src::Const(i) = src {
            readers[*i] += 1;
        }
    }
    for s in steps {
        for (c, k) in crate::ops::conv::weighted_convs(&mut s.op) {
            let Some(slot) = s.inputs.get_mut(k) else {
                continue;
            };
            if let (Some(_), Some(Src::Const(w))) = (&c.nhwc_filter, *slot)
                && readers[w] == 1
            {
                constants[w] = Arc::new(Tensor::f32(vec![0], Vec::new()).expect("an empty tensor"));
                *slot = None;
            }
        }
    }
}

/// A loaded, optimised model ready to run.
pub struct Model {
    pub plan: Plan,
}

/// What a model is planned for. The CPU keeps chains of convolutions' activations in the layout
/// its kernels read best (NHWC); a GPU computes the ONNX layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Cpu,
    Gpu,
}

impl Model {
    /// Imports, optimises and plans an ONNX file for the CPU.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ImportError> {
        Model::load_for(path, Target::Cpu)
    }
    pub fn load_for(path: impl AsRef<Path>, target: Target) -> Result<Model, ImportError> {
        Model::from_graph_for(crate::import::load(path)?, target)
    }
    /// Imports, optimises and plans ONNX bytes for the CPU.
    pub fn from_bytes(bytes: &[u8]) -> Result<Model, ImportError> {
        Model::from_bytes_for(bytes, Target::Cpu)
    }
    pub fn from_bytes_for(bytes: &[u8], target: Target) -> Result<Model, ImportError> {
        Model::from_graph_for(crate::import::import(bytes, None)?, target)
    }
    pub fn from_graph(g: Graph) -> Result<Model, ImportError> {
        Model::from_graph_for(g, Target::Cpu)
    }
    pub fn from_graph_for(mut g: Graph, target: Target) -> Result<Model, ImportError> {
        match target {
            Target::Cpu => crate::passes::optimize_for_cpu(&mut g),
            Target::Gpu => crate::passes::optimize(&mut g),
        }
        Ok(Model {
            plan: Plan::build(&g)?,
        })
    }
    /// Input dtype by name (tools use it to convert user data).
    pub fn input_dtype(&self, name: &str) -> Option<DType> {
        self.plan
            .inputs
            .iter()
            .find(|i| i.name == name)
            .map(|i| i.dtype)
    }
}
