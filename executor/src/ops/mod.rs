//! Operators: each ONNX node becomes one typed [`Op`] with its attributes parsed at import, and
//! evaluates on host tensors. One file per op family; this file owns the enum, parsing dispatch
//! and evaluation dispatch.

mod arg_extreme;
pub mod attention;
pub mod attrs;
pub mod buffers;
pub mod control;
pub mod conv;
pub mod conv_nd;
pub mod conv_nhwc;
pub mod deform_conv;
pub mod det;
pub mod dft;
pub mod einsum;
pub mod elementwise;
mod fft_f32;
pub mod grid;
pub mod group_query;
pub mod index;
pub mod loss;
pub mod mask_index;
pub mod matmul;
pub mod mel;
pub mod nms;
pub mod norm;
pub mod pool;
pub mod pool_nd;
pub mod quant;
pub mod recurrent_state;
pub mod reduce;
pub mod resize;
pub mod resize_filter;
mod resize_linear;
pub mod rnn;
pub mod roi_align;
pub mod shape;
pub mod size;
pub mod token_bias;
pub mod window;

use crate::error::{OpError, OpResult};
use crate::tensor::{CastMode, DType, Data, E8M0Round, Tensor};
use attrs::Attrs;
pub use cotenant_kernels::activation::Activation;
use std::cell::RefCell;

/// What an op needs from the backend while it runs on the CPU.
pub struct Cx {
    /// Threads this instance may use.
    pub threads: usize,
    /// Reused im2col scratch.
    pub scratch: RefCell<Vec<f32>>,
    /// Buffers of activations that died earlier in the plan, reused for new outputs.
    pub pool: RefCell<buffers::Pools>,
}

impl Cx {
    pub fn new(threads: usize) -> Cx {
        Cx {
            threads: threads.max(1),
            scratch: RefCell::new(Vec::new()),
            pool: RefCell::default(),
        }
    }

    /// An f32 buffer of length `n` with unspecified (but initialised) contents: a recycled
    /// activation buffer when one is big enough, so steady-state runs neither fault in fresh
    /// pages nor zero memory. Callers must overwrite every element.
    pub fn take_f32(&self, n: usize) -> Vec<f32> {
        self.pool.borrow_mut().f32.take(n)
    }

    /// [`Cx::take_f32`] for uint8 values.
    pub fn take_u8(&self, n: usize) -> Vec<u8> {
        self.pool.borrow_mut().u8.take(n)
    }

    /// The length of the pieces a pass over `n` elements splits into across the threads, a
    /// multiple of `align`: two a thread, contiguous, so that each thread takes the half of
    /// the activation it wrote in the op before, where that op split its rows the same way.
    /// `None` where one thread does it all: one thread, or too little to split.
    pub fn pieces(&self, n: usize, align: usize) -> Option<usize> {
        /// Elements below which a memory-bound pass is not worth splitting.
        const MIN: usize = 1 << 15;
        let align = align.max(1);
        let len = n.div_ceil(2 * self.threads).div_ceil(align) * align;
        (self.threads > 1 && n >= MIN && len < n).then_some(len)
    }

    /// `f(at, piece)` over the [`Cx::pieces`] of `out` (`at`: where the piece starts), across the
    /// threads, or over the whole of it on this thread where it does not split.
    pub fn in_pieces<T: Send>(
        &self,
        out: &mut [T],
        align: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        use rayon::prelude::*;
        match self.pieces(out.len(), align) {
            Some(len) => (out.par_chunks_mut(len).enumerate()).for_each(|(i, o)| f(i * len, o)),
            None => f(0, out),
        }
    }
}

