//! Control flow: If, Loop and Scan. Each runs subgraphs ([`Body`]), imported at load into plans
//! of their own (`import::subgraph`). A body's inputs are its declared ones, then the outer
//! values it reads by name (its implicit inputs), which the node reads as extra inputs after its
//! own.
//!
//! Every run is bounded: a Loop or Scan runs at most [`MAX_ITERATIONS`] iterations, the
//! outputs it stacks hold at most [`MAX_ELEMENTS`] elements, every body step is sized
//! (`ops::size`) before it runs, and bodies nest at most `import::subgraph::MAX_DEPTH` deep.
//! Under a memory budget (`Plan::set_memory_budget` hands it to the bodies), a body's values
//! and a loop's stacked outputs are held against it as the outer plan's values are.

use super::{Cx, input, opt_input};
use crate::error::{OpError, OpResult, RunError};
use crate::memory::{Ledger, MemoryBudget};
use crate::plan::{Plan, Src, Step};
use crate::tensor::{DType, Data, MAX_ELEMENTS, Tensor, norm_axis};
use std::borrow::Cow;
use std::sync::{Arc, Mutex};

/// Most iterations one Loop or Scan node runs in one evaluation.
pub const MAX_ITERATIONS: usize = 1 << 20;

/// A subgraph ready to run.
pub struct Body {
    pub plan: Plan,
    /// How many inputs the body declares (the rest of `plan.inputs` are its implicit inputs).
    pub formal: usize,
    /// For each implicit input, the index of the node input that feeds it.
    pub implicit: Vec<usize>,
    /// The element type each output declares, where it does (the type of an empty stack).
    pub output_dtypes: Vec<Option<DType>>,
    /// The outer plan's memory budget, once it has one.
    budget: Mutex<Option<Arc<MemoryBudget>>>,
}

impl Body {
    pub fn new(
        plan: Plan,
        formal: usize,
        implicit: Vec<usize>,
        output_dtypes: Vec<Option<DType>>,
    ) -> Body {
        Body {
            plan,
            formal,
            implicit,
            output_dtypes,
            budget: Mutex::new(None),
        }
    }

    /// Holds this body's runs, and those of the bodies inside it, to `budget`.
    pub fn set_memory_budget(&self, budget: &Arc<MemoryBudget>) {
        *self.budget.lock().unwrap_or_else(|e| e.into_inner()) = Some(budget.clone());
        for s in &self.plan.steps {
            if let super::Op::Control(c) = &s.op {
                c.set_memory_budget(budget);
            }
        }
    }

