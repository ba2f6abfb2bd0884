//! The CUDA kernels: their sources (`kernels/cuda/*.cu`, embedded here so every build carries
//! them), the typed name of every entry point, and the typed codes their `int` arguments take.
//! Nothing here needs CUDA: the executor's device layer compiles the sources with NVRTC where a
//! GPU exists, and its simulated device runs a CPU rendering of each [`Kernel`].

/// One `.cu` file and the kernels it defines.
pub struct Source {
    pub file: &'static str,
    raw: &'static str,
    pub kernels: &'static [Kernel],
}

impl Source {
    /// The source as NVRTC compiles it: every `#include "x.cuh"` line replaced by that header
    /// (`compile_check.py` does the same), so each file compiles on its own.
    pub fn code(&self) -> String {
        let mut out = String::with_capacity(self.raw.len() + 1024);
        for line in self.raw.lines() {
            let header = line
                .trim_end()
                .strip_prefix("#include \"")
                .and_then(|l| l.strip_suffix('"'))
                .and_then(|name| HEADERS.iter().find(|(n, _)| *n == name));
            match header {
                Some((_, text)) => out.push_str(text),
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }
}

/// Headers the sources include, by name.
pub const HEADERS: &[(&str, &str)] = &[("activation.cuh", include_str!("../cuda/activation.cuh"))];

macro_rules! cu {
    ($file:literal, [$($k:ident),* $(,)?]) => {
        Source {
            file: $file,
            raw: include_str!(concat!("../cuda/", $file)),
            kernels: &[$(Kernel::$k),*],
        }
    };
}

/// Every kernel source with its entry points.
pub const SOURCES: &[Source] = &[
    cu!("conv.cu", [Im2col, Conv2dDirect, DepthwiseConv2d]),
    cu!(
        "copy.cu",
        [StridedCopy, Transpose2d, GatherI64, GatherI32, Fill, Pad]
    ),
    cu!(
        "elementwise.cu",
        [EwBinary, EwBinaryBcast, EwScalar, EwUnary]
    ),
    cu!(
        "epilogue.cu",
        [
            EpilogueBiasAct,
            EpilogueBiasResidualAct,
            EpilogueScaleShiftAct
        ]
    ),
    cu!("layernorm.cu", [LayerNorm, RmsNorm]),
    cu!(
        "pool.cu",
        [MaxPool2d, AvgPool2d, GlobalAvgPool, GlobalMaxPool]
    ),
    cu!("reduce.cu", [ReduceAxis, ReduceLastAxis]),
    cu!("softmax.cu", [Softmax, LogSoftmax]),
];

/// One kernel entry point; its argument list is in its file's header comment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    Im2col,
    Conv2dDirect,
    DepthwiseConv2d,
    StridedCopy,
    Transpose2d,
    GatherI64,
    GatherI32,
    Fill,
    Pad,
    EwBinary,
    EwBinaryBcast,
    EwScalar,
    EwUnary,
    EpilogueBiasAct,
    EpilogueBiasResidualAct,
    EpilogueScaleShiftAct,
    LayerNorm,
    RmsNorm,
    MaxPool2d,
    AvgPool2d,
    GlobalAvgPool,
    GlobalMaxPool,
    ReduceAxis,
    ReduceLastAxis,
    Softmax,
    LogSoftmax,
}

impl Kernel {
    /// The `extern "C"` name NVRTC compiles it under.
    pub const fn name(self) -> &'static str {
        match self {
            Kernel::Im2col => "im2col_nchw_f32",
            Kernel::Conv2dDirect => "conv2d_direct_nchw_f32",
            Kernel::DepthwiseConv2d => "depthwise_conv2d_nchw_f32",
            Kernel::StridedCopy => "strided_copy_f32",
            Kernel::Transpose2d => "transpose2d_tiled_f32",
            Kernel::GatherI64 => "gather_axis_i64_f32",
            Kernel::GatherI32 => "gather_axis_i32_f32",
            Kernel::Fill => "fill_f32",
            Kernel::Pad => "pad_f32",
            Kernel::EwBinary => "ew_binary_f32",
            Kernel::EwBinaryBcast => "ew_binary_bcast_f32",
            Kernel::EwScalar => "ew_scalar_f32",
            Kernel::EwUnary => "ew_unary_f32",
            Kernel::EpilogueBiasAct => "epilogue_bias_act_f32",
            Kernel::EpilogueBiasResidualAct => "epilogue_bias_residual_act_f32",
            Kernel::EpilogueScaleShiftAct => "epilogue_scale_shift_act_f32",
            Kernel::LayerNorm => "layernorm_lastaxis_f32",
            Kernel::RmsNorm => "rmsnorm_lastaxis_f32",
            Kernel::MaxPool2d => "maxpool2d_nchw_f32",
            Kernel::AvgPool2d => "avgpool2d_nchw_f32",
            Kernel::GlobalAvgPool => "global_avgpool_nchw_f32",
            Kernel::GlobalMaxPool => "global_maxpool_nchw_f32",
            Kernel::ReduceAxis => "reduce_axis_f32",
            Kernel::ReduceLastAxis => "reduce_lastaxis_f32",
            Kernel::Softmax => "softmax_lastaxis_f32",
            Kernel::LogSoftmax => "log_softmax_lastaxis_f32",
        }
    }

