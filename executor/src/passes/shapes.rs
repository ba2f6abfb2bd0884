//! Shape subgraphs folded under symbolic dimensions. PyTorch exports compute reshape targets at
//! run time (`Shape → Gather → Unsqueeze → Concat → Reshape`); with a symbolic batch the whole
//! chain cannot be folded, but every part that does not depend on a symbol can. This pass infers
//! each value's shape with symbols kept as names, tracks the element values of small integer
//! shape tensors the same way, and turns every such tensor whose elements are all known into a
//! constant; constant folding and dead-node removal then take away what fed it.
//!
//! Inference covers the ops that sit between a model's inputs and its `Shape` nodes in CNN and
//! transformer exports; any other op gives outputs of unknown shape, which only means less is
//! folded.

use crate::graph::{Dim, Graph, ValueId};
use crate::ops::Op;
use crate::ops::elementwise::Binary;
use crate::ops::index::IndexOp;
use crate::ops::quant::QuantOp;
use crate::ops::shape::ShapeOp;
use crate::tensor::{DType, Data, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// A dimension, or an element of a shape tensor, as far as it is known before run time.
#[derive(Clone, Debug, PartialEq)]
enum Sym {
    Known(i64),
    /// Equal to the named symbolic input dimension.
    Named(String),
    Unknown,
}

/// Most elements tracked for one shape tensor: shapes are short, and a Concat naming one
/// vector a million times must not make a million-element copy per node.
const MAX_TRACKED: usize = 64;

/// What is known about a value nothing is known about.
static UNKNOWN: Known = Known {
    shape: None,
    elements: None,
    int32: false,
};

/// What is known about one value.
#[derive(Clone, Debug, Default)]
struct Known {
    /// Its shape, when its rank is known.
    shape: Option<Vec<Sym>>,
    /// Its elements, for an int64 or int32 scalar or vector computed from shapes.
    elements: Option<Vec<Sym>>,
    /// Whether those elements are int32's (tf2onnx and jax2tf work shapes in int32).
    int32: bool,
}

/// Infers shapes and shape-tensor values, then replaces every fully known shape tensor that a
/// node computes with a constant. Returns how many values became constants.
pub fn fold_shapes(g: &mut Graph) -> usize {
    let known = infer(g);
    let mut folded = 0;
    for node in &g.nodes {
        for &out in &node.outputs {
            let Some(info) = known.get(&out) else {
                continue;
            };
            let (Some(elements), Some(shape)) = (&info.elements, &info.shape) else {
                continue;
            };
            let values: Option<Vec<i64>> = elements
                .iter()
                .map(|e| match e {
                    Sym::Known(v) => Some(*v),
                    _ => None,
                })
                .collect();
            // The constant has the value's own type: an int64 one in place of an int32 would
            // meet int32 values in the ops reading it.
            let data = values.and_then(|v| match info.int32 {
                true => v
                    .into_iter()
                    .map(|x| i32::try_from(x).ok())
                    .collect::<Option<_>>()
                    .map(Data::I32),
                false => Some(Data::I64(v)),
            });
            let dims: Vec<usize> = shape.iter().filter_map(as_fixed).collect();
            if let Some(data) = data
                && dims.len() == shape.len()
                && let Ok(t) = Tensor::new(dims, data)
            {
                g.constants.insert(out, Arc::new(t));
                folded += 1;
            }
        }
    }
    // Nodes whose every output is now a constant are gone.
    g.nodes
        .retain(|n| !n.outputs.iter().all(|o| g.constants.contains_key(o)));
    folded
}

fn as_fixed(s: &Sym) -> Option<usize> {
    match s {
        Sym::Known(v) => usize::try_from(*v).ok(),
        _ => None,
    }
}

/// The ranks shape inference proves, by value.
pub(crate) fn known_ranks(g: &Graph) -> HashMap<ValueId, usize> {
    infer(g)
        .into_iter()
        .filter_map(|(v, k)| Some((v, k.shape?.len())))
        .collect()
}

fn infer(g: &Graph) -> HashMap<ValueId, Known> {
    let mut known: HashMap<ValueId, Known> = HashMap::new();
    for input in &g.inputs {
        let shape = input.dims.as_ref().map(|dims| {
            dims.iter()
                .map(|d| match d {
                    Dim::Fixed(n) => Sym::Known(*n as i64),
                    Dim::Symbol(s) => Sym::Named(s.clone()),
                })
                .collect()
        });
        known.insert(input.value, shape_only(shape));
    }
    for (&v, t) in &g.constants {
        let known_ints = |values: Vec<i64>| Some(values.into_iter().map(Sym::Known).collect());
        let elements = match (&t.data, t.rank()) {
            (Data::I64(_) | Data::I32(_), 0 | 1) if t.len() <= MAX_TRACKED => {
                t.to_i64_vec().ok().and_then(known_ints)
            }
            _ => None,
        };
        let shape = Some(t.shape.iter().map(|&d| Sym::Known(d as i64)).collect());
        let int32 = matches!(t.data, Data::I32(_));
        known.insert(
            v,
            Known {
                shape,
                elements,
                int32,
            },
        );
    }
    for node in &g.nodes {
        // Borrowed: a node may name one value very many times.
        let ins: Vec<&Known> = node
            .inputs
            .iter()
            .map(|i| i.and_then(|v| known.get(&v)).unwrap_or(&UNKNOWN))
            .collect();
        let consts: Vec<Option<&Tensor>> = node
            .inputs
            .iter()
            .map(|i| i.and_then(|v| g.constants.get(&v).map(|t| &**t)))
            .collect();
        let mut outs = infer_node(&node.op, &ins, &consts, node.outputs.len());
        // Elements are of the type a Cast gives, int64 from Shape, else that of the input
        // they come from (all of an op's integer inputs have one type).
        let int32 = match &node.op {
            Op::Cast { to, .. } => *to == DType::I32,
            Op::Shape(ShapeOp::Shape { .. }) => false,
            _ => ins.first().is_some_and(|k| k.int32),
        };
        for (o, mut k) in node.outputs.iter().zip(outs.drain(..)) {
            k.int32 = int32 && k.elements.is_some();
            known.insert(*o, k);
        }
    }
    known
}

/// The shape a reduction of `x` leaves: its reduced axes 1 (kept) or gone; the axes come from
/// the attribute or the constant second input.
fn reduced(
    r: &crate::ops::reduce::ReduceAttrs,
    x: Option<&Vec<Sym>>,
    axes: Option<&Tensor>,
) -> Option<Vec<Sym>> {
    let x = x?;
    let Some(gone) = crate::ops::reduce::reduced_axes(r, x.len(), axes).ok()? else {
        return Some(x.clone());
    };
    let kept = x.iter().zip(&gone);
    Some(match r.keepdims {
        true => kept
            .map(|(d, &g)| if g { Sym::Known(1) } else { d.clone() })
            .collect(),
        false => kept.filter(|(_, g)| !**g).map(|(d, _)| d.clone()).collect(),
    })
}

fn shape_of<'a>(ins: &[&'a Known], i: usize) -> Option<&'a Vec<Sym>> {
    ins.get(i).and_then(|k| k.shape.as_ref())
}

