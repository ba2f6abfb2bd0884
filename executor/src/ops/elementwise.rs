//! Pointwise ops: unary math and activations, numpy-broadcast binary arithmetic (Mod included),
//! comparisons and logic, Clip, PRelu, Where, variadic Sum/Max/Min/Mean and Cast.

use super::{Activation, Cx, input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{CastMode, DType, Data, Tensor, checked_numel, strides};
use cotenant_kernels::activation::{erf, map_inplace, tanh};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    Relu,
    LeakyRelu(f32),
    Sigmoid,
    HardSigmoid(f32, f32),
    HardSwish,
    Tanh,
    Elu(f32),
    Selu(f32, f32),
    Softplus,
    Erf,
    /// `true`: the tanh approximation.
    Gelu(bool),
    Sqrt,
    Exp,
    Log,
    Neg,
    Abs,
    Reciprocal,
    Floor,
    Ceil,
    Not,
    Identity,
    Sin,
    Cos,
    /// To the nearest integer, halves to even.
    Round,
    Sign,
    Mish,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    /// `x / (1 + |x|)`.
    Softsign,
    /// `max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`, with alpha.
    Celu(f32),
    /// `x + bias` below `-lambd`, `x - bias` above `lambd`, else 0: (bias, lambd).
    Shrink(f32, f32),
    /// `x` where `x > alpha`, else 0.
    ThresholdedRelu(f32),
    /// `x * sigmoid(alpha * x)`.
    Swish(f32),
    /// Whether each element is infinite, counting (negative, positive) infinities: bool out.
    IsInf(bool, bool),
    /// Whether each element is NaN: bool out.
    IsNaN,
    /// Every bit of an integer flipped.
    BitwiseNot,
}

impl Unary {
    /// The kernel activation this op is, when it can be fused into a producer.
    pub fn as_activation(self) -> Option<Activation> {
        Some(match self {
            Unary::Relu => Activation::Relu,
            Unary::LeakyRelu(a) => Activation::LeakyRelu(a),
            Unary::Sigmoid => Activation::Sigmoid,
            Unary::HardSigmoid(a, b) => Activation::HardSigmoid(a, b),
            Unary::HardSwish => Activation::HardSwish,
            Unary::Swish(1.0) => Activation::Silu,
            Unary::Tanh => Activation::Tanh,
            Unary::Gelu(false) => Activation::Gelu,
            _ => return None,
        })
    }

    fn f32(self, x: f32) -> f32 {
        match self {
            Unary::Elu(a) => {
                if x < 0.0 {
                    a * (x.exp() - 1.0)
                } else {
                    x
                }
            }
            Unary::Selu(a, g) => {
                if x <= 0.0 {
                    g * (a * x.exp() - a)
                } else {
                    g * x
                }
            }
            Unary::Softplus => {
                // Stable for large |x|.
                if x > 20.0 { x } else { x.exp().ln_1p() }
            }
            Unary::Erf => erf(x),
            Unary::Gelu(false) => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
            Unary::Gelu(true) => gelu_tanh(x),
            Unary::Sqrt => x.sqrt(),
            Unary::Exp => x.exp(),
            Unary::Log => x.ln(),
            Unary::Neg => -x,
            Unary::Abs => x.abs(),
            Unary::Reciprocal => 1.0 / x,
            Unary::Floor => x.floor(),
            Unary::Ceil => x.ceil(),
            Unary::Identity => x,
            Unary::Sin => x.sin(),
            Unary::Cos => x.cos(),
            Unary::Round => x.round_ties_even(),
            // Zero and NaN are their own sign.
            Unary::Sign => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                }
            }
            Unary::Mish => x * Unary::Softplus.f32(x).tanh(),
            // Computed in f64 and rounded once.
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
            | Unary::Swish(_) => self.f64(x as f64) as f32,
            other => other.as_activation().map_or(x, |a| a.apply(x)),
        }
    }

    fn f64(self, x: f64) -> f64 {
        match self {
            Unary::Sqrt => x.sqrt(),
            Unary::Exp => x.exp(),
            Unary::Log => x.ln(),
            Unary::Neg => -x,
            Unary::Abs => x.abs(),
            Unary::Reciprocal => 1.0 / x,
            Unary::Floor => x.floor(),
            Unary::Ceil => x.ceil(),
            Unary::Tanh => x.tanh(),
            Unary::Relu => x.max(0.0),
            Unary::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Unary::Identity => x,
            Unary::Sin => x.sin(),
            Unary::Cos => x.cos(),
            Unary::Round => x.round_ties_even(),
            Unary::Sign => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                }
            }
            Unary::Mish => x * (if x > 20.0 { x } else { x.exp().ln_1p() }).tanh(),
            Unary::Tan => x.tan(),
            Unary::Asin => x.asin(),
            Unary::Acos => x.acos(),
            Unary::Atan => x.atan(),
            Unary::Sinh => x.sinh(),
            Unary::Cosh => x.cosh(),
            Unary::Asinh => x.asinh(),
            Unary::Acosh => x.acosh(),
            Unary::Atanh => x.atanh(),
            Unary::Softsign => x / (1.0 + x.abs()),
            Unary::Celu(a) => {
                let a = a as f64;
                x.max(0.0) + (a * ((x / a).exp() - 1.0)).min(0.0)
            }
            Unary::Shrink(bias, lambd) => {
                let (bias, lambd) = (bias as f64, lambd as f64);
                if x < -lambd {
                    x + bias
                } else if x > lambd {
                    x - bias
                } else {
                    0.0
                }
            }
            Unary::ThresholdedRelu(a) => {
                if x > a as f64 {
                    x
                } else {
                    0.0
                }
            }
            Unary::Swish(a) => x / (1.0 + (-(a as f64) * x).exp()),
            other => other.f32(x as f32) as f64,
        }
    }
}

/// GELU with the tanh approximation.
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)))
}

