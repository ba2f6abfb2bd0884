//! The memory plan of one model for one set of input shapes: what every step is on the device
//! (computed on the host from shapes alone, an alias of its input, device work, or a host
//! fallback), and where every value, scratch region and parameter lives in the instance's
//! arena. Built once per input-shape signature by lowering every step with placeholder addresses
//! (a dry run that launches nothing) and packing the values' lifetimes into one buffer.

use super::api::{BufferId, DevPtr};
use super::lower::{self, Decline, Lowering, Operand, Place};
use crate::graph::GraphInput;
use crate::ops::shape::ShapeOp;
use crate::ops::{Cx, Op};
use crate::plan::{Plan, Src};
use crate::tensor::{DType, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// Alignment of every region in the arena (what cuBLAS and coalesced loads like best).
pub const ALIGN: u64 = 256;

/// The buffer id placeholders stand in (dry runs address nothing real).
const PLACEHOLDER: BufferId = BufferId(u32::MAX);

fn align(b: u64) -> u64 {
    b.div_ceil(ALIGN) * ALIGN
}

/// What a step is on the device.
#[derive(Clone, Debug, PartialEq)]
pub enum StepKind {
    /// Every input is known on the host before the batch runs: computed once, here.
    Host,
    /// Its output is its input under another shape: no work.
    Alias,
    /// Kernel launches and SGEMMs.
    Device,
    /// No device path for this case: its inputs come down, it runs on the host, its outputs go
    /// up (an explicit copy pair and a host wait, reported at load).
    Fallback(String),
}

/// Where one value is.
#[derive(Clone, Debug, PartialEq)]
pub enum Home {
    /// A constant of the plan (resident in the shared weights).
    Const(usize),
    /// Known on the host before the batch runs; `param` is its copy in the arena when device
    /// work reads it.
    Host {
        value: Arc<Tensor>,
        param: Option<u64>,
    },
    /// In the arena at `offset`, `bytes` long (at this signature's shapes).
    Arena {
        dtype: DType,
        shape: Vec<usize>,
        offset: u64,
        bytes: u64,
    },
    /// Not computed (an unused optional output).
    None,
}

/// The memory plan for one input-shape signature.
pub struct Layout {
    pub kinds: Vec<StepKind>,
    /// Per plan value.
    pub homes: Vec<Home>,
    /// Per step, its scratch regions (offset, bytes) by index.
    pub scratch: Vec<Vec<(u64, u64)>>,
    /// Per step, its parameters' offsets, in the order the lowering asks for them.
    pub params: Vec<Vec<u64>>,
    /// Bytes to upload into the arena once (parameters and host values device work reads).
    pub uploads: Vec<(u64, Vec<u8>)>,
    /// Arena bytes this signature needs.
    pub arena_bytes: u64,
    /// Most pieces each step can run in.
    pub max_pieces: Vec<usize>,
}

impl Layout {
    /// Steps that fall back to the host, with why.
    pub fn fallbacks<'p>(&self, plan: &'p Plan) -> Vec<(&'p str, String, String)> {
        self.kinds
            .iter()
            .zip(&plan.steps)
            .filter_map(|(k, s)| match k {
                StepKind::Fallback(why) => Some((s.node.as_str(), s.op.name(), why.clone())),
                _ => None,
            })
            .collect()
    }
}

/// Why no layout can be made.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("step {node} ({op}): {why}")]
    Step {
        node: String,
        op: String,
        why: String,
    },
    #[error("input {0:?} is missing")]
    MissingInput(String),
}

/// A dry-run placement: records sizes and hands out placeholder addresses.
#[derive(Default)]
struct Sizing {
    outputs: Vec<u64>,
    scratch: Vec<u64>,
    params: Vec<Vec<u8>>,
}