    /// Every kernel, in source order.
    pub fn all() -> impl Iterator<Item = Kernel> {
        SOURCES.iter().flat_map(|s| s.kernels.iter().copied())
    }

    /// The source that defines it.
    pub fn source(self) -> &'static Source {
        SOURCES
            .iter()
            .find(|s| s.kernels.contains(&self))
            .unwrap_or(&SOURCES[0])
    }
}

/// `Dims6` of elementwise.cu and copy.cu (`struct { long long d[6]; }`, passed by value): shapes
/// and strides of rank at most [`Dims6::RANK`]; entries past the rank are 0 and ignored.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dims6(pub [i64; 6]);

impl Dims6 {
    pub const RANK: usize = 6;

    /// The first `v.len()` entries (at most 6), the rest 0.
    pub fn new(v: &[i64]) -> Option<Dims6> {
        if v.len() > Self::RANK {
            return None;
        }
        let mut d = [0i64; 6];
        d[..v.len()].copy_from_slice(v);
        Some(Dims6(d))
    }

    pub fn from_usizes(v: &[usize]) -> Option<Dims6> {
        let v: Option<Vec<i64>> = v.iter().map(|&x| i64::try_from(x).ok()).collect();
        Dims6::new(&v?)
    }
}

/// `op` of ew_unary_f32 (elementwise.cu).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryCode {
    Identity = 0,
    Relu = 1,
    Sigmoid = 2,
    Tanh = 3,
    GeluErf = 4,
    GeluTanh = 5,
    Exp = 6,
    Log = 7,
    Sqrt = 8,
    Rsqrt = 9,
    Abs = 10,
    Neg = 11,
    Reciprocal = 12,
    LeakyRelu = 13,
    Elu = 14,
    Clip = 15,
    HardSigmoid = 16,
    HardSwish = 17,
    Softplus = 18,
    Silu = 19,
    Erf = 20,
    Sin = 21,
    Cos = 22,
    Floor = 23,
    Ceil = 24,
    Round = 25,
    Sign = 26,
    Relu6 = 27,
    Selu = 28,
    Mish = 29,
}

/// `op` of ew_binary_f32, ew_binary_bcast_f32 and ew_scalar_f32 (elementwise.cu).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryCode {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    Max = 4,
    Min = 5,
    Pow = 6,
    Mod = 7,
}

/// `act` of the fused activations (activation.cuh: conv.cu and epilogue.cu).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActCode {
    None = 0,
    Relu = 1,
    Relu6 = 2,
    LeakyRelu = 3,
    Sigmoid = 4,
    GeluErf = 5,
    Silu = 6,
    Tanh = 7,
    HardSwish = 8,
    Clip = 9,
}

/// `op` of reduce_axis_f32 and reduce_lastaxis_f32 (reduce.cu).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceCode {
    Sum = 0,
    Mean = 1,
    Max = 2,
    Min = 3,
    Prod = 4,
    SumSquare = 5,
    L1 = 6,
    L2 = 7,
    LogSumExp = 8,
}

/// `mode` of pad_f32 (copy.cu).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    Constant = 0,
    Reflect = 1,
    Edge = 2,
    Wrap = 3,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each file's kernels are exactly the `extern "C" __global__` functions it defines, under the
    /// names [`Kernel::name`] gives, and no name is defined twice.
    #[test]
    fn every_kernel_is_defined_where_its_source_says() {
        let mut seen = std::collections::HashSet::new();
        for s in SOURCES {
            let code = s.code();
            let defined: Vec<&str> = code
                .split("extern \"C\" __global__")
                .skip(1)
                .filter_map(|rest| {
                    let head = rest.split('(').next()?;
                    head.split_whitespace().last()
                })
                .collect();
            let listed: Vec<&str> = s.kernels.iter().map(|k| k.name()).collect();
            assert_eq!(defined, listed, "{}", s.file);
            for k in s.kernels {
                assert!(seen.insert(*k), "{k:?} listed twice");
                assert_eq!(k.source().file, s.file);
            }
        }
    }

    #[test]
    fn includes_are_resolved_and_the_activation_switch_is_in_one_place() {
        for s in SOURCES {
            let code = s.code();
            let unresolved = code.lines().any(|l| l.trim_start().starts_with("#include"));
            assert!(!unresolved, "{}: unresolved include", s.file);
            let copies = code.matches("float activate(").count();
            let raw_copies = s.raw.matches("float activate(").count();
            assert_eq!(raw_copies, 0, "{}: its own activation switch", s.file);
            assert!(copies <= 1, "{}", s.file);
        }
        let users: Vec<&str> = SOURCES
            .iter()
            .filter(|s| s.code().contains("float activate("))
            .map(|s| s.file)
            .collect();
        assert_eq!(users, ["conv.cu", "epilogue.cu"]);
    }

    #[test]
    fn dims_hold_at_most_six() {
        assert_eq!(Dims6::new(&[2, 3]), Some(Dims6([2, 3, 0, 0, 0, 0])));
        assert_eq!(Dims6::new(&[1; 7]), None);
        assert_eq!(Dims6::from_usizes(&[usize::MAX]), None);
    }
}