pub fn unary(cx: &Cx, u: Unary, x: &Tensor) -> OpResult<Tensor> {
    let shape = x.shape.clone();
    let data = match (&x.data, u) {
        (_, Unary::Identity) => x.data.clone(),
        (_, Unary::IsNaN | Unary::IsInf(..)) => Data::Bool(classify(u, x)?),
        (Data::F32(_) | Data::F64(_), Unary::Not | Unary::BitwiseNot) => {
            return Err(OpError::DType(format!("{u:?} on {:?}", x.dtype())));
        }
        (Data::F32(v), _) => {
            let mut out = cx.take_f32(v.len());
            match u.as_activation() {
                Some(a) => a.apply_into(cx.threads, v, &mut out),
                None => {
                    out.copy_from_slice(v);
                    let t = cx.threads;
                    // One call-free function per arm vectorises; `u.f32` matches per element.
                    match u {
                        Unary::Erf => map_inplace(t, &mut out, erf),
                        Unary::Gelu(true) => map_inplace(t, &mut out, gelu_tanh),
                        Unary::Sqrt => map_inplace(t, &mut out, f32::sqrt),
                        Unary::Neg => map_inplace(t, &mut out, |x| -x),
                        Unary::Abs => map_inplace(t, &mut out, f32::abs),
                        Unary::Reciprocal => map_inplace(t, &mut out, |x| 1.0 / x),
                        Unary::Floor => map_inplace(t, &mut out, f32::floor),
                        Unary::Ceil => map_inplace(t, &mut out, f32::ceil),
                        Unary::Round => map_inplace(t, &mut out, f32::round_ties_even),
                        _ => map_inplace(t, &mut out, move |x| u.f32(x)),
                    }
                }
            }
            Data::F32(out)
        }
        (Data::F64(v), _) => Data::F64(v.iter().map(|&x| u.f64(x)).collect()),
        (Data::Bool(v), Unary::Not) => Data::Bool(v.iter().map(|&x| !x).collect()),
        (d, _) => crate::map_int!(d, v => int_unary(u, v)?, d => {
            return Err(OpError::DType(format!("{u:?} on {:?}", d.dtype())));
        }),
    };
    Ok(Tensor { shape, data })
}

/// IsNaN or IsInf of every element of a float tensor.
fn classify(u: Unary, x: &Tensor) -> OpResult<Vec<bool>> {
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Err(OpError::DType(format!("{u:?} on {:?}", x.dtype())));
    }
    let test = |v: f64| match u {
        Unary::IsInf(negative, positive) => {
            v.is_infinite() && if v < 0.0 { negative } else { positive }
        }
        _ => v.is_nan(),
    };
    Ok(x.to_f64_vec().into_iter().map(test).collect())
}

/// `u` on integers: Neg, Abs, Relu, Sign and BitwiseNot (Neg of signed types only); wrapping
/// where the result does not fit (the negation of the most negative value is itself).
fn int_unary<T: Int>(u: Unary, v: &[T]) -> OpResult<Vec<T>> {
    let f: fn(T) -> T = match u {
        Unary::Neg if T::SIGNED => T::wrapping_neg,
        Unary::Abs => T::wrapping_abs,
        Unary::Relu => |x| if x < T::ZERO { T::ZERO } else { x },
        Unary::Sign => T::sign,
        Unary::BitwiseNot => |x| !x,
        _ => {
            return Err(OpError::DType(format!(
                "{u:?} on {}",
                std::any::type_name::<T>()
            )));
        }
    };
    Ok(v.iter().map(|&x| f(x)).collect())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    /// Integer remainder with the divisor's sign (Python's `%`): Mod with `fmod=0`.
    Mod,
    /// Remainder with the dividend's sign (C's `fmod`): Mod with `fmod=1`.
    Fmod,
    Equal,
    Less,
    Greater,
    LessOrEqual,
    GreaterOrEqual,
    And,
    Or,
    Xor,
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
    /// BitShift with direction LEFT: shifts of the width or more give 0.
    BitShiftLeft,
    /// BitShift with direction RIGHT.
    BitShiftRight,
}

impl Binary {
    /// An op on the bits of integers.
    fn is_bitwise(self) -> bool {
        matches!(
            self,
            Binary::BitwiseAnd
                | Binary::BitwiseOr
                | Binary::BitwiseXor
                | Binary::BitShiftLeft
                | Binary::BitShiftRight
        )
    }
}

/// The numpy broadcast of two shapes.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> OpResult<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return shape_err(format!("cannot broadcast {a:?} with {b:?}"));
        };
    }
    checked_numel(&out)?;
    Ok(out)
}

/// Strides of `shape` when broadcast to `out` (0 along broadcast axes).
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let st = strides(shape);
    let off = out.len() - shape.len();
    (0..out.len())
        .map(|i| {
            if i < off || shape[i - off] == 1 {
                0
            } else {
                st[i - off]
            }
        })
        .collect()
}

/// Applies `f` over two broadcast operands; the innermost axis runs as a tight loop.
pub fn broadcast_map<T: Copy, U>(
    a: &[T],
    ash: &[usize],
    b: &[T],
    bsh: &[usize],
    out: &[usize],
    f: impl Fn(T, T) -> U,
) -> Vec<U> {
    let n: usize = out.iter().product();
    if ash == bsh && a.len() == n {
        return a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
    }
    if b.len() == 1 && a.len() == n {
        let y = b[0];
        return a.iter().map(|&x| f(x, y)).collect();
    }
    if a.len() == 1 && b.len() == n {
        let x = a[0];
        return b.iter().map(|&y| f(x, y)).collect();
    }
    let mut res = Vec::with_capacity(n);
    if n == 0 {
        return res;
    }
    let sa = broadcast_strides(ash, out);
    let sb = broadcast_strides(bsh, out);
    let r = out.len();
    let inner = out[r - 1];
    let (ia, ib) = (sa[r - 1], sb[r - 1]);
    let mut idx = vec![0usize; r];
    let (mut oa, mut ob) = (0usize, 0usize);
    for _ in 0..n / inner {
        match (ia, ib) {
            (1, 1) => res.extend(
                a[oa..oa + inner]
                    .iter()
                    .zip(&b[ob..ob + inner])
                    .map(|(&x, &y)| f(x, y)),
            ),
            (1, 0) => {
                let y = b[ob];
                res.extend(a[oa..oa + inner].iter().map(|&x| f(x, y)))
            }
            (0, 1) => {
                let x = a[oa];
                res.extend(b[ob..ob + inner].iter().map(|&y| f(x, y)))
            }
            _ => res.extend((0..inner).map(|i| f(a[oa + i * ia], b[ob + i * ib]))),
        }
        // Advance the outer multi-index (all axes but the last).
        for ax in (0..r - 1).rev() {
            idx[ax] += 1;
            oa += sa[ax];
            ob += sb[ax];
            if idx[ax] < out[ax] {
                break;
            }
            oa -= sa[ax] * out[ax];
            ob -= sb[ax] * out[ax];
            idx[ax] = 0;
        }
    }
    res
}