impl Place for Sizing {
    fn output(&mut self, k: usize, bytes: u64) -> lower::Lowered<DevPtr> {
        if self.outputs.len() <= k {
            self.outputs.resize(k + 1, 0);
        }
        self.outputs[k] = bytes;
        Ok(DevPtr::new(PLACEHOLDER, 0))
    }
    fn scratch(&mut self, index: usize, bytes: u64) -> lower::Lowered<DevPtr> {
        if self.scratch.len() <= index {
            self.scratch.resize(index + 1, 0);
        }
        self.scratch[index] = self.scratch[index].max(bytes);
        Ok(DevPtr::new(PLACEHOLDER, 0))
    }
    fn param(&mut self, data: &[u8]) -> lower::Lowered<DevPtr> {
        self.params.push(data.to_vec());
        Ok(DevPtr::new(PLACEHOLDER, 0))
    }
}

/// Shape and type of a device value while planning.
#[derive(Clone)]
enum Meta {
    Const(usize),
    Host(Arc<Tensor>),
    Dev(DType, Vec<usize>),
    None,
}

/// The output shape of a step whose output is its input relabelled, or None when it is not one.
fn alias_shape(
    op: &Op,
    x: &[usize],
    host: &[Option<&Tensor>],
    outputs: usize,
) -> Option<Vec<usize>> {
    if outputs != 1 {
        return None;
    }
    match op {
        Op::Shape(s) if s.is_reshape() => s.reshape_target(x, host).ok(),
        Op::Dropout | Op::Unary(crate::ops::elementwise::Unary::Identity) => Some(x.to_vec()),
        _ => None,
    }
}

/// Shape and Size of a value known only by its shape.
fn shape_only(op: &Op, x: &[usize]) -> Option<Tensor> {
    match op {
        Op::Shape(ShapeOp::Shape { start, end }) => {
            let r = x.len() as i64;
            let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let (s, e) = (clampi(*start), clampi(end.unwrap_or(r)));
            let dims: Vec<i64> = x[s..e.max(s)].iter().map(|&d| d as i64).collect();
            Tensor::i64(vec![dims.len()], dims).ok()
        }
        Op::Shape(ShapeOp::Size) => {
            Tensor::i64(vec![], vec![x.iter().product::<usize>() as i64]).ok()
        }
        _ => None,
    }
}

/// Refuses a plan that computes with float16 or bfloat16, naming the first step that reads or
/// makes such a value: the device kernels are f32 only (the CPU backend runs these models).
fn refuse_half(plan: &Plan) -> Result<(), LayoutError> {
    let half: std::collections::HashSet<usize> = plan
        .inputs
        .iter()
        .filter(|i| i.dtype.is_half())
        .map(|i| i.value)
        .collect();
    for step in &plan.steps {
        let reads = step.inputs.iter().flatten().find_map(|src| match src {
            Src::Const(c) => plan.constants[*c].dtype().is_half().then_some("reads"),
            Src::Value(v) => half.contains(v).then_some("reads"),
        });
        let makes = match step.op {
            Op::Cast { to, .. } | Op::BitCast { to } if to.is_half() => Some("makes"),
            _ => None,
        };
        if let Some(how) = reads.or(makes) {
            return Err(LayoutError::Step {
                node: step.node.clone(),
                op: step.op.name(),
                why: format!("{how} float16/bfloat16, which the GPU backend does not support"),
            });
        }
    }
    Ok(())
}