/// Every ONNX operator (default domain) the importer accepts.
pub const SUPPORTED_OPS: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "AffineGrid",
    "And",
    "ArgMax",
    "ArgMin",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "Attention",
    "AveragePool",
    "BatchNormalization",
    "BitCast",
    "BitShift",
    "BitwiseAnd",
    "BitwiseNot",
    "BitwiseOr",
    "BitwiseXor",
    "BlackmanWindow",
    "Cast",
    "CastLike",
    "CausalConvWithState",
    "Ceil",
    "Celu",
    "CenterCropPad",
    "Clip",
    "Col2Im",
    "Compress",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "ConvTranspose",
    "ConvInteger",
    "Cos",
    "Cosh",
    "CumProd",
    "CumSum",
    "DFT",
    "DepthToSpace",
    "DeformConv",
    "DequantizeLinear",
    "Det",
    "Div",
    "Dropout",
    "DynamicQuantizeLinear",
    "Einsum",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "EyeLike",
    "Flatten",
    "Floor",
    "Gather",
    "GatherElements",
    "GatherND",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "GRU",
    "GridSample",
    "GroupNormalization",
    "HammingWindow",
    "HannWindow",
    "Hardmax",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "If",
    "InstanceNormalization",
    "IsInf",
    "IsNaN",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "LinearAttention",
    "Log",
    "LogSoftmax",
    "Loop",
    "LpNormalization",
    "LpPool",
    "LRN",
    "LSTM",
    "MatMul",
    "MatMulInteger",
    "Max",
    "MaxPool",
    "MaxUnpool",
    "Mean",
    "MeanVarianceNormalization",
    "MelWeightMatrix",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "NegativeLogLikelihoodLoss",
    "NonMaxSuppression",
    "NonZero",
    "Not",
    "OneHot",
    "Or",
    "Pad",
    "Pow",
    "PRelu",
    "QLinearConv",
    "QLinearMatMul",
    "QuantizeLinear",
    "Range",
    "Reciprocal",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "Resize",
    "RNN",
    "RoiAlign",
    "ReverseSequence",
    "RMSNormalization",
    "Round",
    "RotaryEmbedding",
    "Scan",
    "Scatter",
    "ScatterElements",
    "ScatterND",
    "Selu",
    "Shape",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Size",
    "Slice",
    "Softmax",
    "Softplus",
    "SoftmaxCrossEntropyLoss",
    "Softsign",
    "SpaceToDepth",
    "STFT",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Swish",
    "Tan",
    "Tanh",
    "TensorScatter",
    "ThresholdedRelu",
    "Tile",
    "TopK",
    "Transpose",
    "Trilu",
    "Unique",
    "Unsqueeze",
    "Upsample",
    "Where",
    "Xor",
];

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Conv(conv::ConvAttrs),
    /// A 1x1 Conv feeding a depthwise Conv, fused by the fusion pass.
    PointwiseDepthwise(Box<conv::PointwiseDepthwise>),
    ConvTranspose(conv::ConvAttrs),
    Col2Im(conv::Col2ImAttrs),
    BatchNorm {
        eps: f32,
    },
    Unary(elementwise::Unary),
    Clip {
        min: Option<f32>,
        max: Option<f32>,
    },
    Binary(elementwise::Binary),
    /// A binary op of opset < 7 with `broadcast=1`: B aligned with A at `axis` (trailing if none).
    LegacyBroadcast(elementwise::Binary, Option<i64>),
    /// Sum, Max, Min, Mean over any number of inputs.
    Variadic(elementwise::Binary, bool),
    PRelu,
    Where,
    Dropout,
    Gemm(matmul::GemmAttrs),
    /// `packed`: the CPU plan's copy of a constant 2-D B, packed once for
    /// `nhwc_conv::matmul_packed` (`passes::pack_matmul_weights`); the ONNX copy is then freed.
    MatMul {
        act: Option<Activation>,
        packed: Option<std::sync::Arc<cotenant_kernels::nhwc_conv::NhwcFilter>>,
    },
    Pool(pool::PoolAttrs),
    MaxUnpool(pool::UnpoolAttrs),
    /// LpPool of order `p` (positive).
    LpPool {
        pool: pool::PoolAttrs,
        p: u32,
    },
    GlobalPool {
        max: bool,
        /// `[N, H, W, C]` in, `[N, 1, 1, C]` out (the same bytes as `[N, C, 1, 1]`).
        nhwc: bool,
    },
    Lrn {
        size: usize,
        alpha: f32,
        beta: f32,
        bias: f32,
    },
    Softmax {
        axis: i64,
        log: bool,
        legacy: bool,
        /// A positive factor the input is multiplied by first (1 as imported; set on the CPU
        /// by `passes::scaled_softmax`).
        scale: f32,
    },
    LayerNorm {
        axis: i64,
        eps: f32,
        /// The node also has the mean and inverse standard deviation outputs.
        stats: bool,
    },
    RmsNorm {
        axis: i64,
        eps: f32,
    },
    Reduce(reduce::ReduceAttrs),
    Shape(shape::ShapeOp),
    Resize(resize::ResizeAttrs),
    GridSample(grid::GridSampleAttrs),
    /// RNN, GRU and LSTM.
    Rnn(rnn::RnnAttrs),
    /// A sampling grid from affine matrices (input 0) for the size input 1 gives.
    AffineGrid {
        align_corners: bool,
    },
    Cast {
        to: DType,
        mode: CastMode,
    },
    /// Cast to the element type of the second input.
    CastLike(CastMode),
    /// The same bytes read as another element type of the same width.
    BitCast {
        to: DType,
    },
    /// Selection and placement by index: TopK, ArgMax/ArgMin, gathers, scatters, NonZero,
    /// OneHot.
    Index(index::IndexOp),
    NonMaxSuppression {
        center_point_box: bool,
    },
    Einsum(einsum::Einsum),
    CumSum {
        exclusive: bool,
        reverse: bool,
    },
    Attention(attention::AttentionAttrs),
    RotaryEmbedding(attention::RotaryAttrs),
    /// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
    Loss(loss::LossAttrs),
    /// Linear quantization and the integer products.
    Quant(quant::QuantOp),
    CumProd {
        exclusive: bool,
        reverse: bool,
    },
    /// `p` is 1 or 2.
    LpNorm {
        axis: i64,
        p: u8,
    },
    MeanVarianceNorm {
        axes: Vec<i64>,
    },
    /// GroupNormalization with `groups`, InstanceNormalization without (a group per channel);
    /// `per_group`: one scale and bias per group (GroupNormalization before opset 21).
    GroupNorm {
        groups: Option<usize>,
        eps: f32,
        per_group: bool,
    },
    /// If, Loop and Scan, with their bodies.
    Control(control::ControlOp),
    Dft(dft::DftAttrs),
    Stft {
        onesided: bool,
    },
    /// MelWeightMatrix, of element type `to`.
    MelWeightMatrix {
        to: DType,
    },
    Det,
    RoiAlign(roi_align::RoiAlignAttrs),
    DeformConv(deform_conv::DeformConvAttrs),
    TensorScatter(recurrent_state::ScatterAttrs),
    /// CausalConvWithState, with SiLU after it when `silu`.
    CausalConv {
        silu: bool,
    },
    LinearAttention(recurrent_state::LinearAttentionAttrs),
    /// onnxruntime's attention masks (input 0, any of their formats) as the additive mask of
    /// the query input 1 over its own positions, or over those of the past keys (input 3) and
    /// the key (input 2); written only by the importer's expansions.
    MaskIndex(mask_index::MaskIndexAttrs),
    /// onnxruntime's GroupQueryAttention; written only by the importer's expansion.
    GroupQuery(group_query::GroupQueryAttrs),
    /// MultiHeadAttention's key or value bias (input 1) added to input 0 when it is tokens,
    /// not heads; written only by the importer's expansion.
    TokenBias,
}