/// The element types arithmetic runs on.
pub(crate) trait Num: Copy + PartialOrd {
    const FLOAT: bool;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn pow(self, o: Self) -> Self;
    /// Remainder with the sign of the dividend.
    fn rem_trunc(self, o: Self) -> Self;
    /// Remainder with the sign of the divisor.
    fn rem_floor(self, o: Self) -> Self;
    /// `v` converted as Cast does (integers saturate, NaN becomes 0).
    fn from_f64(v: f64) -> Self;
}

macro_rules! num_float {
    ($t:ty) => {
        impl Num for $t {
            const FLOAT: bool = true;
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn sub(self, o: Self) -> Self {
                self - o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn div(self, o: Self) -> Self {
                self / o
            }
            fn pow(self, o: Self) -> Self {
                self.powf(o)
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn rem_trunc(self, o: Self) -> Self {
                self % o
            }
            fn rem_floor(self, o: Self) -> Self {
                let r = self % o;
                if r != 0.0 && (r < 0.0) != (o < 0.0) {
                    r + o
                } else {
                    r
                }
            }
        }
    };
}
/// The integer element types.
pub(crate) trait Int:
    Num
    + Ord
    + std::ops::BitAnd<Output = Self>
    + std::ops::BitOr<Output = Self>
    + std::ops::BitXor<Output = Self>
    + std::ops::Not<Output = Self>
{
    const SIGNED: bool;
    const ZERO: Self;
    fn wrapping_neg(self) -> Self;
    fn wrapping_abs(self) -> Self;
    /// -1, 0 or 1.
    fn sign(self) -> Self;
    /// Shifted left or right by `by` bits; by the width or more (or a negative count), 0.
    fn shift(self, by: Self, left: bool) -> Self;
}

macro_rules! num_int {
    ($t:ty, $signed:expr) => {
        #[allow(unused_comparisons)]
        impl Int for $t {
            const SIGNED: bool = $signed;
            const ZERO: Self = 0;
            fn wrapping_neg(self) -> Self {
                <$t>::wrapping_neg(self)
            }
            fn wrapping_abs(self) -> Self {
                if self < 0 {
                    <$t>::wrapping_neg(self)
                } else {
                    self
                }
            }
            fn sign(self) -> Self {
                (self > 0) as $t - (self < 0) as $t
            }
            fn shift(self, by: Self, left: bool) -> Self {
                let by = u32::try_from(by as i128).ok();
                let shifted = match left {
                    true => by.and_then(|b| self.checked_shl(b)),
                    false => by.and_then(|b| self.checked_shr(b)),
                };
                shifted.unwrap_or(0)
            }
        }
        impl Num for $t {
            const FLOAT: bool = false;
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            // Division by zero is undefined in ONNX; give 0 rather than panic.
            fn div(self, o: Self) -> Self {
                if o == 0 { 0 } else { self.wrapping_div(o) }
            }
            fn pow(self, o: Self) -> Self {
                (self as f64).powf(o as f64) as $t
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            // As for division, a zero divisor gives 0 rather than a panic.
            fn rem_trunc(self, o: Self) -> Self {
                if o == 0 { 0 } else { self.wrapping_rem(o) }
            }
            #[allow(unused_comparisons)]
            fn rem_floor(self, o: Self) -> Self {
                if o == 0 {
                    return 0;
                }
                let r = self.wrapping_rem(o);
                if r != 0 && (r < 0) != (o < 0) {
                    r.wrapping_add(o)
                } else {
                    r
                }
            }
        }
    };
}
num_float!(f32);
num_float!(f64);
num_int!(i64, true);
num_int!(i32, true);
num_int!(i16, true);
num_int!(i8, true);
num_int!(u64, false);
num_int!(u32, false);
num_int!(u16, false);
num_int!(u8, false);

/// NaN test for any `PartialOrd` element (only floats can be unordered with themselves).
pub(crate) fn is_nan<T: PartialOrd>(x: T) -> bool {
    x.partial_cmp(&x).is_none()
}

fn arith<T: Num>(
    op: Binary,
    a: &[T],
    ash: &[usize],
    b: &[T],
    bsh: &[usize],
    out: &[usize],
) -> OpResult<Result<Vec<T>, Vec<bool>>> {
    Ok(match op {
        Binary::Add => Ok(broadcast_map(a, ash, b, bsh, out, T::add)),
        Binary::Sub => Ok(broadcast_map(a, ash, b, bsh, out, T::sub)),
        Binary::Mul => Ok(broadcast_map(a, ash, b, bsh, out, T::mul)),
        Binary::Div => Ok(broadcast_map(a, ash, b, bsh, out, T::div)),
        Binary::Pow => Ok(broadcast_map(a, ash, b, bsh, out, T::pow)),
        Binary::Mod if T::FLOAT => {
            return Err(OpError::DType(
                "Mod of floating-point values needs fmod=1".into(),
            ));
        }
        Binary::Mod => Ok(broadcast_map(a, ash, b, bsh, out, T::rem_floor)),
        Binary::Fmod => Ok(broadcast_map(a, ash, b, bsh, out, T::rem_trunc)),
        Binary::Max => Ok(broadcast_map(a, ash, b, bsh, out, |x, y| {
            if x >= y || is_nan(x) { x } else { y }
        })),
        Binary::Min => Ok(broadcast_map(a, ash, b, bsh, out, |x, y| {
            if x <= y || is_nan(x) { x } else { y }
        })),
        Binary::Equal => Err(broadcast_map(a, ash, b, bsh, out, |x, y| x == y)),
        Binary::Less => Err(broadcast_map(a, ash, b, bsh, out, |x, y| x < y)),
        Binary::Greater => Err(broadcast_map(a, ash, b, bsh, out, |x, y| x > y)),
        Binary::LessOrEqual => Err(broadcast_map(a, ash, b, bsh, out, |x, y| x <= y)),
        Binary::GreaterOrEqual => Err(broadcast_map(a, ash, b, bsh, out, |x, y| x >= y)),
        Binary::And | Binary::Or | Binary::Xor => {
            return Err(OpError::DType(format!("{op:?} needs bool inputs")));
        }
        Binary::BitwiseAnd
        | Binary::BitwiseOr
        | Binary::BitwiseXor
        | Binary::BitShiftLeft
        | Binary::BitShiftRight => {
            return Err(OpError::DType(format!("{op:?} needs integer inputs")));
        }
    })
}

/// [`binary`] for an op of the plan: the arithmetic of two float32 tensors where one has the
/// output's shape and the other is a block of its axes (a residual, a bias, a scalar, a
/// per-channel scale `[1, C, 1, 1]`), into a pooled buffer and split across the threads;
/// anything else as [`binary`] does it.
pub fn binary_in(cx: &Cx, op: Binary, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let done = match op {
        Binary::Add => binary_f32(cx, a, b, |x, y| x + y),
        Binary::Sub => binary_f32(cx, a, b, |x, y| x - y),
        Binary::Mul => binary_f32(cx, a, b, |x, y| x * y),
        Binary::Div => binary_f32(cx, a, b, |x, y| x / y),
        _ => None,
    };
    done.unwrap_or_else(|| binary(op, a, b))
}

/// `f` of float32 `a` and `b` as [`binary_in`] describes, or `None` where they are not such.
fn binary_f32(
    cx: &Cx,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32) -> f32 + Copy + Sync,
) -> Option<OpResult<Tensor>> {
    let (Ok(x), Ok(y)) = (a.as_f32(), b.as_f32()) else {
        return None;
    };
    let shape = broadcast_shape(&a.shape, &b.shape).ok()?;
    // The operand of the output's shape, and the other.
    let (whole, part, part_shape, swapped) = match (a.shape == shape, b.shape == shape) {
        (true, _) => (x, y, &b.shape, false),
        (false, true) => (y, x, &a.shape, true),
        (false, false) => return None,
    };
    let run = block_run(&shape, part_shape)?;
    if part.is_empty() || Some(whole.len()) != checked_numel(&shape).ok() {
        return None;
    }
    let mut out = cx.take_f32(whole.len());
    let same = part.len() == whole.len();
    // Each element of `part` meets `run` consecutive elements of `whole`, and `part` repeats
    // whole after whole.
    let piece = |at: usize, o: &mut [f32]| {
        let w = &whole[at..at + o.len()];
        let p = if same { &part[at..at + o.len()] } else { part };
        match (run, swapped) {
            (1, false) => repeat_zip(o, w, p, f),
            (1, true) => repeat_zip(o, w, p, |w, p| f(p, w)),
            _ => {
                let first = at / run;
                let runs = o.chunks_mut(run).zip(w.chunks(run));
                for (r, (o, w)) in runs.enumerate() {
                    let v = p[(first + r) % p.len()];
                    match swapped {
                        false => o.iter_mut().zip(w).for_each(|(o, &w)| *o = f(w, v)),
                        true => o.iter_mut().zip(w).for_each(|(o, &w)| *o = f(v, w)),
                    }
                }
            }
        }
    };
    let align = if same { 16 } else { part.len() * run };
    cx.in_pieces(&mut out, align, piece);
    Some(Tensor::f32(shape, out))
}

/// Where `part` (right-aligned against `shape`) is 1 on every axis but a block of consecutive
/// axes, on which it equals `shape`: how many consecutive output elements each of its elements
/// meets (1 where the block reaches the last axis). `None` for any other broadcast.
fn block_run(shape: &[usize], part: &[usize]) -> Option<usize> {
    let lead = shape.len().checked_sub(part.len())?;
    let padded = |i: usize| if i < lead { 1 } else { part[i - lead] };
    let kept: Vec<usize> = (0..shape.len()).filter(|&i| padded(i) != 1).collect();
    // A single value: it meets every element, one at a time.
    let (Some(&first), Some(&last)) = (kept.first(), kept.last()) else {
        return Some(1);
    };
    let block = (first..=last).all(|i| padded(i) == shape[i]);
    block.then(|| shape[last + 1..].iter().product())
}

/// `o[i] = f(w[i], p[i % p.len()])`, where `o` and `w` are whole repeats of `p`.
#[inline(always)]
fn repeat_zip(o: &mut [f32], w: &[f32], p: &[f32], f: impl Fn(f32, f32) -> f32) {
    if let [v] = p {
        for (o, &w) in o.iter_mut().zip(w) {
            *o = f(w, *v);
        }
        return;
    }
    for (o, w) in o.chunks_exact_mut(p.len()).zip(w.chunks_exact(p.len())) {
        for ((o, &w), &p) in o.iter_mut().zip(w).zip(p) {
            *o = f(w, p);
        }
    }
}

pub fn binary(op: Binary, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let out = broadcast_shape(&a.shape, &b.shape)?;
    if op.is_bitwise() {
        let data = bitwise(op, a, b, &out)?;
        return Ok(Tensor { shape: out, data });
    }
    if op == Binary::Pow
        && let Some(y) = small_power(a, b)
    {
        return Ok(Tensor {
            shape: out,
            data: y,
        });
    }
    // Pow may raise to an exponent of another type: compute in the base's type.
    let b_cast;
    let b = if op == Binary::Pow && a.dtype() != b.dtype() {
        b_cast = cast(b, a.dtype());
        &b_cast
    } else {
        b
    };
    macro_rules! go {
        ($x:expr, $y:expr, $v:ident) => {
            match arith(op, $x, &a.shape, $y, &b.shape, &out)? {
                Ok(v) => Data::$v(v),
                Err(v) => Data::Bool(v),
            }
        };
    }
    let data = match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => go!(x, y, F32),
        (Data::F64(x), Data::F64(y)) => go!(x, y, F64),
        (Data::I64(x), Data::I64(y)) => go!(x, y, I64),
        (Data::I32(x), Data::I32(y)) => go!(x, y, I32),
        (Data::I16(x), Data::I16(y)) => go!(x, y, I16),
        (Data::I8(x), Data::I8(y)) => go!(x, y, I8),
        (Data::U64(x), Data::U64(y)) => go!(x, y, U64),
        (Data::U32(x), Data::U32(y)) => go!(x, y, U32),
        (Data::U16(x), Data::U16(y)) => go!(x, y, U16),
        (Data::U8(x), Data::U8(y)) => go!(x, y, U8),
        (Data::Bool(x), Data::Bool(y)) => Data::Bool(match op {
            Binary::And => broadcast_map(x, &a.shape, y, &b.shape, &out, |p, q| p && q),
            Binary::Or => broadcast_map(x, &a.shape, y, &b.shape, &out, |p, q| p || q),
            Binary::Xor => broadcast_map(x, &a.shape, y, &b.shape, &out, |p, q| p ^ q),
            Binary::Equal => broadcast_map(x, &a.shape, y, &b.shape, &out, |p, q| p == q),
            _ => return Err(OpError::DType(format!("{op:?} on bool"))),
        }),
        (x, y) => {
            return Err(OpError::DType(format!(
                "{op:?} of {:?} and {:?}",
                x.dtype(),
                y.dtype()
            )));
        }
    };
    Ok(Tensor { shape: out, data })
}

/// `a ^ b` for float32 `a` and one exponent of 1, 2 or 3 (RMSNorm's square, the tanh Gelu's
/// cube) as products, in a vector loop: `powf` called per element took a quarter of a T5
/// encoder's time. The square is exact as `powf`'s is; the cube, worked in f64, is rounded
/// once more. `None` for any other power.
fn small_power(a: &Tensor, b: &Tensor) -> Option<Data> {
    let (Data::F32(x), 1) = (&a.data, b.len()) else {
        return None;
    };
    let e = b.to_f64_vec()[0];
    let mut y = x.clone();
    match e {
        1.0 => {}
        2.0 => map_inplace(1, &mut y, |v| v * v),
        3.0 => map_inplace(1, &mut y, |v| {
            let d = v as f64;
            (d * d * d) as f32
        }),
        _ => return None,
    }
    Some(Data::F32(y))
}

/// BitwiseAnd, BitwiseOr and BitwiseXor of any integer type, BitShift of unsigned ones.
fn bitwise(op: Binary, a: &Tensor, b: &Tensor, out: &[usize]) -> OpResult<Data> {
    fn bits<T: Int>(
        op: Binary,
        (a, ash): (&[T], &[usize]),
        (b, bsh): (&[T], &[usize]),
        out: &[usize],
    ) -> OpResult<Vec<T>> {
        let f: fn(T, T) -> T = match op {
            Binary::BitwiseAnd => |x, y| x & y,
            Binary::BitwiseOr => |x, y| x | y,
            Binary::BitwiseXor => |x, y| x ^ y,
            Binary::BitShiftLeft if !T::SIGNED => |x, y| x.shift(y, true),
            Binary::BitShiftRight if !T::SIGNED => |x, y| x.shift(y, false),
            _ => {
                return Err(OpError::DType(format!(
                    "{op:?} on {}",
                    std::any::type_name::<T>()
                )));
            }
        };
        Ok(broadcast_map(a, ash, b, bsh, out, f))
    }
    macro_rules! ints {
        ($($v:ident),*) => {
            match (&a.data, &b.data) {
                $((Data::$v(x), Data::$v(y)) => {
                    Data::$v(bits(op, (x, &a.shape), (y, &b.shape), out)?)
                })*
                (x, y) => {
                    return Err(OpError::DType(format!(
                        "{op:?} of {:?} and {:?}",
                        x.dtype(),
                        y.dtype()
                    )));
                }
            }
        };
    }
    Ok(ints!(I64, I32, I16, I8, U64, U32, U16, U8))
}

pub fn legacy_broadcast(op: Binary, axis: Option<i64>, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let Some(axis) = axis else {
        return binary(op, a, b);
    };
    let axis = crate::tensor::norm_axis(axis, a.rank())?;
    if axis + b.rank() > a.rank() {
        return shape_err(format!(
            "legacy broadcast of {:?} into {:?} at axis {axis}",
            b.shape, a.shape
        ));
    }
    let mut shape = vec![1; axis];
    shape.extend(&b.shape);
    shape.resize(a.rank(), 1);
    binary(op, a, &b.clone().reshaped(shape)?)
}

pub fn variadic(op: Binary, mean: bool, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let mut acc = input(inputs, 0)?.clone();
    for t in inputs.iter().skip(1).flatten() {
        acc = binary(op, &acc, t)?;
    }
    if mean {
        let n = Tensor::scalar_f32(inputs.iter().flatten().count() as f32);
        let n = cast(&n, acc.dtype());
        acc = binary(Binary::Div, &acc, &n)?;
    }
    Ok(acc)
}

pub fn prelu(x: &Tensor, slope: &Tensor) -> OpResult<Tensor> {
    // Old exporters give one slope per channel as a vector: align it with axis 1.
    let per_channel;
    let slope = if x.rank() > 2 && slope.rank() == 1 && slope.len() == x.shape[1] && slope.len() > 1
    {
        let mut s = vec![1; x.rank() - 1];
        s[0] = slope.len();
        per_channel = slope.clone().reshaped(s)?;
        &per_channel
    } else {
        slope
    };
    let out = broadcast_shape(&x.shape, &slope.shape)?;
    if out != x.shape {
        return shape_err(format!(
            "PRelu slope {:?} does not broadcast to {:?}",
            slope.shape, x.shape
        ));
    }
    let v = broadcast_map(
        x.as_f32()?,
        &x.shape,
        slope.as_f32()?,
        &slope.shape,
        &out,
        |x, s| if x < 0.0 { s * x } else { x },
    );
    Tensor::f32(out, v)
}

pub fn clip(
    cx: &Cx,
    inputs: &[Option<&Tensor>],
    min: Option<f32>,
    max: Option<f32>,
) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let scalar = |i: usize| opt_input(inputs, i).and_then(|t| t.to_f64_vec().first().copied());
    let lo = scalar(1).or(min.map(f64::from));
    let hi = scalar(2).or(max.map(f64::from));
    let mut out = x.clone();
    match &mut out.data {
        Data::F32(v) => {
            let (lo, hi) = (
                lo.map_or(f32::NEG_INFINITY, |v| v as f32),
                hi.map_or(f32::INFINITY, |v| v as f32),
            );
            // min(max(x, lo), hi): when lo > hi everything becomes hi, as ONNX specifies.
            map_inplace(cx.threads, v, move |x| {
                let y = if x < lo { lo } else { x };
                if y > hi { hi } else { y }
            });
        }
        Data::F64(v) => clamp(v, lo, hi),
        Data::I64(v) => clamp(v, lo, hi),
        Data::I32(v) => clamp(v, lo, hi),
        Data::I16(v) => clamp(v, lo, hi),
        Data::I8(v) => clamp(v, lo, hi),
        Data::U64(v) => clamp(v, lo, hi),
        Data::U32(v) => clamp(v, lo, hi),
        Data::U16(v) => clamp(v, lo, hi),
        Data::U8(v) => clamp(v, lo, hi),
        Data::Bool(_) | Data::Low(..) => {
            return Err(OpError::DType(format!("Clip of {:?}", x.dtype())));
        }
        Data::F16(_) | Data::BF16(_) => return Err(super::half_here()),
    }
    Ok(out)
}