    fn budget(&self) -> Option<Arc<MemoryBudget>> {
        self.budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn outputs(&self) -> usize {
        self.plan.outputs.len()
    }

    /// Runs the body on its declared inputs `formal`; its implicit inputs come from the node's
    /// inputs `outer`.
    pub fn run<'t>(
        &self,
        cx: &Cx,
        formal: Vec<Cow<'t, Tensor>>,
        outer: &[Option<&'t Tensor>],
    ) -> OpResult<Vec<Tensor>> {
        if formal.len() != self.formal {
            return Err(OpError::Shape(format!(
                "the body declares {} inputs, {} given",
                self.formal,
                formal.len()
            )));
        }
        let budget = self.budget();
        let mut ledger = Ledger::new(budget.as_deref());
        let mut values: Vec<Option<Cow<'t, Tensor>>> = vec![None; self.plan.value_count()];
        for (decl, t) in self.plan.inputs.iter().zip(formal) {
            if let Cow::Owned(t) = &t {
                ledger
                    .take(t.bytes(), &decl.name, "body input")
                    .map_err(over_budget)?;
            }
            values[decl.value] = Some(t);
        }
        for (decl, &k) in self.plan.inputs[self.formal..].iter().zip(&self.implicit) {
            let t = outer
                .get(k)
                .copied()
                .flatten()
                .ok_or(OpError::MissingInput(k))?;
            values[decl.value] = Some(Cow::Borrowed(t));
        }
        for s in &self.plan.steps {
            let outs = {
                let mut refs: Vec<Option<&Tensor>> = Vec::with_capacity(s.inputs.len());
                for (k, i) in s.inputs.iter().enumerate() {
                    refs.push(match i {
                        None => None,
                        Some(Src::Const(c)) => Some(&*self.plan.constants[*c]),
                        Some(Src::Value(v)) => Some(
                            values[*v]
                                .as_deref()
                                .ok_or_else(|| in_step(s, OpError::MissingInput(k)))?,
                        ),
                    });
                }
                // What the step will allocate, refused past the executor's limits or the
                // budget before it is.
                let op = s.op.name();
                let reserve = super::size::allocation(&s.op, &refs)
                    .map_err(|e| in_step(s, e))?
                    .unwrap_or(0);
                ledger.take(reserve, &s.node, &op).map_err(over_budget)?;
                let outs = s.op.eval(cx, &refs).map_err(|e| in_step(s, e));
                ledger.give(reserve);
                outs?
            };
            let made = outs.iter().take(s.outputs.len()).map(Tensor::bytes).sum();
            ledger
                .take(made, &s.node, &s.op.name())
                .map_err(over_budget)?;
            for (k, t) in outs.into_iter().enumerate() {
                if let Some(&o) = s.outputs.get(k) {
                    values[o] = Some(Cow::Owned(t));
                }
            }
            for &f in &s.frees {
                if let Some(Cow::Owned(t)) = values[f].take() {
                    ledger.give(t.bytes());
                }
            }
        }
        let outs = &self.plan.outputs;
        let mut result = Vec::with_capacity(outs.len());
        for (i, (name, src)) in outs.iter().enumerate() {
            result.push(match src {
                Src::Const(c) => (*self.plan.constants[*c]).clone(),
                Src::Value(v) => {
                    let again = outs[i + 1..].iter().any(|(_, s)| s == src);
                    let slot = if again {
                        values[*v].clone()
                    } else {
                        values[*v].take()
                    };
                    slot.ok_or_else(|| {
                        OpError::Shape(format!("body output {name:?} was not computed"))
                    })?
                    .into_owned()
                }
            });
        }
        Ok(result)
    }
}

/// A body's run past its plan's memory budget, as an op error.
fn over_budget(e: RunError) -> OpError {
    match e {
        RunError::Node { source, .. } => source,
        e => OpError::Device(e.to_string()),
    }
}

/// An error of a body's step, naming the step.
fn in_step(s: &Step, e: OpError) -> OpError {
    let at = |m: String| format!("body node {:?} ({}): {m}", s.node, s.op.name());
    match e {
        OpError::Shape(m) => OpError::Shape(at(m)),
        OpError::DType(m) => OpError::DType(at(m)),
        OpError::Unsupported(m) => OpError::Unsupported(at(m)),
        OpError::Device(m) => OpError::Device(at(m)),
        OpError::MissingInput(k) => OpError::Shape(at(format!("input {k} is missing"))),
        e @ OpError::TooLarge(_) => e,
    }
}

/// A shared body; equal only to itself.
#[derive(Clone)]
pub struct Subgraph(pub Arc<Body>);

impl std::fmt::Debug for Subgraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Subgraph({} steps, {} outputs)",
            self.0.plan.steps.len(),
            self.0.outputs()
        )
    }
}

impl PartialEq for Subgraph {
    fn eq(&self, other: &Subgraph) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Scan's attributes, checked against its node at import.
#[derive(Clone, Debug, PartialEq)]
pub struct ScanAttrs {
    /// State variables (N) and scanned inputs (M).
    pub states: usize,
    pub scans: usize,
    pub input_axes: Vec<i64>,
    pub input_reverse: Vec<bool>,
    pub output_axes: Vec<i64>,
    pub output_reverse: Vec<bool>,
    /// Opset 8: input 0 is `sequence_lens`, and every other input has a batch axis first.
    pub batched: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ControlOp {
    If {
        then_branch: Subgraph,
        else_branch: Subgraph,
    },
    /// Inputs: trip count, condition, then the loop-carried values.
    Loop {
        body: Subgraph,
    },
    Scan {
        body: Subgraph,
        attrs: ScanAttrs,
    },
}

impl ControlOp {
    pub fn name(&self) -> &'static str {
        match self {
            ControlOp::If { .. } => "If",
            ControlOp::Loop { .. } => "Loop",
            ControlOp::Scan { .. } => "Scan",
        }
    }