impl Op {
    /// Parses an ONNX node; `Ok(None)` when the operator is not supported.
    pub fn parse(
        op_type: &str,
        a: &Attrs,
        opset: i64,
        n_inputs: usize,
        n_outputs: usize,
    ) -> Result<Option<Op>, String> {
        use elementwise::{Binary as B, Unary as U};
        let un = |u| Ok(Some(Op::Unary(u)));
        match op_type {
            "Conv" => Ok(Some(Op::Conv(conv::ConvAttrs::parse(a)?))),
            "ConvTranspose" => Ok(Some(Op::ConvTranspose(conv::ConvAttrs::parse(a)?))),
            "Col2Im" => Ok(Some(Op::Col2Im(conv::Col2ImAttrs::parse(a)?))),
            "BatchNormalization" => {
                if a.int_or("training_mode", 0)? != 0 {
                    return Err(
                        "training_mode BatchNormalization is not supported for inference".into(),
                    );
                }
                Ok(Some(Op::BatchNorm {
                    eps: a.float_or("epsilon", 1e-5)?,
                }))
            }
            "Relu" => un(U::Relu),
            "LeakyRelu" => un(U::LeakyRelu(a.float_or("alpha", 0.01)?)),
            "Sigmoid" => un(U::Sigmoid),
            "HardSigmoid" => un(U::HardSigmoid(
                a.float_or("alpha", 0.2)?,
                a.float_or("beta", 0.5)?,
            )),
            "HardSwish" => un(U::HardSwish),
            "Tanh" => un(U::Tanh),
            "Elu" => un(U::Elu(a.float_or("alpha", 1.0)?)),
            "Selu" => un(U::Selu(
                a.float_or("alpha", 1.673_263_2)?,
                a.float_or("gamma", 1.050_701)?,
            )),
            "Softplus" => un(U::Softplus),
            "Erf" => un(U::Erf),
            "Gelu" => un(U::Gelu(a.string_or("approximate", "none")? == "tanh")),
            "Sqrt" => un(U::Sqrt),
            "Exp" => un(U::Exp),
            "Log" => un(U::Log),
            "Neg" => un(U::Neg),
            "Abs" => un(U::Abs),
            "Reciprocal" => un(U::Reciprocal),
            "Floor" => un(U::Floor),
            "Ceil" => un(U::Ceil),
            "Not" => un(U::Not),
            "Identity" => un(U::Identity),
            "Sin" => un(U::Sin),
            "Cos" => un(U::Cos),
            "Round" => un(U::Round),
            "Sign" => un(U::Sign),
            "Mish" => un(U::Mish),
            "Tan" => un(U::Tan),
            "Asin" => un(U::Asin),
            "Acos" => un(U::Acos),
            "Atan" => un(U::Atan),
            "Sinh" => un(U::Sinh),
            "Cosh" => un(U::Cosh),
            "Asinh" => un(U::Asinh),
            "Acosh" => un(U::Acosh),
            "Atanh" => un(U::Atanh),
            "Softsign" => un(U::Softsign),
            "Celu" => un(U::Celu(a.float_or("alpha", 1.0)?)),
            "Shrink" => un(U::Shrink(
                a.float_or("bias", 0.0)?,
                a.float_or("lambd", 0.5)?,
            )),
            "ThresholdedRelu" => un(U::ThresholdedRelu(a.float_or("alpha", 1.0)?)),
            "Swish" => un(U::Swish(a.float_or("alpha", 1.0)?)),
            "IsNaN" => un(U::IsNaN),
            "BitwiseNot" => un(U::BitwiseNot),
            "BitwiseAnd" => Ok(Some(Op::Binary(B::BitwiseAnd))),
            "BitwiseOr" => Ok(Some(Op::Binary(B::BitwiseOr))),
            "BitwiseXor" => Ok(Some(Op::Binary(B::BitwiseXor))),
            "BitShift" => Ok(Some(Op::Binary(match a.string("direction")?.as_deref() {
                Some("LEFT") => B::BitShiftLeft,
                Some("RIGHT") => B::BitShiftRight,
                d => {
                    return Err(format!(
                        "attribute \"direction\" is {d:?}, not LEFT or RIGHT"
                    ));
                }
            }))),
            "BitCast" => {
                let to = a.int("to")?.ok_or("BitCast needs the attribute \"to\"")?;
                let to = DType::from_onnx(to as i32).ok_or_else(|| {
                    format!("attribute \"to\": BitCast to element type {to} is not supported")
                })?;
                Ok(Some(Op::BitCast { to }))
            }
            "IsInf" => un(U::IsInf(
                a.int_or("detect_negative", 1)? != 0,
                a.int_or("detect_positive", 1)? != 0,
            )),
            "Mod" => Ok(Some(Op::Binary(if a.flag("fmod", false)? {
                B::Fmod
            } else {
                B::Mod
            }))),
            "Dropout" => Ok(Some(Op::Dropout)),
            "Clip" => Ok(Some(Op::Clip {
                min: a.float("min")?,
                max: a.float("max")?,
            })),
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater"
            | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" => {
                // Before opset 7, `broadcast=1` aligned B with A starting at `axis`.
                let legacy_axis = if opset < 7 && a.int_or("broadcast", 0)? != 0 {
                    Some(a.int("axis")?)
                } else {
                    None
                };
                let b = match op_type {
                    "Add" => B::Add,
                    "Sub" => B::Sub,
                    "Mul" => B::Mul,
                    "Div" => B::Div,
                    "Pow" => B::Pow,
                    "Equal" => B::Equal,
                    "Less" => B::Less,
                    "Greater" => B::Greater,
                    "LessOrEqual" => B::LessOrEqual,
                    "GreaterOrEqual" => B::GreaterOrEqual,
                    "And" => B::And,
                    "Or" => B::Or,
                    _ => B::Xor,
                };
                Ok(Some(match legacy_axis {
                    Some(axis) => Op::LegacyBroadcast(b, axis),
                    None => Op::Binary(b),
                }))
            }
            "Sum" => Ok(Some(Op::Variadic(B::Add, false))),
            "Mean" => Ok(Some(Op::Variadic(B::Add, true))),
            "Max" => Ok(Some(Op::Variadic(B::Max, false))),
            "Min" => Ok(Some(Op::Variadic(B::Min, false))),
            "PRelu" => Ok(Some(Op::PRelu)),
            "Where" => Ok(Some(Op::Where)),
            "Gemm" => Ok(Some(Op::Gemm(matmul::GemmAttrs::parse(a)?))),
            "MatMul" => Ok(Some(Op::MatMul {
                act: None,
                packed: None,
            })),
            "MaxPool" | "AveragePool" => Ok(Some(Op::Pool(pool::PoolAttrs::parse(
                a,
                op_type == "MaxPool",
                n_outputs,
            )?))),
            "MaxUnpool" => Ok(Some(Op::MaxUnpool(pool::UnpoolAttrs::parse(a)?))),
            "LpPool" => Ok(Some(Op::LpPool {
                pool: pool::PoolAttrs::parse(a, false, 1)?,
                p: match a.int_or("p", 2)? {
                    p @ 1..=64 => p as u32,
                    p => return Err(format!("attribute \"p\" is {p}, not within 1..=64")),
                },
            })),
            "GlobalAveragePool" => Ok(Some(Op::GlobalPool {
                max: false,
                nhwc: false,
            })),
            "GlobalMaxPool" => Ok(Some(Op::GlobalPool {
                max: true,
                nhwc: false,
            })),
            "LRN" => Ok(Some(Op::Lrn {
                size: a
                    .int("size")?
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or("LRN needs a positive size")?,
                alpha: a.float_or("alpha", 1e-4)?,
                beta: a.float_or("beta", 0.75)?,
                bias: a.float_or("bias", 1.0)?,
            })),
            "Softmax" | "LogSoftmax" => Ok(Some(Op::Softmax {
                axis: a.int_or("axis", if opset < 13 { 1 } else { -1 })?,
                log: op_type == "LogSoftmax",
                legacy: opset < 13,
                scale: 1.0,
            })),
            "LayerNormalization" => {
                if a.int_or("stash_type", 1)? != 1 {
                    return Err("only stash_type=1 (float) is supported".into());
                }
                Ok(Some(Op::LayerNorm {
                    axis: a.int_or("axis", -1)?,
                    eps: a.float_or("epsilon", 1e-5)?,
                    stats: n_outputs > 1,
                }))
            }
            "Attention" => Ok(Some(Op::Attention(attention::AttentionAttrs::parse(
                a, n_outputs,
            )?))),
            "RotaryEmbedding" => Ok(Some(Op::RotaryEmbedding(attention::RotaryAttrs::parse(a)?))),
            "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => Ok(Some(Op::Loss(
                loss::LossAttrs::parse(a, op_type == "SoftmaxCrossEntropyLoss")?,
            ))),
            "RMSNormalization" => {
                if a.int_or("stash_type", 1)? != 1 {
                    return Err("only stash_type=1 (float) is supported".into());
                }
                Ok(Some(Op::RmsNorm {
                    axis: a.int_or("axis", -1)?,
                    eps: a.float_or("epsilon", 1e-5)?,
                }))
            }
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL2"
            | "ReduceL1" | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => Ok(Some(
                Op::Reduce(reduce::ReduceAttrs::parse(op_type, a, opset)?),
            )),
            "Resize" | "Upsample" => Ok(Some(Op::Resize(resize::ResizeAttrs::parse(op_type, a)?))),
            "GridSample" => Ok(Some(Op::GridSample(grid::GridSampleAttrs::parse(a)?))),
            "RNN" | "GRU" | "LSTM" => Ok(Some(Op::Rnn(rnn::RnnAttrs::parse(op_type, a)?))),
            "AffineGrid" => Ok(Some(Op::AffineGrid {
                align_corners: a.flag("align_corners", false)?,
            })),
            "Cast" => {
                let to = a.int("to")?.ok_or("Cast needs `to`")?;
                let to = DType::from_onnx(to as i32)
                    .ok_or_else(|| format!("Cast to element type {to} is not supported"))?;
                Ok(Some(Op::Cast {
                    to,
                    mode: cast_mode(a)?,
                }))
            }
            "CastLike" => Ok(Some(Op::CastLike(cast_mode(a)?))),
            "NonMaxSuppression" => Ok(Some(Op::NonMaxSuppression {
                center_point_box: a.flag("center_point_box", false)?,
            })),
            "Einsum" => Ok(Some(Op::Einsum(einsum::Einsum::parse(
                &a.string("equation")?
                    .ok_or("Einsum needs the attribute \"equation\"")?,
            )?))),
            "CumSum" => Ok(Some(Op::CumSum {
                exclusive: a.int_or("exclusive", 0)? != 0,
                reverse: a.int_or("reverse", 0)? != 0,
            })),
            "CumProd" => Ok(Some(Op::CumProd {
                exclusive: a.int_or("exclusive", 0)? != 0,
                reverse: a.int_or("reverse", 0)? != 0,
            })),
            "LpNormalization" => Ok(Some(Op::LpNorm {
                axis: a.int_or("axis", -1)?,
                p: match a.int_or("p", 2)? {
                    1 => 1,
                    2 => 2,
                    p => return Err(format!("attribute \"p\" is {p}, not 1 or 2")),
                },
            })),
            "MeanVarianceNormalization" => Ok(Some(Op::MeanVarianceNorm {
                axes: a.ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]),
            })),
            "InstanceNormalization" => Ok(Some(Op::GroupNorm {
                groups: None,
                eps: a.float_or("epsilon", 1e-5)?,
                per_group: false,
            })),
            "GroupNormalization" => {
                if a.int_or("stash_type", 1)? != 1 {
                    return Err("only stash_type=1 (float) is supported".into());
                }
                let groups = a
                    .int("num_groups")?
                    .and_then(|g| usize::try_from(g).ok())
                    .filter(|&g| g > 0)
                    .ok_or("attribute \"num_groups\" must be given and positive")?;
                Ok(Some(Op::GroupNorm {
                    groups: Some(groups),
                    eps: a.float_or("epsilon", 1e-5)?,
                    // Opset 21 made scale and bias per channel.
                    per_group: opset < 21,
                }))
            }
            "DFT" => Ok(Some(Op::Dft(dft::DftAttrs {
                inverse: a.flag("inverse", false)?,
                onesided: a.flag("onesided", false)?,
                // Opset 20 made the axis an input.
                axis: if opset < 20 {
                    Some(a.int_or("axis", 1)?)
                } else {
                    None
                },
            }))),
            "STFT" => Ok(Some(Op::Stft {
                onesided: a.flag("onesided", true)?,
            })),
            "MelWeightMatrix" => {
                let to = a.int_or("output_datatype", 1)?;
                match DType::from_onnx(to as i32) {
                    Some(to @ (DType::F32 | DType::F64 | DType::F16 | DType::BF16)) => {
                        Ok(Some(Op::MelWeightMatrix { to }))
                    }
                    _ => Err(format!(
                        "attribute \"output_datatype\" {to} is not a float element type"
                    )),
                }
            }
            "Det" => Ok(Some(Op::Det)),
            "RoiAlign" => Ok(Some(Op::RoiAlign(roi_align::RoiAlignAttrs::parse(
                a, opset,
            )?))),
            "DeformConv" => Ok(Some(Op::DeformConv(deform_conv::DeformConvAttrs::parse(
                a,
            )?))),
            "TensorScatter" => Ok(Some(Op::TensorScatter(
                recurrent_state::ScatterAttrs::parse(a)?,
            ))),
            "CausalConvWithState" => Ok(Some(Op::CausalConv {
                silu: match a.string_or("activation", "none")?.as_str() {
                    "none" => false,
                    "silu" | "swish" => true,
                    other => {
                        return Err(format!(
                            "attribute \"activation\" is {other:?}, not none, silu or swish"
                        ));
                    }
                },
            })),
            "LinearAttention" => Ok(Some(Op::LinearAttention(
                recurrent_state::LinearAttentionAttrs::parse(a)?,
            ))),
            other => {
                if let Some(op) = index::IndexOp::parse(other, a, opset)? {
                    return Ok(Some(Op::Index(op)));
                }
                if let Some(op) = quant::QuantOp::parse(other, a)? {
                    return Ok(Some(Op::Quant(op)));
                }
                Ok(shape::ShapeOp::parse(other, a, opset, n_inputs, n_outputs)?.map(Op::Shape))
            }
        }
    }

    /// The ONNX-ish name for messages and per-op timing.
    pub fn name(&self) -> String {
        match self {
            Op::Conv(c) => {
                let kind = match c.kernel_shape.as_deref() {
                    _ if c.group > 1 => "(grouped)",
                    Some([1, 1]) | Some([1]) => "(1x1)",
                    _ => "",
                };
                let add = if c.residual { "+Add" } else { "" };
                let layout = if c.nhwc { "(NHWC)" } else { "" };
                format!("Conv{kind}{layout}{add}{}", act_suffix(c.act))
            }
            Op::PointwiseDepthwise(f) => {
                let project = f.project.as_ref().map_or(String::new(), |p| {
                    let add = if p.residual { "+Add" } else { "" };
                    format!("+Conv(1x1){add}{}", act_suffix(p.act))
                });
                let layout = if f.pointwise.nhwc { "(NHWC)" } else { "" };
                format!(
                    "Conv(1x1){}+Conv(depthwise){}{project}{layout}",
                    act_suffix(f.pointwise.act),
                    act_suffix(f.depthwise.act)
                )
            }
            Op::ConvTranspose(_) => "ConvTranspose".into(),
            Op::Col2Im(_) => "Col2Im".into(),
            Op::BatchNorm { .. } => "BatchNormalization".into(),
            Op::Unary(u) => format!("{u:?}"),
            Op::Clip { .. } => "Clip".into(),
            Op::Binary(b) | Op::LegacyBroadcast(b, _) => format!("{b:?}"),
            Op::Variadic(b, mean) => {
                if *mean {
                    "Mean".into()
                } else {
                    format!("{b:?}*")
                }
            }
            Op::PRelu => "PRelu".into(),
            Op::Where => "Where".into(),
            Op::Dropout => "Dropout".into(),
            Op::Gemm(g) => format!("Gemm{}", act_suffix(g.act)),
            Op::MatMul { act, packed } => format!(
                "MatMul{}{}",
                if packed.is_some() { "(packed)" } else { "" },
                act_suffix(*act)
            ),
            Op::Pool(p) => match (p.max, p.nhwc) {
                (true, true) => "MaxPool(NHWC)".into(),
                (true, false) => "MaxPool".into(),
                _ => "AveragePool".into(),
            },
            Op::LpPool { .. } => "LpPool".into(),
            Op::MaxUnpool(_) => "MaxUnpool".into(),
            Op::GlobalPool { max, nhwc } => {
                let kind = if *max {
                    "GlobalMaxPool"
                } else {
                    "GlobalAveragePool"
                };
                format!("{kind}{}", if *nhwc { "(NHWC)" } else { "" })
            }
            Op::Lrn { .. } => "LRN".into(),
            Op::Softmax { log, scale, .. } => format!(
                "{}{}",
                if *log { "LogSoftmax" } else { "Softmax" },
                if *scale != 1.0 { "(scaled)" } else { "" }
            ),
            Op::LayerNorm { .. } => "LayerNormalization".into(),
            Op::RmsNorm { .. } => "RMSNormalization".into(),
            Op::Attention(_) => "Attention".into(),
            Op::Loss(l) if l.softmax => "SoftmaxCrossEntropyLoss".into(),
            Op::Loss(_) => "NegativeLogLikelihoodLoss".into(),
            Op::RotaryEmbedding(_) => "RotaryEmbedding".into(),
            Op::Reduce(r) => format!("{:?}", r.kind),
            Op::Shape(s) => s.name().into(),
            Op::Resize(_) => "Resize".into(),
            Op::GridSample(_) => "GridSample".into(),
            Op::Rnn(r) => match r.cell {
                rnn::Cell::Rnn => "RNN".into(),
                rnn::Cell::Gru { .. } => "GRU".into(),
                rnn::Cell::Lstm => "LSTM".into(),
            },
            Op::AffineGrid { .. } => "AffineGrid".into(),
            Op::Cast { .. } => "Cast".into(),
            Op::CastLike(_) => "CastLike".into(),
            Op::BitCast { .. } => "BitCast".into(),
            Op::Index(i) => i.name().into(),
            Op::Quant(q) => q.name().into(),
            Op::NonMaxSuppression { .. } => "NonMaxSuppression".into(),
            Op::Einsum(_) => "Einsum".into(),
            Op::CumSum { .. } => "CumSum".into(),
            Op::CumProd { .. } => "CumProd".into(),
            Op::GroupNorm {
                groups: Some(_), ..
            } => "GroupNormalization".into(),
            Op::GroupNorm { groups: None, .. } => "InstanceNormalization".into(),
            Op::LpNorm { .. } => "LpNormalization".into(),
            Op::MeanVarianceNorm { .. } => "MeanVarianceNormalization".into(),
            Op::Control(c) => c.name().into(),
            Op::Dft(_) => "DFT".into(),
            Op::Stft { .. } => "STFT".into(),
            Op::MelWeightMatrix { .. } => "MelWeightMatrix".into(),
            Op::Det => "Det".into(),
            Op::RoiAlign(_) => "RoiAlign".into(),
            Op::DeformConv(_) => "DeformConv".into(),
            Op::TensorScatter(_) => "TensorScatter".into(),
            Op::CausalConv { .. } => "CausalConvWithState".into(),
            Op::LinearAttention(_) => "LinearAttention".into(),
            Op::MaskIndex(_) => "AttentionMaskIndex".into(),
            Op::TokenBias => "AttentionTokenBias".into(),
            Op::GroupQuery(_) => "GroupQueryAttention".into(),
        }
    }

    /// Runs the op on the CPU. An op reading float16 or bfloat16 computes in f32, as
    /// onnxruntime's CPU kernels do: its half inputs are widened (exactly), and each of its f32
    /// outputs is rounded to the half type of its first half input. Cast converts directly, and
    /// the quantization ops read half scales themselves; LayerNormalization's mean and inverse
    /// standard deviation stay f32 (`stash_type` 1).
    pub fn eval(&self, cx: &Cx, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        // Control flow moves values of any type into its bodies, whose ops convert them.
        if let Op::Control(c) = self {
            return c.eval(cx, inputs);
        }
        let low = inputs.iter().flatten().find_map(|t| match t.dtype() {
            DType::Low(l) => Some(l),
            _ => None,
        });
        if let Some(low) = low
            && !self.takes_low()
        {
            return Err(OpError::DType(format!(
                "{} of {low:?}: float8, float4, int4 and int2 tensors are only cast, quantized, \
                 dequantized and moved (reshaped, transposed, sliced, gathered, joined)",
                self.name()
            )));
        }
        let half = match self {
            Op::Cast { .. } | Op::CastLike(_) | Op::BitCast { .. } | Op::Quant(_) => None,
            _ => inputs
                .iter()
                .flatten()
                .map(|t| t.dtype())
                .find(|d| d.is_half()),
        };
        let Some(half) = half else {
            return self.eval_native(cx, inputs);
        };
        let wide: Vec<Option<std::borrow::Cow<Tensor>>> = inputs
            .iter()
            .map(|t| {
                t.map(|t| match t.dtype().is_half() {
                    true => std::borrow::Cow::Owned(widen(t)),
                    false => std::borrow::Cow::Borrowed(t),
                })
            })
            .collect();
        let refs: Vec<Option<&Tensor>> = wide.iter().map(|t| t.as_deref()).collect();
        let mut outs = self.eval_native(cx, &refs)?;
        let keep_f32 = match self {
            Op::LayerNorm { .. } => 1,
            _ => usize::MAX,
        };
        for (k, t) in outs.iter_mut().enumerate() {
            if k < keep_f32 && t.dtype() == DType::F32 {
                *t = narrow(t, half);
            }
        }
        Ok(outs)
    }

    /// The op takes low-bit inputs (`tensor::lowbit`): it converts them, or only moves their
    /// elements.
    fn takes_low(&self) -> bool {
        use index::IndexOp as I;
        use shape::ShapeOp as S;
        match self {
            Op::Cast { .. } | Op::CastLike(_) | Op::Unary(elementwise::Unary::Identity) => true,
            Op::Quant(q) => matches!(
                q,
                quant::QuantOp::Quantize(_) | quant::QuantOp::Dequantize(_)
            ),
            Op::Shape(s) => matches!(
                s,
                S::Reshape { .. }
                    | S::Flatten { .. }
                    | S::Transpose { .. }
                    | S::Squeeze { .. }
                    | S::Unsqueeze { .. }
                    | S::Expand
                    | S::Tile
                    | S::Concat { .. }
                    | S::Split { .. }
                    | S::Slice { .. }
                    | S::Gather { .. }
                    | S::Shape { .. }
                    | S::Size
            ),
            Op::Index(i) => matches!(i, I::GatherElements { .. } | I::GatherNd { .. }),
            _ => false,
        }
    }

    fn eval_native(&self, cx: &Cx, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let one = |t: OpResult<Tensor>| t.map(|t| vec![t]);
        match self {
            Op::Conv(c) => one(conv::conv(cx, c, inputs)),
            Op::PointwiseDepthwise(f) => one(conv::pointwise_depthwise(cx, f, inputs)),
            Op::ConvTranspose(c) => one(conv::conv_transpose(cx, c, inputs)),
            Op::Col2Im(c) => one(conv::col2im(c, inputs)),
            Op::BatchNorm { eps } => one(norm::batch_norm(inputs, *eps)),
            Op::Unary(u) => one(elementwise::unary(cx, *u, input(inputs, 0)?)),
            Op::Clip { min, max } => one(elementwise::clip(cx, inputs, *min, *max)),
            Op::Binary(b) => one(elementwise::binary_in(
                cx,
                *b,
                input(inputs, 0)?,
                input(inputs, 1)?,
            )),
            Op::LegacyBroadcast(b, axis) => one(elementwise::legacy_broadcast(
                *b,
                *axis,
                input(inputs, 0)?,
                input(inputs, 1)?,
            )),
            Op::Variadic(b, mean) => one(elementwise::variadic(*b, *mean, inputs)),
            Op::PRelu => one(elementwise::prelu(input(inputs, 0)?, input(inputs, 1)?)),
            Op::Where => one(elementwise::where_(
                input(inputs, 0)?,
                input(inputs, 1)?,
                input(inputs, 2)?,
            )),
            Op::Dropout => {
                let x = input(inputs, 0)?.clone();
                let mask = Tensor::new(
                    x.shape.clone(),
                    crate::tensor::Data::Bool(vec![true; x.len()]),
                )?;
                Ok(vec![x, mask])
            }
            Op::Gemm(g) => one(matmul::gemm(cx, g, inputs)),
            Op::MatMul {
                act,
                packed: Some(f),
            } => one(matmul::matmul_packed(
                cx,
                input(inputs, 0)?,
                f,
                opt_input(inputs, 2),
                *act,
            )),
            Op::MatMul { act, packed: None } => one(matmul::matmul(
                cx,
                input(inputs, 0)?,
                input(inputs, 1)?,
                opt_input(inputs, 2),
                *act,
            )),
            Op::Pool(p) => pool::pool(cx, p, input(inputs, 0)?),
            Op::LpPool { pool, p } => one(pool::lp_pool(pool, *p, input(inputs, 0)?)),
            Op::MaxUnpool(u) => one(pool::max_unpool(
                u,
                input(inputs, 0)?,
                input(inputs, 1)?,
                opt_input(inputs, 2),
            )),
            Op::GlobalPool { max, nhwc: false } => one(pool::global_pool(input(inputs, 0)?, *max)),
            Op::GlobalPool { max, nhwc: true } => {
                one(pool::global_pool_nhwc(input(inputs, 0)?, *max))
            }
            Op::Lrn {
                size,
                alpha,
                beta,
                bias,
            } => one(norm::lrn(input(inputs, 0)?, *size, *alpha, *beta, *bias)),
            Op::Softmax {
                axis,
                log,
                legacy,
                scale,
            } => one(norm::softmax(
                cx,
                input(inputs, 0)?,
                *axis,
                *log,
                *legacy,
                *scale,
            )),
            Op::LayerNorm { axis, eps, stats } => norm::layer_norm(cx, inputs, *axis, *eps, *stats),
            Op::RmsNorm { axis, eps } => one(norm::rms_norm(cx, inputs, *axis, *eps)),
            Op::Attention(a) => attention::attention(cx, a, inputs),
            Op::Loss(l) => loss::loss(cx, l, inputs),
            Op::RotaryEmbedding(r) => one(attention::rotary_embedding(r, inputs)),
            Op::Reduce(r) => one(reduce::reduce(r, inputs)),
            Op::Shape(shape::ShapeOp::Transpose { perm }) => one(shape::transpose_pooled(
                cx,
                input(inputs, 0)?,
                perm.as_deref(),
            )),
            Op::Shape(shape::ShapeOp::Concat { axis }) => {
                one(shape::concat_pooled(cx, inputs, *axis))
            }
            Op::Shape(s) => s.eval(inputs),
            Op::Resize(r) => one(resize::resize(cx, r, inputs)),
            Op::GridSample(g) => one(grid::grid_sample(g, input(inputs, 0)?, input(inputs, 1)?)),
            Op::Rnn(r) => rnn::rnn(r, inputs),
            Op::AffineGrid { align_corners } => one(grid::affine_grid(
                *align_corners,
                input(inputs, 0)?,
                input(inputs, 1)?,
            )),
            Op::Cast { to, mode } => {
                let x = input(inputs, 0)?;
                let pooled = (*to == DType::F32)
                    .then(|| elementwise::cast_to_f32(cx, x))
                    .flatten();
                one(Ok(
                    pooled.unwrap_or_else(|| elementwise::cast_with(x, *to, *mode))
                ))
            }
            Op::BitCast { to } => one(elementwise::bit_cast(input(inputs, 0)?, *to)),
            Op::CastLike(mode) => one(Ok(elementwise::cast_with(
                input(inputs, 0)?,
                input(inputs, 1)?.dtype(),
                *mode,
            ))),
            Op::Index(i) => i.eval(inputs),
            Op::Quant(q) => q.eval(cx, inputs),
            Op::NonMaxSuppression { center_point_box } => {
                one(nms::non_max_suppression(inputs, *center_point_box))
            }
            Op::Einsum(e) => one(e.eval(cx, inputs)),
            Op::CumSum { exclusive, reverse } => {
                one(reduce::cumulative(inputs, false, *exclusive, *reverse))
            }
            Op::CumProd { exclusive, reverse } => {
                one(reduce::cumulative(inputs, true, *exclusive, *reverse))
            }
            Op::GroupNorm {
                groups,
                eps,
                per_group,
            } => one(norm::group_norm(inputs, *groups, *eps, *per_group)),
            Op::LpNorm { axis, p } => one(norm::lp_norm(input(inputs, 0)?, *axis, *p)),
            Op::MeanVarianceNorm { axes } => one(norm::mean_variance_norm(input(inputs, 0)?, axes)),
            Op::Control(c) => c.eval(cx, inputs),
            Op::Dft(a) => one(dft::dft(a, inputs)),
            Op::Stft { onesided } => one(dft::stft(*onesided, inputs)),
            Op::MelWeightMatrix { to } => one(mel::mel_weight_matrix(*to, inputs)),
            Op::Det => one(det::det(input(inputs, 0)?)),
            Op::RoiAlign(a) => one(roi_align::roi_align(a, inputs)),
            Op::DeformConv(a) => one(deform_conv::deform_conv(a, inputs)),
            Op::TensorScatter(a) => one(recurrent_state::tensor_scatter(a, inputs)),
            Op::CausalConv { silu } => recurrent_state::causal_conv(*silu, inputs),
            Op::LinearAttention(a) => recurrent_state::linear_attention(a, inputs),
            Op::MaskIndex(a) => one(mask_index::additive_mask(
                a,
                opt_input(inputs, 0),
                input(inputs, 1)?,
                opt_input(inputs, 2),
                opt_input(inputs, 3),
            )),
            Op::GroupQuery(a) => group_query::group_query_attention(cx, a, inputs),
            Op::TokenBias => one(token_bias::token_bias(
                cx,
                input(inputs, 0)?,
                input(inputs, 1)?,
            )),
        }
    }
}