/// Clips `v` to `[lo, hi]` (each converted to the element type, saturating); where lo > hi
/// everything becomes hi, and NaN stays NaN.
fn clamp<T: Num>(v: &mut [T], lo: Option<f64>, hi: Option<f64>) {
    let (lo, hi) = (lo.map(T::from_f64), hi.map(T::from_f64));
    for x in v {
        if let Some(l) = lo
            && *x < l
        {
            *x = l;
        }
        if let Some(h) = hi
            && *x > h
        {
            *x = h;
        }
    }
}

pub fn where_(c: &Tensor, x: &Tensor, y: &Tensor) -> OpResult<Tensor> {
    let Data::Bool(cv) = &c.data else {
        return Err(OpError::DType("Where condition must be bool".into()));
    };
    if x.dtype() != y.dtype() {
        return Err(OpError::DType("Where branches differ in type".into()));
    }
    let out = broadcast_shape(&broadcast_shape(&c.shape, &x.shape)?, &y.shape)?;
    // Broadcast all three to `out` through index maps, then pick.
    let n = checked_numel(&out)?;
    if n == 0 {
        return Ok(Tensor {
            data: Data::with_capacity(x.dtype(), 0),
            shape: out,
        });
    }
    let idx = |shape: &[usize]| -> Vec<usize> {
        let iota: Vec<usize> = (0..shape.iter().product()).collect();
        let zeros = vec![0usize; n];
        broadcast_map(&iota, shape, &zeros[..1], &[1], &out, |i, _| i)
    };
    let (ic, ix, iy) = (idx(&c.shape), idx(&x.shape), idx(&y.shape));
    let pick = |k: usize| {
        if cv[ic[k]] {
            (ix[k], true)
        } else {
            (iy[k], false)
        }
    };
    macro_rules! sel {
        ($($v:ident),*) => {
            match (&x.data, &y.data) {
                $((Data::$v(a), Data::$v(b)) => Data::$v((0..n).map(|k| match pick(k) { (i, true) => a[i], (i, false) => b[i] }).collect()),)*
                _ => return Err(OpError::DType("Where branches differ in type".into())),
            }
        };
    }
    let data = sel!(F32, F64, I64, I32, I16, I8, U64, U32, U16, U8, Bool);
    Ok(Tensor { shape: out, data })
}

