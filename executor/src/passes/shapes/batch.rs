//! Whether a graph's batch axis separates: every sample of a batch is computed from that sample
//! alone, so a batch can run as several smaller batches (one per thread, each with its own
//! caches and no synchronisation between operators) whose outputs are then concatenated.
//!
//! The check is conservative and works on the shapes `infer` derives with the batch kept as a
//! symbol. Every input and output must have the symbol as its first dimension and nowhere else;
//! every node must be one whose samples stay apart (a convolution, an elementwise op whose other
//! operands carry no batch, a softmax over a later axis, a reshape that keeps the batch first,
//! ...). Values computed from the batch *size* (`Shape` of a batched value) may only flow
//! through shape arithmetic into the shape operand of a `Reshape`. Anything else — an op this
//! module does not know, an axis it cannot resolve, a shape it cannot infer — and the batch
//! does not separate.

use super::{Known, Sym, axis, infer};
use crate::graph::{Dim, Graph, Node, ValueId};
use crate::ops::Op;
use crate::ops::shape::ShapeOp;
use std::collections::{HashMap, HashSet};

/// The symbol of the graph's separable batch axis, if it has one.
pub fn separable_batch(g: &Graph) -> Option<String> {
    batch_separation(g).ok()
}

/// Why a graph whose inputs all start with a symbolic dimension (so that requests could be
/// stacked along it) must not run two requests in one batch; `None` when the batch separates
/// or the inputs have no such dimension to batch along.
pub fn batch_refusal(g: &Graph) -> Option<String> {
    let stackable = !g.inputs.is_empty()
        && g.inputs.iter().all(|i| {
            i.dims
                .as_ref()
                .and_then(|d| d.first())
                .is_some_and(|d| matches!(d, Dim::Symbol(_)))
        });
    batch_separation(g).err().filter(|_| stackable)
}

/// The batch symbol, or why the batch does not separate.
fn batch_separation(g: &Graph) -> Result<String, String> {
    let first = g
        .inputs
        .first()
        .ok_or("the model has no inputs")?
        .dims
        .as_ref()
        .and_then(|d| d.first());
    let sym = match first {
        Some(Dim::Symbol(s)) => s.clone(),
        _ => return Err("the first input has no symbolic first dimension".into()),
    };
    for i in &g.inputs {
        let dims = i.dims.as_deref().unwrap_or_default();
        if dims.first() != Some(&Dim::Symbol(sym.clone())) {
            return Err(format!(
                "input {:?} does not start with the batch dimension {sym:?}",
                i.name
            ));
        }
        if dims[1..].contains(&Dim::Symbol(sym.clone())) {
            return Err(format!(
                "input {:?} has the batch dimension {sym:?} past its first axis",
                i.name
            ));
        }
    }
    let check = Check {
        known: infer(g),
        sym: Sym::Named(sym.clone()),
    };
    let node_says = |n: &Node, what: &str| format!("node {:?} ({}) {what}", n.name, n.op.name());
    // Values whose contents depend on the batch size.
    let mut sized: HashSet<ValueId> = HashSet::new();
    for node in &g.nodes {
        let reads_size = node.inputs.iter().flatten().any(|v| sized.contains(v));
        if reads_size {
            if !check.shape_arithmetic(node, &sized) {
                return Err(node_says(node, "computes with the batch size"));
            }
            if !matches!(node.op, Op::Shape(ShapeOp::Reshape { .. })) {
                sized.extend(node.outputs.iter().copied());
                continue;
            }
        }
        match &node.op {
            Op::Shape(ShapeOp::Shape { .. }) => {
                sized.extend(node.outputs.iter().copied());
            }
            _ if !check.separates(node) => {
                return Err(node_says(
                    node,
                    "is not proven to keep the samples of a batch apart",
                ));
            }
            _ => {}
        }
    }
    for &v in &g.outputs {
        if !check.batched(v) || sized.contains(&v) {
            return Err(format!(
                "output {:?} does not keep the batch as its first axis",
                g.value_names[v]
            ));
        }
    }
    Ok(sym)
}

struct Check {
    known: HashMap<ValueId, Known>,
    sym: Sym,
}

impl Check {
    fn shape(&self, v: ValueId) -> Option<&Vec<Sym>> {
        self.known.get(&v).and_then(|k| k.shape.as_ref())
    }

    /// The batch symbol first and nowhere else.
    fn batched(&self, v: ValueId) -> bool {
        self.shape(v)
            .is_some_and(|s| s.first() == Some(&self.sym) && !s[1..].contains(&self.sym))
    }