/// Builds the layout of `plan` for inputs of these shapes (in `plan.inputs`' order).
pub fn build(plan: &Plan, input_shapes: &[Vec<usize>]) -> Result<Layout, LayoutError> {
    refuse_half(plan)?;
    let n_values = plan.value_count();
    let mut meta: Vec<Meta> = vec![Meta::None; n_values];
    let mut sizes: Vec<u64> = vec![0; n_values];
    // Values sharing one region: an alias points at the value that owns its bytes.
    let mut root: Vec<usize> = (0..n_values).collect();
    for (
        GraphInput {
            value, dtype, name, ..
        },
        shape,
    ) in plan.inputs.iter().zip(input_shapes)
    {
        let _ = name;
        let n: usize = shape.iter().product();
        meta[*value] = Meta::Dev(*dtype, shape.clone());
        sizes[*value] = (n * dtype.size()) as u64;
    }
    if input_shapes.len() != plan.inputs.len() {
        let missing = plan.inputs.get(input_shapes.len()).map(|i| i.name.clone());
        return Err(LayoutError::MissingInput(missing.unwrap_or_default()));
    }
    let mut kinds = Vec::with_capacity(plan.steps.len());
    let mut scratch_sizes: Vec<Vec<u64>> = Vec::with_capacity(plan.steps.len());
    let mut params: Vec<Vec<Vec<u8>>> = Vec::with_capacity(plan.steps.len());
    let mut max_pieces = Vec::with_capacity(plan.steps.len());
    // Host values device work reads: uploaded into the arena.
    let mut host_params: Vec<usize> = Vec::new();
    for step in &plan.steps {
        let err = |why: String| LayoutError::Step {
            node: step.node.clone(),
            op: step.op.name(),
            why,
        };
        let ins: Vec<Option<Meta>> = step
            .inputs
            .iter()
            .map(|i| {
                i.map(|src| match src {
                    Src::Const(c) => Meta::Const(c),
                    Src::Value(v) => meta.get(v).cloned().unwrap_or(Meta::None),
                })
            })
            .collect();
        let host_of = |m: &Meta| -> Option<Arc<Tensor>> {
            match m {
                Meta::Const(c) => plan.constants.get(*c).cloned(),
                Meta::Host(t) => Some(t.clone()),
                _ => None,
            }
        };
        let hosts: Vec<Option<Arc<Tensor>>> =
            ins.iter().map(|m| m.as_ref().and_then(host_of)).collect();
        let all_host = ins
            .iter()
            .zip(&hosts)
            .all(|(m, h)| m.is_none() || h.is_some());
        let first_dev = match ins.first() {
            Some(Some(Meta::Dev(t, s))) => Some((*t, s.clone())),
            _ => None,
        };
        let host_refs: Vec<Option<&Tensor>> = hosts.iter().map(|h| h.as_deref()).collect();
        let (mut step_scratch, mut step_params, mut pieces) = (Vec::new(), Vec::new(), 1);
        let kind = if let Some(t) = first_dev
            .as_ref()
            .and_then(|(_, s)| shape_only(&step.op, s))
        {
            set(&mut meta, step.outputs.first(), Meta::Host(Arc::new(t)));
            StepKind::Host
        } else if all_host {
            let outs = step
                .op
                .eval(&Cx::new(1), &host_refs)
                .map_err(|e| err(e.to_string()))?;
            for (k, t) in outs.into_iter().enumerate() {
                set(&mut meta, step.outputs.get(k), Meta::Host(Arc::new(t)));
            }
            StepKind::Host
        } else if let Some(shape) = first_dev
            .as_ref()
            .and_then(|(_, s)| alias_shape(&step.op, s, &host_refs, step.outputs.len()))
        {
            let (dtype, _) = first_dev.clone().unwrap_or((DType::F32, vec![]));
            if let (Some(&out), Some(Some(Src::Value(x)))) =
                (step.outputs.first(), step.inputs.first())
            {
                root[out] = root[*x];
                meta[out] = Meta::Dev(dtype, shape);
            }
            StepKind::Alias
        } else {
            // Host values that device work would read go into the arena once.
            let operands: Vec<Option<Operand<'_>>> = ins
                .iter()
                .zip(&hosts)
                .map(|(m, h)| match (m, h) {
                    (Some(Meta::Dev(t, s)), _) => Some(Operand {
                        dtype: *t,
                        shape: s,
                        at: Some(DevPtr::new(PLACEHOLDER, 0)),
                        host: None,
                    }),
                    (Some(_), Some(h)) => Some(Operand {
                        dtype: h.dtype(),
                        shape: &h.shape,
                        at: Some(DevPtr::new(PLACEHOLDER, 0)),
                        host: Some(h),
                    }),
                    _ => None,
                })
                .collect();
            let mut sizing = Sizing::default();
            let lowered = if lower::has_device_path(&step.op) {
                lower::lower(&step.op, &operands, step.outputs.len(), 1, &mut sizing)
            } else {
                Err(Decline(format!("{} has no device path", step.op.name())))
            };
            match lowered {
                Ok(Lowering {
                    outputs,
                    max_pieces: mp,
                    ..
                }) => {
                    for (k, o) in outputs.iter().enumerate() {
                        if let Some(&v) = step.outputs.get(k) {
                            meta[v] = Meta::Dev(o.dtype, o.shape.clone());
                            sizes[v] = sizing.outputs.get(k).copied().unwrap_or(0);
                        }
                    }
                    step_scratch = sizing.scratch;
                    step_params = sizing.params;
                    pieces = mp;
                    for (m, i) in ins.iter().zip(&step.inputs) {
                        if let (Some(Meta::Host(_)), Some(Src::Value(v))) = (m, i) {
                            host_params.push(*v);
                        }
                    }
                    StepKind::Device
                }
                Err(Decline(_)) if matches!(step.op, Op::Control(_)) => {
                    // A fallback's outputs are sized by a run on zeros; the branch taken, the
                    // trip count and so the outputs' shapes of control flow depend on the data.
                    return Err(err(format!(
                        "{} has no GPU path: its outputs' shapes depend on the values it \
                         reads; the CPU backend runs this model",
                        step.op.name()
                    )));
                }
                Err(Decline(why)) => {
                    // Outputs' shapes from the host op on zeros of the inputs' shapes.
                    let zeros: Vec<Option<Tensor>> = ins
                        .iter()
                        .zip(&hosts)
                        .map(|(m, h)| match (m, h) {
                            (_, Some(h)) => Some((**h).clone()),
                            (Some(Meta::Dev(t, s)), _) => Tensor::zeros(*t, s.clone()).ok(),
                            _ => None,
                        })
                        .collect();
                    let refs: Vec<Option<&Tensor>> = zeros.iter().map(Option::as_ref).collect();
                    let outs = step
                        .op
                        .eval(&Cx::new(1), &refs)
                        .map_err(|e| err(e.to_string()))?;
                    for (k, t) in outs.iter().enumerate() {
                        if let Some(&v) = step.outputs.get(k) {
                            meta[v] = Meta::Dev(t.dtype(), t.shape.clone());
                            sizes[v] = t.bytes() as u64;
                        }
                    }
                    StepKind::Fallback(why)
                }
            }
        };
        kinds.push(kind);
        scratch_sizes.push(step_scratch);
        params.push(step_params);
        max_pieces.push(pieces);
    }
    pack(
        plan,
        &kinds,
        meta,
        sizes,
        root,
        scratch_sizes,
        params,
        host_params,
        max_pieces,
    )
}