/// Converts between element types with ONNX Cast semantics (float → int truncates).
/// Cast to `to`: floats to integers truncate toward zero (saturating), anything to bool is
/// `!= 0`, and a cast to float16/bfloat16 rounds once, to nearest even, from the exact value
/// (integers and f32 go through f64, which holds them exactly).
pub fn cast(x: &Tensor, to: DType) -> Tensor {
    cast_with(x, to, CastMode::default())
}

/// A Cast to f32 of booleans, integers or f64 into a buffer from the run's pool, where
/// [`cast`] allocates a fresh one (a one-hot mask turned to floats is megabytes a run, and a
/// fresh buffer costs its page faults every run). `None` for other sources.
pub fn cast_to_f32(cx: &Cx, x: &Tensor) -> Option<Tensor> {
    macro_rules! widen {
        ($($v:ident),*) => {
            match &x.data {
                Data::Bool(v) => {
                    let mut out = cx.take_f32(v.len());
                    out.iter_mut().zip(v).for_each(|(o, &b)| *o = f32::from(u8::from(b)));
                    out
                }
                $(Data::$v(v) => {
                    let mut out = cx.take_f32(v.len());
                    out.iter_mut().zip(v).for_each(|(o, &e)| *o = e as f32);
                    out
                })*
                _ => return None,
            }
        };
    }
    let out = widen!(U8, I8, U16, I16, I32, I64, F64);
    Tensor::new(x.shape.clone(), Data::F32(out)).ok()
}