    /// A known shape without the batch symbol (weights, constants, shape tensors).
    fn free(&self, v: ValueId) -> bool {
        self.shape(v)
            .is_some_and(|s| !s.contains(&self.sym) && !s.contains(&Sym::Unknown))
    }

    fn rank(&self, v: ValueId) -> usize {
        self.shape(v).map_or(0, Vec::len)
    }

    /// A batch-free operand that broadcasts onto an output of rank `rank` without meeting its
    /// batch axis (or meeting it with size 1).
    fn broadcasts(&self, v: ValueId, rank: usize) -> bool {
        self.free(v)
            && self
                .shape(v)
                .is_some_and(|s| s.len() < rank || s.first() == Some(&Sym::Known(1)))
    }

    /// Every output batched, every batched input of the outputs' rank, and every other input
    /// batch-free; with `broadcast`, those must also broadcast (elementwise operands rather
    /// than parameters).
    fn per_sample(&self, n: &Node, broadcast: bool) -> bool {
        let Some(&out) = n.outputs.first() else {
            return false;
        };
        let rank = self.rank(out);
        n.outputs.iter().all(|&o| self.batched(o))
            && n.inputs.iter().flatten().any(|&v| self.batched(v))
            && n.inputs.iter().flatten().all(|&v| {
                (self.batched(v) && self.rank(v) == rank)
                    || (!broadcast && self.free(v))
                    || (broadcast && self.broadcasts(v, rank))
            })
    }

    /// `axis` of a batched input resolves to an axis after the batch.
    fn later_axis(&self, n: &Node, a: i64) -> bool {
        n.inputs
            .first()
            .copied()
            .flatten()
            .and_then(|x| axis(a, self.rank(x)))
            .is_some_and(|a| a > 0)
    }

    fn separates(&self, n: &Node) -> bool {
        let input = |i: usize| n.inputs.get(i).copied().flatten();
        match &n.op {
            // MaxPool's Indices count across the whole batch, not per sample.
            Op::Pool(p) if p.indices => false,
            Op::Conv(_)
            | Op::ConvTranspose(_)
            | Op::PointwiseDepthwise(_)
            | Op::Pool(_)
            | Op::GlobalPool { .. }
            | Op::BatchNorm { .. }
            | Op::Unary(_)
            | Op::Clip { .. }
            | Op::Dropout
            | Op::Lrn { .. }
            | Op::GroupNorm { .. }
            | Op::Cast { .. } => self.per_sample(n, false),
            Op::Binary(_) | Op::Variadic(..) | Op::Where | Op::PRelu => self.per_sample(n, true),
            Op::Softmax { axis, .. } | Op::LayerNorm { axis, .. } | Op::RmsNorm { axis, .. } => {
                self.per_sample(n, false) && self.later_axis(n, *axis)
            }
            Op::Reduce(r) => {
                let axes = r.axes.clone().or_else(|| {
                    input(1)
                        .and_then(|v| self.known.get(&v)?.elements.clone())
                        .and_then(|e| {
                            e.iter()
                                .map(|s| match s {
                                    Sym::Known(a) => Some(*a),
                                    _ => None,
                                })
                                .collect()
                        })
                });
                axes.is_some_and(|axes| {
                    !axes.is_empty() && axes.iter().all(|&a| self.later_axis(n, a))
                }) && self.per_sample_first(n)
            }
            Op::Gemm(a) => {
                !a.trans_a
                    && input(0).is_some_and(|v| self.batched(v))
                    && input(1).is_some_and(|v| self.free(v))
                    && input(2).is_none_or(|v| self.broadcasts(v, 2))
                    && n.outputs.iter().all(|&o| self.batched(o))
            }
            // A constant matrix the CPU holds packed: the rows of A are apart.
            Op::MatMul {
                packed: Some(_), ..
            } => {
                let (Some(a), Some(&out)) = (input(0), n.outputs.first()) else {
                    return false;
                };
                self.batched(a) && self.batched(out) && self.rank(a) == self.rank(out)
            }
            Op::MatMul { .. } => {
                let (Some(a), Some(b), Some(&out)) = (input(0), input(1), n.outputs.first()) else {
                    return false;
                };
                let rank = self.rank(out);
                let a_ok = (self.batched(a) && self.rank(a) == rank) || self.broadcasts(a, rank);
                // B's first axis is its contraction axis when it is a matrix.
                let b_ok = (self.batched(b) && rank >= 3 && self.rank(b) == rank)
                    || (self.free(b) && self.rank(b) == 2)
                    || self.broadcasts(b, rank);
                self.batched(out) && a_ok && b_ok && (self.batched(a) || self.batched(b))
            }
            Op::Shape(s) => self.shape_op_separates(n, s),
            _ => false,
        }
    }

