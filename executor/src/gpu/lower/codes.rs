//! The executor's ops as the typed codes the kernels take.

use super::{Lowered, decline};
use crate::ops::Activation;
use crate::ops::elementwise::{Binary, Unary};
use crate::ops::reduce::ReduceKind;
use cotenant_kernels::cuda::{ActCode, BinaryCode, ReduceCode, UnaryCode};

/// ew_unary_f32's (op, alpha, beta) for `u`; None where it has no code.
pub fn unary(u: Unary) -> Option<(UnaryCode, f32, f32)> {
    use UnaryCode as C;
    Some(match u {
        Unary::Relu => (C::Relu, 0.0, 0.0),
        Unary::Sigmoid => (C::Sigmoid, 0.0, 0.0),
        Unary::Tanh => (C::Tanh, 0.0, 0.0),
        Unary::Gelu(false) => (C::GeluErf, 0.0, 0.0),
        Unary::Gelu(true) => (C::GeluTanh, 0.0, 0.0),
        Unary::Exp => (C::Exp, 0.0, 0.0),
        Unary::Log => (C::Log, 0.0, 0.0),
        Unary::Sqrt => (C::Sqrt, 0.0, 0.0),
        Unary::Abs => (C::Abs, 0.0, 0.0),
        Unary::Neg => (C::Neg, 0.0, 0.0),
        Unary::Reciprocal => (C::Reciprocal, 0.0, 0.0),
        Unary::LeakyRelu(a) => (C::LeakyRelu, a, 0.0),
        Unary::Elu(a) => (C::Elu, a, 0.0),
        Unary::HardSigmoid(a, b) => (C::HardSigmoid, a, b),
        Unary::HardSwish => (C::HardSwish, 0.0, 0.0),
        Unary::Softplus => (C::Softplus, 0.0, 0.0),
        Unary::Erf => (C::Erf, 0.0, 0.0),
        Unary::Floor => (C::Floor, 0.0, 0.0),
        Unary::Ceil => (C::Ceil, 0.0, 0.0),
        Unary::Selu(a, g) => (C::Selu, a, g),
        Unary::Not | Unary::Identity => return None,
        Unary::Sin | Unary::Cos | Unary::Round | Unary::Sign | Unary::Mish => return None,
        Unary::Tan
        | Unary::Asin
        | Unary::Acos
        | Unary::Atan
        | Unary::Sinh
        | Unary::Cosh
        | Unary::Asinh
        | Unary::Acosh
        | Unary::Atanh
        | Unary::Softsign
        | Unary::Celu(_)
        | Unary::Shrink(..)
        | Unary::ThresholdedRelu(_)
        | Unary::Swish(_)
        | Unary::IsInf(..)
        | Unary::IsNaN
        | Unary::BitwiseNot => return None,
    })
}

/// The binary code of f32 arithmetic (comparisons and logic have none).
pub fn binary(b: Binary) -> Option<BinaryCode> {
    Some(match b {
        Binary::Add => BinaryCode::Add,
        Binary::Sub => BinaryCode::Sub,
        Binary::Mul => BinaryCode::Mul,
        Binary::Div => BinaryCode::Div,
        Binary::Max => BinaryCode::Max,
        Binary::Min => BinaryCode::Min,
        Binary::Pow => BinaryCode::Pow,
        _ => return None,
    })
}

/// A fused activation: in an epilogue's `act` argument, or (HardSigmoid has no epilogue code)
/// as a separate unary pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    Epilogue(ActCode, f32, f32),
    Unary(UnaryCode, f32, f32),
}

impl Act {
    pub const NONE: Act = Act::Epilogue(ActCode::None, 0.0, 0.0);

    /// (act, alpha, beta) for an epilogue; none when the activation needs its own pass.
    pub fn epilogue(self) -> (ActCode, f32, f32) {
        match self {
            Act::Epilogue(c, a, b) => (c, a, b),
            Act::Unary(..) => (ActCode::None, 0.0, 0.0),
        }
    }
}

pub fn act(a: Option<Activation>) -> Lowered<Act> {
    Ok(match a {
        None => Act::NONE,
        Some(Activation::Relu) => Act::Epilogue(ActCode::Relu, 0.0, 0.0),
        Some(Activation::LeakyRelu(al)) => Act::Epilogue(ActCode::LeakyRelu, al, 0.0),
        Some(Activation::Sigmoid) => Act::Epilogue(ActCode::Sigmoid, 0.0, 0.0),
        Some(Activation::Gelu) => Act::Epilogue(ActCode::GeluErf, 0.0, 0.0),
        Some(Activation::Tanh) => Act::Epilogue(ActCode::Tanh, 0.0, 0.0),
        Some(Activation::HardSwish) => Act::Epilogue(ActCode::HardSwish, 0.0, 0.0),
        Some(Activation::Clip(lo, hi)) => Act::Epilogue(ActCode::Clip, lo, hi),
        Some(Activation::HardSigmoid(al, be)) => Act::Unary(UnaryCode::HardSigmoid, al, be),
        // Only the CPU passes fuse SiLU.
        Some(Activation::Silu) => return decline("a SiLU epilogue"),
    })
}

/// The reduction code of a kind the device has a kernel for.
pub fn reduce(k: ReduceKind) -> Option<ReduceCode> {
    Some(match k {
        ReduceKind::ReduceSum => ReduceCode::Sum,
        ReduceKind::ReduceMean => ReduceCode::Mean,
        ReduceKind::ReduceMax => ReduceCode::Max,
        ReduceKind::ReduceMin => ReduceCode::Min,
        ReduceKind::ReduceProd => ReduceCode::Prod,
        ReduceKind::ReduceSumSquare => ReduceCode::SumSquare,
        ReduceKind::ReduceL1 => ReduceCode::L1,
        ReduceKind::ReduceL2 => ReduceCode::L2,
        ReduceKind::ReduceLogSum | ReduceKind::ReduceLogSumExp => return None,
    })
}