fn elements_of<'a>(ins: &[&'a Known], i: usize) -> Option<&'a Vec<Sym>> {
    ins.get(i).and_then(|k| k.elements.as_ref())
}

/// Input `i` as a shape (Reshape's or Expand's target): its values where they are known, else
/// as many unknown sizes as it has elements, which still gives the rank.
fn shape_vector(ins: &[&Known], i: usize) -> Option<Vec<Sym>> {
    elements_of(ins, i).cloned().or_else(|| {
        let &[Sym::Known(len)] = shape_of(ins, i)?.as_slice() else {
            return None;
        };
        Some(vec![
            Sym::Unknown;
            usize::try_from(len)
                .ok()
                .filter(|&n| n <= MAX_TRACKED)?
        ])
    })
}

fn shape_only(shape: Option<Vec<Sym>>) -> Known {
    Known {
        shape,
        ..Known::default()
    }
}

/// Normalizes a possibly negative axis against `rank`.
fn axis(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

fn infer_node(op: &Op, ins: &[&Known], consts: &[Option<&Tensor>], n_out: usize) -> Vec<Known> {
    let same = || vec![shape_only(shape_of(ins, 0).cloned())];
    let unknown = || vec![Known::default(); n_out];
    let mut out = match op {
        Op::Unary(_)
        | Op::Clip { .. }
        | Op::BatchNorm { .. }
        | Op::Softmax { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Dropout
        | Op::Lrn { .. }
        | Op::PRelu
        | Op::CumSum { .. }
        | Op::CumProd { .. }
        | Op::LpNorm { .. }
        | Op::MeanVarianceNorm { .. }
        | Op::CastLike(_)
        | Op::BitCast { .. }
        | Op::GroupNorm { .. }
        | Op::Index(
            IndexOp::ScatterElements { .. }
            | IndexOp::ScatterNd { .. }
            | IndexOp::Hardmax { .. }
            | IndexOp::ReverseSequence { .. },
        )
        | Op::Shape(ShapeOp::Trilu { .. } | ShapeOp::EyeLike { .. }) => same(),
        Op::Cast { to, .. } => {
            let mut k = shape_only(shape_of(ins, 0).cloned());
            // Sizes keep their values through int64, and int32 where they fit (tf2onnx and
            // jax2tf work shapes in int32).
            let fits = |e: &Vec<Sym>| match to {
                DType::I64 => true,
                DType::I32 => e.iter().all(|s| match s {
                    Sym::Known(v) => i32::try_from(*v).is_ok(),
                    _ => true,
                }),
                _ => false,
            };
            k.elements = elements_of(ins, 0).filter(|e| fits(e)).cloned();
            vec![k]
        }
        Op::Binary(_) | Op::Variadic(..) | Op::Where => {
            let shapes: Option<Vec<&Vec<Sym>>> = (0..ins.len()).map(|i| shape_of(ins, i)).collect();
            let mut k = shape_only(shapes.and_then(|s| broadcast_all(&s)));
            if let Op::Binary(b) = op {
                k.elements = arithmetic(*b, elements_of(ins, 0), elements_of(ins, 1));
            }
            vec![k]
        }
        Op::MatMul {
            packed: Some(f), ..
        } => {
            let [n, k, ..] = f.shape().map(|d| Sym::Known(d as i64));
            vec![shape_only(matmul(shape_of(ins, 0), Some(&vec![k, n])))]
        }
        Op::MatMul { .. } => vec![shape_only(matmul(shape_of(ins, 0), shape_of(ins, 1)))],
        // The integer products and (de)quantization: dynamically quantized models' float
        // values pass through them between every layer.
        Op::Quant(QuantOp::PackedMatMul(p)) => {
            let [k, n] = p.shape.map(|d| Sym::Known(d as i64));
            vec![shape_only(matmul(shape_of(ins, 0), Some(&vec![k, n])))]
        }
        Op::Quant(QuantOp::MatMulInteger) => {
            vec![shape_only(matmul(shape_of(ins, 0), shape_of(ins, 1)))]
        }
        Op::Quant(QuantOp::QLinearMatMul) => {
            vec![shape_only(matmul(shape_of(ins, 0), shape_of(ins, 3)))]
        }
        Op::Quant(QuantOp::Quantize(_) | QuantOp::Dequantize(_)) => same(),
        Op::Shape(ShapeOp::Range) => vec![shape_only(Some(vec![Sym::Unknown]))],
        // The shape is the input's values, or as many unknown sizes as it has.
        Op::Shape(ShapeOp::ConstantOfShape { .. }) => {
            let shape =
                elements_of(ins, 0)
                    .cloned()
                    .or_else(|| match shape_of(ins, 0)?.as_slice() {
                        [Sym::Known(n)] => Some(vec![Sym::Unknown; usize::try_from(*n).ok()?]),
                        _ => None,
                    });
            vec![shape_only(shape)]
        }
        Op::Reduce(r) => vec![shape_only(reduced(
            r,
            shape_of(ins, 0),
            consts.get(1).copied().flatten(),
        ))],
        Op::Quant(QuantOp::DynamicQuantize) => {
            let mut out = same();
            out.extend([shape_only(Some(vec![])), shape_only(Some(vec![]))]);
            out
        }
        Op::Gemm(a) => {
            let dim = |i: usize, trans: bool, row: bool| {
                shape_of(ins, i)
                    .filter(|s| s.len() == 2)
                    .map(|s| s[usize::from(trans == row)].clone())
            };
            let shape = dim(0, a.trans_a, true).zip(dim(1, a.trans_b, false));
            vec![shape_only(shape.map(|(m, n)| vec![m, n]))]
        }
        Op::Conv(_) | Op::PointwiseDepthwise(_) => {
            // A fused pair's output channels are the depthwise weight's (input 3), a fused block's
            // the projection weight's (input 5).
            let w_at = match op {
                Op::PointwiseDepthwise(f) if f.project.is_some() => 5,
                Op::PointwiseDepthwise(_) => 3,
                _ => 1,
            };
            let (x, w) = (shape_of(ins, 0), shape_of(ins, w_at));
            let nhwc = match op {
                Op::Conv(c) => c.nhwc,
                Op::PointwiseDepthwise(f) => f.pointwise.nhwc,
                _ => false,
            };
            if nhwc {
                // `[N, H, W, C]` in, `[N, oh, ow, M]` out.
                let m = w.and_then(|w| w.first().cloned());
                let n = x.filter(|x| x.len() == 4).map(|x| x[0].clone());
                return vec![shape_only(
                    n.zip(m)
                        .map(|(n, m)| vec![n, Sym::Unknown, Sym::Unknown, m]),
                )];
            }
            // A weight of rank 0 is malformed: the op itself reports it at run time.
            vec![shape_only(
                x.zip(w.and_then(|w| w.first()))
                    .filter(|(x, _)| x.len() >= 3)
                    .map(|(x, m)| {
                        let mut s = vec![x[0].clone(), m.clone()];
                        s.resize(x.len(), Sym::Unknown);
                        s
                    }),
            )]
        }
        // `[N, H, W, C]` in, `[N, oh, ow, C]` out.
        Op::Pool(p) if p.nhwc => {
            vec![shape_only(shape_of(ins, 0).filter(|x| x.len() == 4).map(
                |x| vec![x[0].clone(), Sym::Unknown, Sym::Unknown, x[3].clone()],
            ))]
        }
        Op::Pool(_) => vec![shape_only(shape_of(ins, 0).filter(|x| x.len() >= 3).map(
            |x| {
                let mut s = x[..2].to_vec();
                s.resize(x.len(), Sym::Unknown);
                s
            },
        ))],
        // `[N, H, W, C]` in, `[N, 1, 1, C]` out.
        Op::GlobalPool { nhwc: true, .. } => {
            vec![shape_only(shape_of(ins, 0).filter(|x| x.len() >= 3).map(
                |x| {
                    let mut s = vec![Sym::Known(1); x.len()];
                    (s[0], s[x.len() - 1]) = (x[0].clone(), x[x.len() - 1].clone());
                    s
                },
            ))]
        }
        Op::GlobalPool { .. } => vec![shape_only(shape_of(ins, 0).filter(|x| x.len() >= 3).map(
            |x| {
                let mut s = x[..2].to_vec();
                s.resize(x.len(), Sym::Known(1));
                s
            },
        ))],
        Op::Shape(s) => infer_shape_op(s, ins, consts),
        Op::Rnn(r) => rnn_shapes(r, ins, n_out),
        _ => unknown(),
    };
    out.resize(n_out, Known::default());
    out
}

/// An RNN, GRU or LSTM's Y and states from X (`[seq, batch, input]`, batch first
/// `[batch, seq, input]`) and the hidden size (the attribute's, else R's last axis).
fn rnn_shapes(r: &crate::ops::rnn::RnnAttrs, ins: &[&Known], n_out: usize) -> Vec<Known> {
    let x = shape_of(ins, 0).filter(|s| s.len() == 3);
    let hidden = match r.hidden {
        Some(h) => Some(Sym::Known(h as i64)),
        None => shape_of(ins, 2)
            .filter(|s| s.len() == 3)
            .map(|s| s[2].clone()),
    };
    let Some((x, hid)) = x.zip(hidden) else {
        return vec![Known::default(); n_out];
    };
    let dirs = Sym::Known(r.passes.len() as i64);
    let (y, state) = match r.batch_first {
        false => (
            vec![x[0].clone(), dirs.clone(), x[1].clone(), hid.clone()],
            vec![dirs, x[1].clone(), hid],
        ),
        true => (
            vec![x[0].clone(), x[1].clone(), dirs.clone(), hid.clone()],
            vec![x[0].clone(), dirs, hid],
        ),
    };
    let mut out = vec![shape_only(Some(y))];
    out.extend((1..n_out).map(|_| shape_only(Some(state.clone()))));
    out
}

fn infer_shape_op(op: &ShapeOp, ins: &[&Known], consts: &[Option<&Tensor>]) -> Vec<Known> {
    let x = shape_of(ins, 0);
    let const_ints = |i: usize| {
        consts
            .get(i)
            .copied()
            .flatten()
            .and_then(|t| t.to_i64_vec().ok())
    };
    match op {
        ShapeOp::Shape { start, end } => {
            let Some(x) = x else {
                return vec![Known::default()];
            };
            let r = x.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let (s, e) = (clamp(*start), clamp(end.unwrap_or(r)));
            let elements = x[s..e.max(s)].to_vec();
            vec![Known {
                shape: Some(vec![Sym::Known(elements.len() as i64)]),
                elements: Some(elements),
                int32: false,
            }]
        }
        ShapeOp::Gather { axis: a } => {
            let (Some(x), Some(idx)) = (x, shape_of(ins, 1)) else {
                return vec![Known::default()];
            };
            let Some(a) = axis(*a, x.len()) else {
                return vec![Known::default()];
            };
            let mut shape = x[..a].to_vec();
            shape.extend(idx.iter().cloned());
            shape.extend(x[a + 1..].iter().cloned());
            let elements = match (elements_of(ins, 0), const_ints(1)) {
                (Some(e), Some(picks)) if x.len() == 1 && picks.len() <= MAX_TRACKED => picks
                    .iter()
                    .map(|&p| axis(p, e.len()).map(|p| e[p].clone()))
                    .collect(),
                _ => None,
            };
            vec![Known {
                shape: Some(shape),
                elements,
                int32: false,
            }]
        }
        ShapeOp::Unsqueeze { axes } | ShapeOp::Squeeze { axes } => {
            let axes = axes.clone().or_else(|| const_ints(1));
            let squeeze = matches!(op, ShapeOp::Squeeze { .. });
            let shape = x.zip(axes).and_then(|(x, axes)| {
                if squeeze {
                    let drop: Option<Vec<usize>> = axes.iter().map(|&a| axis(a, x.len())).collect();
                    let drop = drop?;
                    Some(
                        x.iter()
                            .enumerate()
                            .filter(|(i, _)| !drop.contains(i))
                            .map(|(_, d)| d.clone())
                            .collect(),
                    )
                } else {
                    let rank = x.len() + axes.len();
                    let add: Option<Vec<usize>> = axes.iter().map(|&a| axis(a, rank)).collect();
                    let add = add?;
                    let mut src = x.iter();
                    (0..rank)
                        .map(|i| {
                            if add.contains(&i) {
                                Some(Sym::Known(1))
                            } else {
                                src.next().cloned()
                            }
                        })
                        .collect()
                }
            });
            // A scalar or vector keeps its elements; only the rank changes.
            let elements = elements_of(ins, 0)
                .filter(|_| shape.as_ref().is_some_and(|s: &Vec<Sym>| s.len() <= 1))
                .cloned();
            vec![Known {
                shape,
                elements,
                int32: false,
            }]
        }
        ShapeOp::Concat { axis: a } => {
            let shapes: Option<Vec<&Vec<Sym>>> = (0..ins.len()).map(|i| shape_of(ins, i)).collect();
            let shape = shapes.and_then(|s| concat(&s, *a));
            let elements = if shape.as_ref().is_some_and(|s| s.len() == 1) {
                let parts: Option<Vec<&Vec<Sym>>> =
                    (0..ins.len()).map(|i| elements_of(ins, i)).collect();
                parts
                    .filter(|p| p.iter().map(|e| e.len()).sum::<usize>() <= MAX_TRACKED)
                    .map(|p| p.into_iter().flatten().cloned().collect())
            } else {
                None
            };
            vec![Known {
                shape,
                elements,
                int32: false,
            }]
        }
        ShapeOp::Reshape { allowzero } => {
            let target = shape_vector(ins, 1);
            vec![shape_only(
                x.zip(target).map(|(x, t)| reshape(x, &t, *allowzero)),
            )]
        }
        ShapeOp::Flatten { axis: a } => {
            let shape = x.and_then(|x| {
                let r = x.len() as i64;
                let a = if *a < 0 { a + r } else { *a };
                let a = usize::try_from(a).ok().filter(|&a| a <= x.len())?;
                Some(vec![product(&x[..a]), product(&x[a..])])
            });
            vec![shape_only(shape)]
        }
        ShapeOp::Slice { attrs: None } => {
            // A slice keeps its input's rank; its sizes are only followed for a vector.
            let rank_only = || vec![shape_only(x.map(|x| vec![Sym::Unknown; x.len()]))];
            let (Some(e), Some(starts), Some(ends)) =
                (elements_of(ins, 0), const_ints(1), const_ints(2))
            else {
                return rank_only();
            };
            let axes = const_ints(3).unwrap_or_else(|| vec![0]);
            let steps = const_ints(4).unwrap_or_else(|| vec![1]);
            // One slice of a vector only (empty or longer starts are the op's to refuse).
            let (&[start], &[end]) = (starts.as_slice(), ends.as_slice()) else {
                return rank_only();
            };
            if axes.as_slice() != [0] && axes.as_slice() != [-1] || steps.as_slice() != [1] {
                return rank_only();
            }
            let n = e.len() as i64;
            let clamp = |v: i64| (if v < 0 { v.saturating_add(n) } else { v }).clamp(0, n) as usize;
            let (s, t) = (clamp(start), clamp(end));
            let elements = e[s..t.max(s)].to_vec();
            vec![Known {
                shape: Some(vec![Sym::Known(elements.len() as i64)]),
                elements: Some(elements),
                int32: false,
            }]
        }
        ShapeOp::Transpose { perm } => {
            let shape = x.map(|x| match perm {
                Some(p) => p
                    .iter()
                    .map(|&i| x.get(i).cloned().unwrap_or(Sym::Unknown))
                    .collect(),
                None => x.iter().rev().cloned().collect(),
            });
            vec![shape_only(shape)]
        }
        ShapeOp::Expand => {
            let target = shape_vector(ins, 1);
            let shape = x.zip(target).and_then(|(x, t)| broadcast_all(&[x, &t]));
            vec![shape_only(shape)]
        }
        _ => vec![Known::default()],
    }
}

/// The product of dimensions: known when all are, a symbol when it is the only factor not 1.
fn product(dims: &[Sym]) -> Sym {
    match factors(dims) {
        Some((known, names)) if names.is_empty() => Sym::Known(known),
        Some((1, mut names)) if names.len() == 1 => Sym::Named(names.remove(0)),
        _ => Sym::Unknown,
    }
}

fn reshape(x: &[Sym], target: &[Sym], allowzero: bool) -> Vec<Sym> {
    let mut out: Vec<Sym> = target
        .iter()
        .enumerate()
        .map(|(i, t)| match t {
            Sym::Known(0) if !allowzero => x.get(i).cloned().unwrap_or(Sym::Unknown),
            Sym::Known(-1) => Sym::Unknown,
            other => other.clone(),
        })
        .collect();
    // One -1: whatever is left of the input's size, when that can be told before run time.
    if let Some(free) = target.iter().position(|t| *t == Sym::Known(-1)) {
        let rest: Vec<Sym> = (0..out.len())
            .filter(|&i| i != free)
            .map(|i| out[i].clone())
            .collect();
        if let (Some((kx, mut nx)), Some((kr, nr))) = (factors(x), factors(&rest)) {
            for name in &nr {
                if let Some(i) = nx.iter().position(|n| n == name) {
                    nx.swap_remove(i);
                } else {
                    return out;
                }
            }
            out[free] = match nx.as_slice() {
                [] if kr > 0 && kx.checked_rem(kr) == Some(0) => Sym::Known(kx / kr),
                [one] if kr == kx => Sym::Named(one.clone()),
                _ => Sym::Unknown,
            };
        }
    }
    out
}

/// A shape's known product and the names of its symbolic dimensions; `None` if any is unknown.
fn factors(dims: &[Sym]) -> Option<(i64, Vec<String>)> {
    let mut known = 1i64;
    let mut names = Vec::new();
    for d in dims {
        match d {
            Sym::Known(v) => known = known.checked_mul(*v)?,
            Sym::Named(n) => names.push(n.clone()),
            Sym::Unknown => return None,
        }
    }
    Some((known, names))
}

/// Integer arithmetic on shape elements (`size(-1) // heads` and the like), element by element
/// with a scalar broadcast; known only where both sides are.
fn arithmetic(op: Binary, a: Option<&Vec<Sym>>, b: Option<&Vec<Sym>>) -> Option<Vec<Sym>> {
    let (a, b) = (a?, b?);
    let n = a.len().max(b.len());
    if !(a.len() == n || a.len() == 1) || !(b.len() == n || b.len() == 1) {
        return None;
    }
    let pick = |v: &Vec<Sym>, i: usize| v[if v.len() == 1 { 0 } else { i }].clone();
    (0..n)
        .map(|i| {
            let (Sym::Known(x), Sym::Known(y)) = (pick(a, i), pick(b, i)) else {
                return Some(Sym::Unknown);
            };
            let v = match op {
                Binary::Add => x.checked_add(y),
                Binary::Sub => x.checked_sub(y),
                Binary::Mul => x.checked_mul(y),
                // ONNX integer division truncates, as Rust's does.
                Binary::Div => x.checked_div(y),
                Binary::Fmod => x.checked_rem(y),
                // The divisor's sign, as Python's `%`.
                Binary::Mod => x.checked_rem(y).map(|r| {
                    if r != 0 && (r < 0) != (y < 0) {
                        r + y
                    } else {
                        r
                    }
                }),
                _ => None,
            };
            Some(v.map_or(Sym::Unknown, Sym::Known))
        })
        .collect()
}

fn broadcast_all(shapes: &[&Vec<Sym>]) -> Option<Vec<Sym>> {
    let rank = shapes.iter().map(|s| s.len()).max()?;
    (0..rank)
        .map(|i| {
            let mut dim = Sym::Known(1);
            for s in shapes {
                let Some(d) = (i + s.len()).checked_sub(rank).map(|j| &s[j]) else {
                    continue;
                };
                dim = match (&dim, d) {
                    (Sym::Known(1), d) => d.clone(),
                    (_, Sym::Known(1)) => dim,
                    (a, b) if a == b => dim,
                    // A symbol broadcast against a size: only that size is valid.
                    (Sym::Named(_), Sym::Known(v)) => Sym::Known(*v),
                    (Sym::Known(_), Sym::Named(_)) => dim,
                    _ => Sym::Unknown,
                };
            }
            Some(dim)
        })
        .collect()
}

fn matmul(a: Option<&Vec<Sym>>, b: Option<&Vec<Sym>>) -> Option<Vec<Sym>> {
    let (a, b) = (a?, b?);
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let (ab, bb) = (a[..a.len() - 2].to_vec(), b[..b.len() - 2].to_vec());
    let mut out = broadcast_all(&[&ab, &bb])?;
    out.push(a[a.len() - 2].clone());
    out.push(b[b.len() - 1].clone());
    Some(out)
}

fn concat(shapes: &[&Vec<Sym>], a: i64) -> Option<Vec<Sym>> {
    let first = shapes.first()?;
    let a = axis(a, first.len())?;
    let mut out = (*first).clone();
    out[a] = shapes
        .iter()
        .map(|s| s.get(a).cloned().unwrap_or(Sym::Unknown))
        .try_fold(0i64, |acc, d| match d {
            Sym::Known(v) => acc.checked_add(v),
            _ => None,
        })
        .map_or(Sym::Unknown, Sym::Known);
    Some(out)
}

mod batch;
pub use batch::{batch_refusal, separable_batch};

#[cfg(test)]
mod tests;