    /// Input 0 batched, every output batched, other inputs batch-free (reductions, whose
    /// outputs may have a lower rank).
    fn per_sample_first(&self, n: &Node) -> bool {
        let mut ins = n.inputs.iter().flatten();
        ins.next().is_some_and(|&v| self.batched(v))
            && ins.all(|&v| self.free(v))
            && n.outputs.iter().all(|&o| self.batched(o))
    }

    fn shape_op_separates(&self, n: &Node, op: &ShapeOp) -> bool {
        let input = |i: usize| n.inputs.get(i).copied().flatten();
        let outs_batched = n.outputs.iter().all(|&o| self.batched(o));
        match op {
            // The batch stays first on both sides, so every sample keeps its own contiguous
            // block of elements.
            ShapeOp::Reshape { .. } | ShapeOp::Flatten { .. } => {
                input(0).is_some_and(|v| self.batched(v)) && outs_batched
            }
            ShapeOp::Squeeze { .. } | ShapeOp::Unsqueeze { .. } => {
                self.per_sample_first(n) && outs_batched
            }
            ShapeOp::Transpose { perm: Some(p) } => {
                p.first() == Some(&0) && self.per_sample_first(n)
            }
            ShapeOp::Concat { axis } => {
                self.later_axis(n, *axis)
                    && n.inputs.iter().flatten().all(|&v| self.batched(v))
                    && outs_batched
            }
            ShapeOp::Gather { axis: a } => {
                let (Some(data), Some(idx)) = (input(0), input(1)) else {
                    return false;
                };
                // A table lookup (embeddings) by batched indices, or a pick along a later
                // axis of batched data.
                let lookup = self.free(data) && self.batched(idx) && *a == 0;
                let pick = self.batched(data) && self.free(idx) && self.later_axis(n, *a);
                (lookup || pick) && outs_batched
            }
            _ => false,
        }
    }

    /// A node reading a value computed from the batch size: shape arithmetic on small integer
    /// vectors, or the shape operand of a `Reshape` whose data is batched.
    fn shape_arithmetic(&self, n: &Node, sized: &HashSet<ValueId>) -> bool {
        let input = |i: usize| n.inputs.get(i).copied().flatten();
        match &n.op {
            Op::Shape(ShapeOp::Reshape { .. }) => input(0).is_some_and(|v| !sized.contains(&v)),
            Op::Shape(
                ShapeOp::Gather { .. }
                | ShapeOp::Unsqueeze { .. }
                | ShapeOp::Squeeze { .. }
                | ShapeOp::Concat { .. }
                | ShapeOp::Slice { .. },
            )
            | Op::Cast { .. }
            | Op::Binary(_) => n
                .inputs
                .iter()
                .flatten()
                .chain(&n.outputs)
                .all(|&v| self.free(v) && self.rank(v) <= 1),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, CpuBackend};
    use crate::plan::Model;
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Data, Tensor};
    use crate::zoo::builder::{Builder, attr_int, attr_ints, value_info};
    use crate::zoo::{self, BertOptions, ZooOptions};
    use prost::Message;

    fn small_bert() -> ZooOptions {
        ZooOptions {
            seed: 3,
            bert: BertOptions {
                layers: 2,
                hidden: 32,
                heads: 4,
                seq: 16,
                vocab: 50,
            },
        }
    }

    fn zoo_model(name: &str, o: &ZooOptions) -> Model {
        let proto = zoo::build(name, o).expect("zoo model");
        Model::from_bytes(&proto.encode_to_vec()).expect("imports")
    }

    #[test]
    fn the_zoo_models_batches_separate() {
        for name in ["squeezenet", "mobilenet_v2", "resnet18", "bert"] {
            let m = zoo_model(name, &small_bert());
            assert_eq!(m.plan.separable_batch.as_deref(), Some("batch"), "{name}");
        }
    }