/// A float16 or bfloat16 tensor widened to f32 (exact); any other tensor as it is.
pub fn widen(t: &Tensor) -> Tensor {
    use half::slice::HalfFloatSliceExt;
    let data = match &t.data {
        Data::F16(v) => {
            let mut w = vec![0.0f32; v.len()];
            v.convert_to_f32_slice(&mut w);
            Data::F32(w)
        }
        Data::BF16(v) => {
            let mut w = vec![0.0f32; v.len()];
            v.convert_to_f32_slice(&mut w);
            Data::F32(w)
        }
        d => d.clone(),
    };
    Tensor {
        shape: t.shape.clone(),
        data,
    }
}

/// An f32 tensor rounded to `to` (float16 or bfloat16, to nearest even); any other tensor,
/// or another target, as it is.
pub fn narrow(t: &Tensor, to: DType) -> Tensor {
    use crate::tensor::{bf16, f16};
    use half::slice::HalfFloatSliceExt;
    let data = match (&t.data, to) {
        (Data::F32(v), DType::F16) => {
            let mut n = vec![f16::ZERO; v.len()];
            n.convert_from_f32_slice(v);
            Data::F16(n)
        }
        (Data::F32(v), DType::BF16) => {
            let mut n = vec![bf16::ZERO; v.len()];
            n.convert_from_f32_slice(v);
            Data::BF16(n)
        }
        (d, _) => d.clone(),
    };
    Tensor {
        shape: t.shape.clone(),
        data,
    }
}