fn set(meta: &mut [Meta], v: Option<&usize>, m: Meta) {
    if let Some(&v) = v
        && let Some(slot) = meta.get_mut(v)
    {
        *slot = m;
    }
}

/// Packs the arena: every device value from the step that makes it to its last reader (inputs
/// from the start, outputs to the end), every scratch region for its step, greedily by size.
#[allow(clippy::too_many_arguments)]
fn pack(
    plan: &Plan,
    kinds: &[StepKind],
    meta: Vec<Meta>,
    sizes: Vec<u64>,
    root: Vec<usize>,
    scratch_sizes: Vec<Vec<u64>>,
    params: Vec<Vec<Vec<u8>>>,
    host_params: Vec<usize>,
    max_pieces: Vec<usize>,
) -> Result<Layout, LayoutError> {
    let end = plan.steps.len();
    let n = meta.len();
    // Lifetimes of root values: [first, last] step indices.
    let mut first = vec![usize::MAX; n];
    let mut last = vec![0usize; n];
    let touch = |v: usize, at: usize, first: &mut Vec<usize>, last: &mut Vec<usize>| {
        let r = root[v];
        first[r] = first[r].min(at);
        last[r] = last[r].max(at);
    };
    for i in &plan.inputs {
        touch(i.value, 0, &mut first, &mut last);
    }
    for (si, s) in plan.steps.iter().enumerate() {
        for &o in &s.outputs {
            touch(o, si, &mut first, &mut last);
        }
        for src in s.inputs.iter().flatten() {
            if let Src::Value(v) = src {
                touch(*v, si, &mut first, &mut last);
            }
        }
    }
    for (_, src) in &plan.outputs {
        if let Src::Value(v) = src {
            touch(*v, end, &mut first, &mut last);
        }
    }
    // Regions to place: (bytes, first, last, what).
    #[derive(Clone, Copy)]
    enum Region {
        Value(usize),
        Scratch(usize, usize),
    }
    let mut regions: Vec<(u64, usize, usize, Region)> = Vec::new();
    for v in 0..n {
        if root[v] == v && matches!(meta[v], Meta::Dev(..)) && first[v] != usize::MAX {
            regions.push((align(sizes[v].max(1)), first[v], last[v], Region::Value(v)));
        }
    }
    for (si, sc) in scratch_sizes.iter().enumerate() {
        for (k, &b) in sc.iter().enumerate() {
            if b > 0 {
                regions.push((align(b), si, si, Region::Scratch(si, k)));
            }
        }
    }
    regions.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut placed: Vec<(u64, u64, usize, usize)> = Vec::new();
    let mut value_off = vec![0u64; n];
    let mut scratch: Vec<Vec<(u64, u64)>> = scratch_sizes
        .iter()
        .map(|s| vec![(0, 0); s.len()])
        .collect();
    let mut top = 0u64;
    for (bytes, f, l, what) in regions {
        // The lowest offset clear of every placed region whose lifetime overlaps.
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&(_, _, pf, pl)| pf <= l && f <= pl)
            .map(|&(o, b, _, _)| (o, o + b))
            .collect();
        busy.sort_unstable();
        let mut at = 0u64;
        for (s, e) in busy {
            if at + bytes <= s {
                break;
            }
            at = at.max(e);
        }
        placed.push((at, bytes, f, l));
        top = top.max(at + bytes);
        match what {
            Region::Value(v) => value_off[v] = at,
            Region::Scratch(si, k) => scratch[si][k] = (at, bytes),
        }
    }
    // Parameters and host values device work reads live after the activations, for good.
    let mut uploads = Vec::new();
    let mut param_offs = Vec::with_capacity(params.len());
    for p in params {
        let mut offs = Vec::with_capacity(p.len());
        for data in p {
            offs.push(top);
            top += align(data.len().max(1) as u64);
            uploads.push((offs[offs.len() - 1], data));
        }
        param_offs.push(offs);
    }
    let mut host_param_off: HashMap<usize, u64> = HashMap::new();
    for v in host_params {
        if host_param_off.contains_key(&v) {
            continue;
        }
        if let Meta::Host(t) = &meta[v] {
            let data = crate::tensor_proto::to_le_bytes(&t.data);
            host_param_off.insert(v, top);
            top += align(data.len().max(1) as u64);
            uploads.push((host_param_off[&v], data));
        }
    }
    let homes = (0..n)
        .map(|v| match &meta[v] {
            Meta::Const(c) => Home::Const(*c),
            Meta::Host(t) => Home::Host {
                value: t.clone(),
                param: host_param_off.get(&v).copied(),
            },
            Meta::Dev(dtype, shape) => Home::Arena {
                dtype: *dtype,
                shape: shape.clone(),
                offset: value_off[root[v]],
                bytes: sizes[root[v]],
            },
            Meta::None => Home::None,
        })
        .collect();
    Ok(Layout {
        kinds: kinds.to_vec(),
        homes,
        scratch,
        params: param_offs,
        uploads,
        arena_bytes: top.max(ALIGN),
        max_pieces,
    })
}