    /// A batch run in lanes (two threads, one lane each) gives what the whole batch gives on
    /// one thread, for even and uneven splits and for integer inputs (BERT's token ids).
    #[test]
    fn a_batch_run_in_lanes_computes_what_the_whole_batch_does() {
        for (name, batch) in [("mobilenet_v2", 2), ("bert", 4), ("bert", 9)] {
            let m = zoo_model(name, &small_bert());
            let mut rng = zoo::Rng::new(5);
            let inputs: Vec<(String, Tensor)> = m
                .plan
                .example_inputs(batch)
                .into_iter()
                .map(|(n, t)| {
                    let data = match t.dtype() {
                        DType::I64 => {
                            Data::I64((0..t.len()).map(|_| (rng.next_u64() % 50) as i64).collect())
                        }
                        _ => Data::F32((0..t.len()).map(|_| rng.normal()).collect()),
                    };
                    (
                        n,
                        Tensor {
                            shape: t.shape,
                            data,
                        },
                    )
                })
                .collect();
            let whole = m
                .plan
                .run(&CpuBackend::new(1), inputs.clone())
                .expect("whole");
            let lanes = CpuBackend::new(2);
            assert_eq!(lanes.batch_lanes().len(), 2);
            let split = m.plan.run(&lanes, inputs).expect("in lanes");
            for ((n1, a), (n2, b)) in whole.iter().zip(&split) {
                assert_eq!((n1, &a.shape), (n2, &b.shape));
                let (a, b) = (a.as_f32().unwrap(), b.as_f32().unwrap());
                let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
                let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    worst <= 1e-5 * scale,
                    "{name} batch {batch} {n1}: {worst} of {scale}"
                );
            }
        }
    }

    /// x: [batch, 4] through `body`, which returns the output's name.
    fn graph(body: impl FnOnce(&mut Builder) -> String) -> Graph {
        let mut m = Builder::new(1, false);
        let y = body(&mut m);
        m.node_rename_last(&y, "y");
        let proto: ModelProto = m.finish(
            "t",
            13,
            vec![value_info("x", DType::F32, &[None, Some(4)])],
            vec![value_info("y", DType::F32, &[None, Some(4)])],
        );
        let mut g = crate::import::import(&proto.encode_to_vec(), None).expect("imports");
        crate::passes::optimize(&mut g);
        g
    }

    #[test]
    fn samples_that_meet_keep_the_batch_whole() {
        // Per-sample: a softmax over the features, a weight product, a residual add.
        let ok = graph(|m| {
            let w = m.normal("w", &[4, 4], 1.0);
            let s = m.node("Softmax", &["x"], vec![attr_int("axis", 1)]);
            let p = m.node("MatMul", &[&s, &w], vec![]);
            m.node("Add", &[&p, "x"], vec![])
        });
        assert_eq!(separable_batch(&ok).as_deref(), Some("batch"));
        // A softmax across the batch.
        let across = graph(|m| m.node("Softmax", &["x"], vec![attr_int("axis", 0)]));
        assert_eq!(separable_batch(&across), None);
        // x^T x, broadcast back onto every sample: the Gram matrix mixes them.
        let gram = graph(|m| {
            let t = m.node("Transpose", &["x"], vec![attr_ints("perm", &[1, 0])]);
            let g = m.node("MatMul", &[&t, "x"], vec![]);
            m.node("Add", &["x", &g], vec![])
        });
        assert_eq!(separable_batch(&gram), None);
        // The row index (0..batch) added to every row: it differs in a lane.
        let index = graph(|m| {
            let s = m.node("Shape", &["x"], vec![]);
            let i0 = m.const_i64("i0", &[0]);
            let n = m.node("Gather", &[&s, &i0], vec![attr_int("axis", 0)]);
            let n = m.node("Squeeze", &[&n, &i0], vec![]);
            let (zero, one) = (m.const_i64("z", &[0]), m.const_i64("o", &[1]));
            let (zero, one) = (
                m.node("Squeeze", &[&zero, &i0], vec![]),
                m.node("Squeeze", &[&one, &i0], vec![]),
            );
            let r = m.node("Range", &[&zero, &n, &one], vec![]);
            let f = m.node("Cast", &[&r], vec![attr_int("to", 1)]);
            let axes = m.const_i64("axes", &[1]);
            let c = m.node("Unsqueeze", &[&f, &axes], vec![]);
            m.node("Add", &["x", &c], vec![])
        });
        assert_eq!(separable_batch(&index), None);
        // The first sample picked out and broadcast to all.
        let pick = graph(|m| {
            let i = m.const_i64("i", &[0]);
            let first = m.node("Gather", &["x", &i], vec![attr_int("axis", 0)]);
            m.node("Add", &["x", &first], vec![])
        });
        assert_eq!(separable_batch(&pick), None);
    }
}