    /// Holds the runs of this node's bodies to `budget`.
    pub fn set_memory_budget(&self, budget: &Arc<MemoryBudget>) {
        match self {
            ControlOp::If {
                then_branch,
                else_branch,
            } => {
                then_branch.0.set_memory_budget(budget);
                else_branch.0.set_memory_budget(budget);
            }
            ControlOp::Loop { body } | ControlOp::Scan { body, .. } => {
                body.0.set_memory_budget(budget)
            }
        }
    }

    pub fn eval(&self, cx: &Cx, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        match self {
            ControlOp::If {
                then_branch,
                else_branch,
            } => {
                let branch = if truth(input(inputs, 0)?, "the condition")? {
                    then_branch
                } else {
                    else_branch
                };
                branch.0.run(cx, vec![], inputs)
            }
            ControlOp::Loop { body } => run_loop(&body.0, cx, inputs),
            ControlOp::Scan { body, attrs } => scan(&body.0, attrs, cx, inputs),
        }
    }
}

/// The value of a one-element tensor read as a condition.
fn truth(t: &Tensor, what: &str) -> OpResult<bool> {
    match &t.data {
        Data::Bool(v) if v.len() == 1 => Ok(v[0]),
        _ if t.len() == 1 => Ok(t.to_f64_vec()[0] != 0.0),
        _ => Err(OpError::Shape(format!(
            "{what} must have one element, has shape {:?}",
            t.shape
        ))),
    }
}

fn run_loop(body: &Body, cx: &Cx, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
    let carried_n = body.formal.saturating_sub(2);
    let trip = match opt_input(inputs, 0) {
        Some(t) if t.len() == 1 => Some(match &t.data {
            Data::I64(v) => v[0],
            _ => t.to_f64_vec()[0] as i64,
        }),
        Some(t) => {
            return Err(OpError::Shape(format!(
                "the trip count must have one element, has shape {:?}",
                t.shape
            )));
        }
        None => None,
    };
    // As in onnxruntime, the body's condition output is read whether or not the node has a
    // condition input.
    let mut cond = match opt_input(inputs, 1) {
        Some(t) => truth(t, "the condition")?,
        None => true,
    };
    let mut carried: Vec<Cow<Tensor>> = (0..carried_n)
        .map(|k| input(inputs, 2 + k).map(Cow::Borrowed))
        .collect::<OpResult<_>>()?;
    let scans_n = body.outputs().saturating_sub(1 + carried_n);
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); scans_n];
    let mut stacked = 0usize;
    let budget = body.budget();
    let mut held = Ledger::new(budget.as_deref());
    let mut i: i64 = 0;
    while cond && trip.is_none_or(|m| i < m) {
        if i as usize >= MAX_ITERATIONS {
            return Err(OpError::Unsupported(format!(
                "the Loop did not stop within the {MAX_ITERATIONS} iterations it may run"
            )));
        }
        let mut formal = vec![
            Cow::Owned(Tensor::i64(vec![], vec![i])?),
            Cow::Owned(Tensor::new(vec![], Data::Bool(vec![cond]))?),
        ];
        formal.append(&mut carried);
        let mut outs = body.run(cx, formal, inputs)?.into_iter();
        let c = outs
            .next()
            .ok_or_else(|| OpError::Shape("the body computes no condition".into()))?;
        cond = truth(&c, "the body's condition")?;
        carried = outs.by_ref().take(carried_n).map(Cow::Owned).collect();
        for (k, t) in outs.enumerate() {
            stacked = stacked.saturating_add(t.len());
            if stacked > MAX_ELEMENTS {
                return Err(OpError::TooLarge(stacked));
            }
            held.take(t.bytes(), "Loop", "scan output")
                .map_err(over_budget)?;
            if let Some(s) = scans.get_mut(k) {
                s.push(t);
            }
        }
        i += 1;
    }
    let mut result: Vec<Tensor> = carried.into_iter().map(Cow::into_owned).collect();
    for (k, parts) in scans.into_iter().enumerate() {
        let dtype = body.output_dtypes.get(1 + carried_n + k).copied().flatten();
        result.push(stack(parts, dtype)?);
    }
    Ok(result)
}