/// [`cast`] with Cast's attributes for low-bit targets: float ones round to nearest even (e8m0
/// by `mode`) from the exact value, with `mode`'s overflow rule; integer ones truncate toward
/// zero and wrap. Low-bit sources widen exactly (to f32 or i64) first.
pub fn cast_with(x: &Tensor, to: DType, mode: CastMode) -> Tensor {
    use crate::tensor::{bf16, f16};
    macro_rules! from {
        ($v:expr) => {
            match to {
                DType::F32 => Data::F32($v.iter().map(|&e| e as f32).collect()),
                DType::F64 => Data::F64($v.iter().map(|&e| e as f64).collect()),
                DType::F16 => Data::F16($v.iter().map(|&e| f16::from_f64(e as f64)).collect()),
                DType::BF16 => Data::BF16($v.iter().map(|&e| bf16::from_f64(e as f64)).collect()),
                DType::I64 => Data::I64($v.iter().map(|&e| e as i64).collect()),
                DType::I32 => Data::I32($v.iter().map(|&e| e as i32).collect()),
                DType::I16 => Data::I16($v.iter().map(|&e| e as i16).collect()),
                DType::I8 => Data::I8($v.iter().map(|&e| e as i8).collect()),
                DType::U64 => Data::U64($v.iter().map(|&e| e as u64).collect()),
                DType::U32 => Data::U32($v.iter().map(|&e| e as u32).collect()),
                DType::U16 => Data::U16($v.iter().map(|&e| e as u16).collect()),
                DType::U8 => Data::U8($v.iter().map(|&e| e as u8).collect()),
                DType::Bool => Data::Bool($v.iter().map(|&e| e as f64 != 0.0).collect()),
                DType::Low(l) if l.is_int() => {
                    Data::Low(l, $v.iter().map(|&e| l.from_int(e as i64)).collect())
                }
                DType::Low(l) => {
                    Data::Low(l, $v.iter().map(|&e| l.from_f64(e as f64, mode)).collect())
                }
            }
        };
    }
    let data = match &x.data {
        d if d.dtype() == to => d.clone(),
        Data::F32(v) => from!(v),
        Data::F64(v) => from!(v),
        // Half precision widens to f32 exactly.
        Data::F16(_) | Data::BF16(_) => {
            let w = super::widen(x);
            return cast_with(&w, to, mode);
        }
        Data::Low(l, v) => {
            let wide = match l.is_int() {
                true => Data::I64(v.iter().map(|&c| l.int(c)).collect()),
                false => Data::F32(v.iter().map(|&c| l.to_f32(c)).collect()),
            };
            let w = Tensor {
                shape: x.shape.clone(),
                data: wide,
            };
            return cast_with(&w, to, mode);
        }
        Data::I64(v) => from!(v),
        Data::I32(v) => from!(v),
        Data::I16(v) => from!(v),
        Data::I8(v) => from!(v),
        Data::U64(v) => from!(v),
        Data::U32(v) => from!(v),
        Data::U16(v) => from!(v),
        Data::U8(v) => from!(v),
        Data::Bool(v) => {
            let u: Vec<u8> = v.iter().map(|&b| b as u8).collect();
            from!(u)
        }
    };
    Tensor {
        shape: x.shape.clone(),
        data,
    }
}