/// The error of an op's own kernels handed half-precision data: `Op::eval` widens it first.
pub(crate) fn half_here() -> OpError {
    OpError::DType("float16/bfloat16 reach this kernel only widened to f32 (Op::eval)".into())
}

fn act_suffix(a: Option<Activation>) -> String {
    a.map_or(String::new(), |a| format!("+{a:?}"))
}

/// Required input `i`.
pub fn input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> OpResult<&'a Tensor> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or(OpError::MissingInput(i))
}

/// Optional input `i`.
pub fn opt_input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Option<&'a Tensor> {
    inputs.get(i).copied().flatten()
}

/// Cast's `saturate` and `round_mode` attributes.
fn cast_mode(a: &Attrs) -> Result<CastMode, String> {
    let round = a.string_or("round_mode", "up")?;
    Ok(CastMode {
        saturate: a.flag("saturate", true)?,
        e8m0: E8M0Round::parse(&round).ok_or_else(|| {
            format!("attribute \"round_mode\" is {round:?}, not up, down or nearest")
        })?,
    })
}

/// The value of a `Constant` node.
pub fn constant_attr(a: &Attrs) -> Result<Tensor, String> {
    if let Some(t) = a.tensor("value")? {
        return Ok(t);
    }
    if let Some(f) = a.float("value_float")? {
        return Ok(Tensor::scalar_f32(f));
    }
    if let Some(v) = a.floats("value_floats")? {
        return Tensor::f32(vec![v.len()], v).map_err(|e| e.to_string());
    }
    if let Some(i) = a.int("value_int")? {
        return Tensor::i64(vec![], vec![i]).map_err(|e| e.to_string());
    }
    if let Some(v) = a.ints("value_ints")? {
        return Tensor::i64(vec![v.len()], v).map_err(|e| e.to_string());
    }
    Err(
        "Constant without a supported value attribute (sparse and string values are not supported)"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Low;

    #[test]
    fn low_bit_tensors_are_cast_and_moved_but_not_computed_with() {
        let cx = Cx::new(1);
        let x = Tensor::f32(vec![2, 2], vec![1.0, -2.0, 0.5, 1000.0]).unwrap();
        let to = DType::Low(Low::F8E4M3FN);
        let cast = |saturate| Op::Cast {
            to,
            mode: CastMode {
                saturate,
                ..CastMode::default()
            },
        };
        let y = cast(true).eval(&cx, &[Some(&x)]).unwrap().remove(0);
        assert_eq!(y.to_f64_vec(), vec![1.0, -2.0, 0.5, 448.0]);
        let nan = cast(false).eval(&cx, &[Some(&x)]).unwrap().remove(0);
        assert!(nan.to_f64_vec()[3].is_nan());
        let t = Op::Shape(shape::ShapeOp::Transpose { perm: None })
            .eval(&cx, &[Some(&y)])
            .unwrap()
            .remove(0);
        assert_eq!(t.dtype(), to);
        assert_eq!(t.to_f64_vec(), vec![1.0, 0.5, -2.0, 448.0]);
        let joined = Op::Shape(shape::ShapeOp::Concat { axis: 0 })
            .eval(&cx, &[Some(&y), Some(&t)])
            .unwrap()
            .remove(0);
        assert_eq!(joined.shape, vec![4, 2]);
        let e = Op::Unary(elementwise::Unary::Relu)
            .eval(&cx, &[Some(&y)])
            .unwrap_err();
        assert!(e.to_string().contains("F8E4M3FN"), "{e}");
        // int4 back to int8 sign-extends.
        let i4 = Tensor::new(vec![2], Data::Low(Low::I4, vec![0xf, 0x7])).unwrap();
        let back = elementwise::cast(&i4, DType::I8);
        assert_eq!(back.data, Data::I8(vec![-1, 7]));
    }
}