/// `parts`, of one shape, stacked along a new first axis; an empty list is an empty vector of
/// `dtype` (f32 where the body declares none).
fn stack(parts: Vec<Tensor>, dtype: Option<DType>) -> OpResult<Tensor> {
    let Some(first) = parts.first() else {
        return Tensor::zeros(dtype.unwrap_or(DType::F32), vec![0]);
    };
    let mut shape = vec![parts.len()];
    shape.extend(&first.shape);
    let mut data = Data::with_capacity(first.dtype(), first.len() * parts.len());
    for t in &parts {
        if t.shape != first.shape || !data.extend_from(&t.data, 0..t.len()) {
            return Err(OpError::Shape(format!(
                "iterations produce {:?} {:?} and {:?} {:?}: they do not stack",
                first.dtype(),
                first.shape,
                t.dtype(),
                t.shape
            )));
        }
    }
    Tensor::new(shape, data)
}

/// The slice of `t` at `index` along `axis`, without that axis.
fn slice_at(t: &Tensor, axis: usize, index: usize) -> OpResult<Tensor> {
    let len = t.shape[axis];
    let inner: usize = t.shape[axis + 1..].iter().product();
    let outer: usize = t.shape[..axis].iter().product();
    let mut data = Data::with_capacity(t.dtype(), outer * inner);
    for o in 0..outer {
        let at = (o * len + index) * inner;
        data.extend_from(&t.data, at..at + inner);
    }
    let mut shape = t.shape.clone();
    shape.remove(axis);
    Tensor::new(shape, data)
}

fn scan(body: &Body, a: &ScanAttrs, cx: &Cx, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
    let first = usize::from(a.batched);
    let states: Vec<&Tensor> = (first..first + a.states)
        .map(|k| input(inputs, k))
        .collect::<OpResult<_>>()?;
    let scanned: Vec<&Tensor> = (first + a.states..first + a.states + a.scans)
        .map(|k| input(inputs, k))
        .collect::<OpResult<_>>()?;
    if !a.batched {
        let states = states.into_iter().map(Cow::Borrowed).collect();
        return scan_once(body, a, cx, states, &scanned, inputs);
    }
    // Opset 8: every sample of the batch is scanned on its own, along its first axis.
    let batch = states
        .iter()
        .chain(&scanned)
        .map(|t| t.shape.first().copied())
        .next()
        .flatten()
        .ok_or_else(|| OpError::Shape("Scan's inputs have no batch axis".into()))?;
    if let Some(lens) = opt_input(inputs, 0) {
        let full = scanned.first().and_then(|t| t.shape.get(1)).copied();
        if lens.to_f64_vec().iter().any(|&l| Some(l as usize) != full) {
            return Err(OpError::Unsupported(
                "Scan with sequence_lens shorter than the sequence axis".into(),
            ));
        }
    }
    let mut per_sample: Vec<Vec<Tensor>> = Vec::with_capacity(batch);
    for b in 0..batch {
        let pick = |t: &Tensor| -> OpResult<Tensor> {
            if t.shape.first() != Some(&batch) {
                return Err(OpError::Shape(format!(
                    "Scan input of shape {:?} does not have the batch of {batch} first",
                    t.shape
                )));
            }
            slice_at(t, 0, b)
        };
        let st = states
            .iter()
            .map(|t| pick(t).map(Cow::Owned))
            .collect::<OpResult<Vec<_>>>()?;
        let sc = scanned
            .iter()
            .map(|t| pick(t))
            .collect::<OpResult<Vec<_>>>()?;
        let sc: Vec<&Tensor> = sc.iter().collect();
        per_sample.push(scan_once(body, a, cx, st, &sc, inputs)?);
    }
    let outputs = per_sample.first().map_or(0, Vec::len);
    let mut columns: Vec<Vec<Tensor>> = vec![Vec::with_capacity(batch); outputs];
    for sample in per_sample {
        for (k, t) in sample.into_iter().enumerate() {
            columns[k].push(t);
        }
    }
    columns
        .into_iter()
        .enumerate()
        .map(|(k, c)| stack(c, body.output_dtypes.get(k).copied().flatten()))
        .collect()
}