/// BitCast: the same little-endian bytes read as `to`, which must be as wide as the input's
/// element type.
pub fn bit_cast(x: &Tensor, to: DType) -> OpResult<Tensor> {
    if let Some(low) = [x.dtype(), to]
        .into_iter()
        .find(|d| matches!(d, DType::Low(_)))
    {
        return Err(OpError::DType(format!(
            "BitCast of {low:?} is not supported"
        )));
    }
    if x.dtype().size() != to.size() {
        return Err(OpError::DType(format!(
            "BitCast of {:?} ({} bytes) to {to:?} ({} bytes)",
            x.dtype(),
            x.dtype().size(),
            to.size()
        )));
    }
    let bytes = crate::tensor_proto::to_le_bytes(&x.data);
    Tensor::new(
        x.shape.clone(),
        crate::tensor_proto::from_le_bytes(to, &bytes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_arithmetic_split_across_threads_matches_the_broadcast() {
        let values = |n: usize, seed: f32| -> Vec<f32> {
            let mut v: Vec<f32> = (0..n)
                .map(|i| ((i as f32 + seed) * 0.37).sin() * 5.0)
                .collect();
            let special = [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-40];
            for (i, s) in special.into_iter().enumerate() {
                v[(i * 7919) % n] = s;
            }
            v
        };
        // The same shape, a bias over the last axis, a scalar, and the broadcast operand first;
        // a scale per channel (at batch 1 and 3, and as a vector of the channels), one per
        // row of a matrix, and a block of middle axes.
        let shapes: [(&[usize], &[usize]); 11] = [
            (&[300, 130], &[300, 130]),
            (&[300, 130], &[130]),
            (&[40_000], &[]),
            (&[7], &[6000, 7]),
            (&[3, 5], &[2, 3, 5]),
            (&[1, 24, 48, 64], &[1, 24, 1, 1]),
            (&[3, 24, 40, 33], &[24, 1, 1]),
            (&[1, 1, 1], &[2, 24, 7, 9]),
            (&[1, 40, 1, 1], &[1, 40, 50, 50]),
            (&[5000, 9], &[5000, 1]),
            (&[2, 3, 4, 5, 600], &[3, 4, 1, 1]),
        ];
        for (sa, sb) in shapes {
            let a = Tensor::f32(sa.to_vec(), values(sa.iter().product(), 1.0)).unwrap();
            let b = Tensor::f32(sb.to_vec(), values(sb.iter().product(), 2.0)).unwrap();
            for op in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div] {
                let want = binary(op, &a, &b).unwrap();
                for threads in [1, 3] {
                    let got = binary_in(&Cx::new(threads), op, &a, &b).unwrap();
                    assert_eq!(got.shape, want.shape);
                    let bits = |t: &Tensor| -> Vec<u32> {
                        t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
                    };
                    assert_eq!(bits(&got), bits(&want), "{op:?} {sa:?} {sb:?} {threads}");
                }
            }
        }
        // Empty operands.
        for (sa, sb) in [(vec![0, 5], vec![5]), (vec![3, 0], vec![0])] {
            let a = Tensor::f32(sa.clone(), vec![0.5; sa.iter().product()]).unwrap();
            let b = Tensor::f32(sb.clone(), vec![2.0; sb.iter().product()]).unwrap();
            let got = binary_in(&Cx::new(2), Binary::Sub, &a, &b).unwrap();
            assert_eq!(got, binary(Binary::Sub, &a, &b).unwrap(), "{sa:?} {sb:?}");
        }
        // Shapes that broadcast otherwise, and other types, as `binary` does them.
        let a = Tensor::f32(vec![4, 1], vec![1.0; 4]).unwrap();
        let b = Tensor::f32(vec![1, 3], vec![2.0; 3]).unwrap();
        let got = binary_in(&Cx::new(2), Binary::Add, &a, &b).unwrap();
        assert_eq!(got.shape, vec![4, 3]);
        let i = Tensor::new(vec![2], Data::I64(vec![1, 2])).unwrap();
        let e = binary_in(&Cx::new(2), Binary::Add, &a, &i).unwrap_err();
        assert!(e.to_string().contains("Add"), "{e}");
    }

    #[test]
    fn small_powers_are_products_within_an_ulp_of_powf() {
        let xs: Vec<f32> = (0..2001).map(|i| (i as f32 - 1000.0) * 0.0371).collect();
        let mut special = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e30,
            -3e-30,
        ];
        special.extend(&xs);
        let x = Tensor::f32(vec![special.len()], special.clone()).unwrap();
        for (e, exponent) in [
            (2.0, Tensor::scalar_f32(2.0)),
            (3.0, Tensor::i64(vec![1, 1], vec![3]).unwrap()),
            (1.0, Tensor::scalar_f32(1.0)),
            (2.5, Tensor::scalar_f32(2.5)),
        ] {
            let y = binary(Binary::Pow, &x, &exponent).unwrap();
            // The exponent's rank broadcasts as any operand's.
            let rank = exponent.rank().max(1);
            assert_eq!(y.shape.len(), rank, "{e}");
            for (&v, &got) in special.iter().zip(y.as_f32().unwrap()) {
                let want = v.powf(e);
                let ulp = (want.abs() * f32::EPSILON).max(f32::MIN_POSITIVE);
                let same = (got.is_nan() && want.is_nan()) || got == want;
                assert!(
                    same || (got - want).abs() <= ulp,
                    "{v}^{e}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn broadcasting_matches_numpy_rules() {
        let a = Tensor::f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]).unwrap();
        let b = Tensor::f32(vec![3], vec![10., 20., 30.]).unwrap();
        let c = Tensor::f32(vec![2, 1], vec![100., 200.]).unwrap();
        assert_eq!(
            binary(Binary::Add, &a, &b).unwrap().as_f32().unwrap(),
            &[11., 22., 33., 14., 25., 36.]
        );
        assert_eq!(
            binary(Binary::Sub, &a, &c).unwrap().as_f32().unwrap(),
            &[-99., -98., -97., -196., -195., -194.]
        );
        let o = binary(Binary::Mul, &c, &b).unwrap();
        assert_eq!(o.shape, vec![2, 3]);
        assert_eq!(
            o.as_f32().unwrap(),
            &[1000., 2000., 3000., 2000., 4000., 6000.]
        );
        assert!(
            binary(
                Binary::Add,
                &a,
                &Tensor::f32(vec![2], vec![1., 2.]).unwrap()
            )
            .is_err()
        );
    }

    #[test]
    fn where_broadcasts_condition() {
        let c = Tensor::new(vec![2], Data::Bool(vec![true, false])).unwrap();
        let x = Tensor::f32(vec![2, 2], vec![1., 2., 3., 4.]).unwrap();
        let y = Tensor::scalar_f32(0.0);
        assert_eq!(
            where_(&c, &x, &y).unwrap().as_f32().unwrap(),
            &[1., 0., 3., 0.]
        );
    }

    #[test]
    fn unsigned_and_sixteen_bit_integers_compute_in_their_own_type() {
        let u = |v: Vec<u64>| Tensor::new(vec![v.len()], Data::U64(v)).unwrap();
        let sum = binary(Binary::Add, &u(vec![u64::MAX, 1]), &u(vec![1, 2])).unwrap();
        assert_eq!(sum.data, Data::U64(vec![0, 3]));
        let big = binary(Binary::Greater, &u(vec![u64::MAX]), &u(vec![1 << 63])).unwrap();
        assert_eq!(big.data, Data::Bool(vec![true]));
        let i = Tensor::new(vec![3], Data::I16(vec![-7, 7, i16::MIN])).unwrap();
        let three = Tensor::new(vec![1], Data::I16(vec![3])).unwrap();
        assert_eq!(
            binary(Binary::Mod, &i, &three).unwrap().data,
            Data::I16(vec![2, 1, 1])
        );
        let cx = Cx::new(1);
        assert_eq!(
            unary(&cx, Unary::Neg, &i).unwrap().data,
            Data::I16(vec![7, -7, i16::MIN])
        );
        assert_eq!(
            unary(&cx, Unary::Sign, &i).unwrap().data,
            Data::I16(vec![-1, 1, -1])
        );
        assert!(unary(&cx, Unary::Neg, &u(vec![1])).is_err());
        let x = Tensor::f32(vec![2], vec![-1.0, 70000.0]).unwrap();
        assert_eq!(cast(&x, DType::U16).data, Data::U16(vec![0, u16::MAX]));
        let mut c = u(vec![0, 5, 9]);
        if let Data::U64(v) = &mut c.data {
            clamp(v, Some(-3.0), Some(6.0));
        }
        assert_eq!(c.data, Data::U64(vec![0, 5, 6]));
    }

    #[test]
    fn is_inf_counts_only_the_signs_asked_for_and_refuses_integers() {
        let cx = Cx::new(1);
        let x = Tensor::f32(
            vec![4],
            vec![f32::NEG_INFINITY, 1.0, f32::INFINITY, f32::NAN],
        )
        .unwrap();
        let run = |u| unary(&cx, u, &x).unwrap().data;
        assert_eq!(
            run(Unary::IsInf(true, false)),
            Data::Bool(vec![true, false, false, false])
        );
        assert_eq!(
            run(Unary::IsInf(false, true)),
            Data::Bool(vec![false, false, true, false])
        );
        assert_eq!(
            run(Unary::IsNaN),
            Data::Bool(vec![false, false, false, true])
        );
        let i = Tensor::i64(vec![1], vec![1]).unwrap();
        assert!(unary(&cx, Unary::IsNaN, &i).is_err());
        let s = Tensor::f32(vec![3], vec![-2.0, 0.3, 2.0]).unwrap();
        let shrunk = unary(&cx, Unary::Shrink(1.5, 0.5), &s).unwrap();
        assert_eq!(shrunk.as_f32().unwrap(), &[-0.5, 0.0, 0.5]);
    }

    #[test]
    fn bit_ops_clear_on_wide_shifts_and_refuse_floats() {
        let u = |v: Vec<u8>| Tensor::new(vec![v.len()], Data::U8(v)).unwrap();
        let left = binary(Binary::BitShiftLeft, &u(vec![1, 1, 255]), &u(vec![7, 8, 1])).unwrap();
        assert_eq!(left.data, Data::U8(vec![128, 0, 254]));
        let i = Tensor::new(vec![1], Data::I32(vec![-8])).unwrap();
        assert!(binary(Binary::BitShiftRight, &i, &i).is_err());
        assert_eq!(
            binary(Binary::BitwiseXor, &i, &i).unwrap().data,
            Data::I32(vec![0])
        );
        let f = Tensor::scalar_f32(1.0);
        assert!(binary(Binary::BitwiseAnd, &f, &f).is_err());
        assert!(unary(&Cx::new(1), Unary::BitwiseNot, &f).is_err());
        assert!(unary(&Cx::new(1), Unary::Not, &f).is_err());
        let bits = bit_cast(&f, DType::I32).unwrap();
        assert_eq!(bits.data, Data::I32(vec![0x3f80_0000]));
        assert!(bit_cast(&f, DType::I64).is_err());
    }
}