/// One scan over the sequence axis of `scanned` (opset 9 on).
fn scan_once<'t>(
    body: &Body,
    a: &ScanAttrs,
    cx: &Cx,
    mut states: Vec<Cow<'t, Tensor>>,
    scanned: &[&Tensor],
    outer: &[Option<&'t Tensor>],
) -> OpResult<Vec<Tensor>> {
    let mut axes = Vec::with_capacity(scanned.len());
    let mut len = None;
    for (j, t) in scanned.iter().enumerate() {
        let axis = norm_axis(a.input_axes.get(j).copied().unwrap_or(0), t.rank())?;
        let n = *t.shape.get(axis).ok_or_else(|| {
            OpError::Shape(format!("a scalar (input {j}) has no axis to scan along"))
        })?;
        if len.is_some_and(|l| l != n) {
            return Err(OpError::Shape(format!(
                "scanned inputs have sequences of {} and {n}",
                len.unwrap_or(0)
            )));
        }
        len = Some(n);
        axes.push(axis);
    }
    let len = len.unwrap_or(0);
    if len > MAX_ITERATIONS {
        return Err(OpError::Unsupported(format!(
            "a sequence of {len} is more than the {MAX_ITERATIONS} iterations a Scan may run"
        )));
    }
    let outs_n = body.outputs().saturating_sub(a.states);
    let mut parts: Vec<Vec<Tensor>> = vec![Vec::with_capacity(len); outs_n];
    let mut stacked = 0usize;
    let budget = body.budget();
    let mut held = Ledger::new(budget.as_deref());
    for step in 0..len {
        let mut formal = std::mem::take(&mut states);
        for (j, t) in scanned.iter().enumerate() {
            let at = if a.input_reverse.get(j) == Some(&true) {
                len - 1 - step
            } else {
                step
            };
            formal.push(Cow::Owned(slice_at(t, axes[j], at)?));
        }
        let mut outs = body.run(cx, formal, outer)?.into_iter();
        states = outs.by_ref().take(a.states).map(Cow::Owned).collect();
        for (k, t) in outs.enumerate() {
            stacked = stacked.saturating_add(t.len());
            if stacked > MAX_ELEMENTS {
                return Err(OpError::TooLarge(stacked));
            }
            held.take(t.bytes(), "Scan", "scan output")
                .map_err(over_budget)?;
            parts[k].push(t);
        }
    }
    let mut result: Vec<Tensor> = states.into_iter().map(Cow::into_owned).collect();
    for (k, mut p) in parts.into_iter().enumerate() {
        if a.output_reverse.get(k) == Some(&true) {
            p.reverse();
        }
        let dtype = body.output_dtypes.get(a.states + k).copied().flatten();
        let t = stack(p, dtype)?;
        let axis = norm_axis(a.output_axes.get(k).copied().unwrap_or(0), t.rank())?;
        result.push(if axis == 0 {
            t
        } else {
            // The stacking axis moves to `axis`.
            let mut perm: Vec<usize> = (1..t.rank()).collect();
            perm.insert(axis, 0);
            let op = super::Op::Shape(super::shape::ShapeOp::Transpose { perm: Some(perm) });
            op.eval(cx, &[Some(&t)])?.remove(0)
        });
    }
    Ok(result)
}
