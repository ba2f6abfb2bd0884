//! Linear quantization: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear, and the
//! integer products MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv. The products
//! subtract zero points and accumulate exactly in `i32` (`cotenant_kernels::igemm`); the QLinear
//! ops then requantize as onnxruntime does: the accumulator times
//! `scale_a * scale_b / scale_y` (worked in the scales' precision), the product rounded to f32
//! and then half to even, plus the output zero point, saturated. The products take int8 and uint8; QuantizeLinear and
//! DequantizeLinear also take int16, uint16, the 4- and 2-bit integers, and the float8 and
//! float4 types (whose zero points must be zero: they scale without an offset).
//!
//! These ops read float16/bfloat16 scales themselves (`Op::eval` does not widen them), since the
//! reference rounds its scale arithmetic to the scales' type.

use super::attrs::Attrs;
use super::conv::{ConvAttrs, conv_geometry};
use super::matmul::MatMulShape;
use super::{Cx, input, narrow, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{CastMode, DType, Data, Low, Tensor, axis_in, bf16, checked_numel, f16};
use cotenant_kernels::activation::{Activation, clip};
use cotenant_kernels::conv::{Conv2d, conv2d_integer};
use cotenant_kernels::igemm::igemm;
use cotenant_kernels::qconv::{self, Byte, Requantize, applies as nhwc_applies, round_even};
use cotenant_kernels::qdepthwise::qdepthwise;
use cotenant_kernels::qgemm::{Int8, PackedA, PackedB, qgemm, qgemm_map};
use cotenant_kernels::quantize::{QAddParams, qadd_u8, quantize_u8};
use cotenant_kernels::wide::wide;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq)]
pub enum QuantOp {
    Quantize(QuantizeAttrs),
    Dequantize(DequantizeAttrs),
    DynamicQuantize,
    MatMulInteger,
    ConvInteger(ConvAttrs),
    QLinearMatMul,
    QLinearConv(ConvAttrs),
    /// MatMulInteger with constant weights, packed once (`passes::integer_products`).
    PackedMatMul(Arc<PackedMatMul>),
    /// ConvInteger with constant weights, packed once (`passes::integer_products`).
    PackedConv(Arc<PackedConv>),
    /// A quantized Conv (DequantizeLinear → Conv → QuantizeLinear) in integers (`passes::qdq`).
    QConv(Arc<QConv>),
    /// A quantized Add (DequantizeLinear of both sides → Add → Relu? → QuantizeLinear) in one
    /// pass (`passes::qdq`).
    QAdd(QAdd),
}

/// The scale and zero point of one side of a [`QAdd`], and its type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantized {
    pub scale: f32,
    pub zero: i32,
    pub dtype: DType,
}

/// `Q(Relu?(DQ(a) + DQ(b)))`, every scale and zero point single: the same f32 arithmetic as
/// the separate ops (so the same result), without their f32 tensors in between. Inputs of
/// different shapes (a broadcast) take the separate ops' path.
#[derive(Clone, Debug, PartialEq)]
pub struct QAdd {
    pub a: Quantized,
    pub b: Quantized,
    pub y: Quantized,
    pub relu: bool,
}

/// A Conv between DequantizeLinear of its input and QuantizeLinear of its output, worked in
/// integers: `x` (input 0, int8 or uint8, with a single zero point `x_zero`) convolved exactly
/// with the constant per-channel int8 weights packed for `qgemm`, then requantized in f32:
/// `clamp(round(acc · mult[c] + offset[c]) + y_zero)`, where `mult = x_scale · w_scale[c] /
/// y_scale` and `offset` is the float bias over `y_scale`; the clamp's low end is `y_zero` with
/// a Relu fused. Equal to the float path on dequantized values up to the rounding of one
/// quantization step at ties.
#[derive(Clone, Debug, PartialEq)]
pub struct QConv {
    pub conv: ConvAttrs,
    /// `[M, C, kh, kw]` (or `[M, C, k]`).
    pub w_shape: Vec<usize>,
    pub w: QConvWeights,
    pub x_dtype: DType,
    /// The raw value (int8 values as their bytes).
    pub x_zero: u8,
    pub mult: Vec<f32>,
    pub offset: Vec<f32>,
    pub y_dtype: DType,
    pub y_zero: f32,
    pub relu: bool,
    /// A MatMul or Gemm by constant weights `[K, M]` as a 1x1 convolution: `x` is `[..., K]`,
    /// each of its rows one position, and the output `[..., M]`. The weights are
    /// [`QConvWeights::Taps`], `w_shape` `[M, K, 1, 1]`.
    pub matmul: bool,
}

/// A [`QConv`]'s weights, packed for the layout its activations come in.
#[derive(Clone, Debug, PartialEq)]
pub enum QConvWeights {
    /// One row per output channel, the matrix product's left side: input and output NCHW, the
    /// image's im2col columns streaming past.
    Rows(PackedA),
    /// One column per output channel over the taps in tap-major order, or over whole kernel
    /// rows where a tap has fewer than 4 channels: input and output NHWC, the image read in
    /// place (`cotenant_kernels::qconv::pack_filter`). Weight zero points are zero.
    Taps(PackedB),
}

impl QConvWeights {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            QConvWeights::Rows(a) => a.bytes(),
            QConvWeights::Taps(b) => b.bytes(),
        }
    }
}

/// MatMulInteger of `[a, a's zero point]` by constant weights packed for `qgemm`, with the
/// dynamic quantization's Cast to float, Mul by the scale (input 2) and Add of a constant bias
/// fused in when `scaled` (the output is then float: `acc as f32 * scale + bias`, rounded as
/// those ops round).
#[derive(Clone, Debug, PartialEq)]
pub struct PackedMatMul {
    /// The weights' shape, `[k, n]`.
    pub shape: [usize; 2],
    pub b: PackedB,
    pub scaled: bool,
    pub bias: Option<Vec<f32>>,
}

/// ConvInteger of `[x, x's zero point]` by constant 8-bit weights `w_shape` (`[M, C/G, kh, kw]`
/// or `[M, C/G, k]`), prepared once for the kernel that runs them ([`IntegerFilter`]). With
/// `scaled`, what dynamic quantization writes after it is fused in: the Add of an int32 bias
/// per output channel (input 3, when there), the Cast to float and the Mul by a single scale
/// (input 2). The output is then `(acc + bias[c]) as f32 * scale`, rounded as those ops round.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedConv {
    pub conv: ConvAttrs,
    pub w_shape: Vec<usize>,
    pub w: IntegerFilter,
    pub scaled: bool,
    /// A float bias per output channel added after the scaling (a `quantize_dynamic` that
    /// keeps the bias in float writes this Add), then an activation: both only when scaled.
    pub bias: Option<Vec<f32>>,
    pub act: Option<Activation>,
}

/// A [`PackedConv`]'s weights.
#[derive(Clone, Debug, PartialEq)]
pub enum IntegerFilter {
    /// One pack of `M/G` rows per group, for the matrix product.
    Rows(Vec<PackedA>),
    /// A depthwise convolution's (one input channel per group, several groups): each output
    /// channel's taps less their zero point (`cotenant_kernels::qdepthwise`).
    Depthwise(Vec<i16>),
}

impl PackedConv {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match &self.w {
            IntegerFilter::Rows(packs) => packs.iter().map(PackedA::bytes).sum(),
            IntegerFilter::Depthwise(w) => w.len() * 2,
        }
    }
}

/// Where the scales and zero points of a quantized tensor apply: one for the whole tensor (a
/// single value), one per index of `axis` (a vector), or one per `block_size` indices of `axis`
/// (a tensor of the input's rank).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantAxis {
    pub axis: i64,
    pub block_size: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct QuantizeAttrs {
    pub layout: QuantAxis,
    /// The output type when there is no zero point to give it.
    pub output_dtype: Option<DType>,
    /// The type `x / scale` is worked in; by default the inputs' common float type.
    pub precision: Option<DType>,
    /// float8 outputs: out-of-range values become the largest finite value (else infinity or
    /// NaN), as Cast's attribute.
    pub saturate: bool,
}

/// The types QuantizeLinear produces.
const QUANTIZED: &[DType] = &[
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::Low(Low::U4),
    DType::Low(Low::I4),
    DType::Low(Low::U2),
    DType::Low(Low::I2),
    DType::Low(Low::F8E4M3FN),
    DType::Low(Low::F8E4M3FNUZ),
    DType::Low(Low::F8E5M2),
    DType::Low(Low::F8E5M2FNUZ),
    DType::Low(Low::F4E2M1),
];

#[derive(Clone, Debug, PartialEq)]
pub struct DequantizeAttrs {
    pub layout: QuantAxis,
    /// The output type; by default the scale's.
    pub output_dtype: Option<DType>,
}

impl QuantOp {
    pub fn parse(op_type: &str, a: &Attrs) -> Result<Option<QuantOp>, String> {
        Ok(Some(match op_type {
            "QuantizeLinear" => QuantOp::Quantize(QuantizeAttrs {
                layout: QuantAxis::parse(a)?,
                output_dtype: dtype_attr(a, "output_dtype", QUANTIZED)?,
                precision: dtype_attr(a, "precision", &[DType::F32, DType::F16, DType::BF16])?,
                saturate: a.flag("saturate", true)?,
            }),
            "DequantizeLinear" => QuantOp::Dequantize(DequantizeAttrs {
                layout: QuantAxis::parse(a)?,
                output_dtype: dtype_attr(
                    a,
                    "output_dtype",
                    &[DType::F32, DType::F16, DType::BF16],
                )?,
            }),
            "DynamicQuantizeLinear" => QuantOp::DynamicQuantize,
            "MatMulInteger" => QuantOp::MatMulInteger,
            "ConvInteger" => QuantOp::ConvInteger(ConvAttrs::parse(a)?),
            "QLinearMatMul" => QuantOp::QLinearMatMul,
            "QLinearConv" => QuantOp::QLinearConv(ConvAttrs::parse(a)?),
            _ => return Ok(None),
        }))
    }

    pub fn name(&self) -> &'static str {
        match self {
            QuantOp::Quantize(_) => "QuantizeLinear",
            QuantOp::Dequantize(_) => "DequantizeLinear",
            QuantOp::DynamicQuantize => "DynamicQuantizeLinear",
            QuantOp::MatMulInteger => "MatMulInteger",
            QuantOp::ConvInteger(_) => "ConvInteger",
            QuantOp::QLinearMatMul => "QLinearMatMul",
            QuantOp::QLinearConv(_) => "QLinearConv",
            QuantOp::PackedMatMul(p) if p.scaled => "MatMulInteger(packed)+Scale",
            QuantOp::PackedMatMul(_) => "MatMulInteger(packed)",
            QuantOp::PackedConv(p) if p.scaled => "ConvInteger(packed)+Scale",
            QuantOp::PackedConv(_) => "ConvInteger(packed)",
            QuantOp::QConv(c) if c.matmul && c.relu => "QMatMul+Relu",
            QuantOp::QConv(c) if c.matmul => "QMatMul",
            QuantOp::QConv(c) if c.relu => "QConv+Relu",
            QuantOp::QConv(_) => "QConv",
            QuantOp::QAdd(q) if q.relu => "QAdd+Relu",
            QuantOp::QAdd(_) => "QAdd",
        }
    }

    pub fn eval(&self, cx: &Cx, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = input(inputs, 0)?;
        Ok(match self {
            QuantOp::Quantize(q) => vec![quantize(q, x, input(inputs, 1)?, opt_input(inputs, 2))?],
            QuantOp::Dequantize(d) => {
                vec![dequantize(
                    cx,
                    d,
                    x,
                    input(inputs, 1)?,
                    opt_input(inputs, 2),
                )?]
            }
            QuantOp::DynamicQuantize => dynamic_quantize(cx, x)?,
            QuantOp::MatMulInteger => {
                let b = input(inputs, 1)?;
                let (acc, shape) =
                    integer_matmul(cx, x, opt_input(inputs, 2), b, opt_input(inputs, 3))?;
                vec![Tensor::new(shape.out, Data::I32(acc))?]
            }
            QuantOp::ConvInteger(c) => {
                let w = input(inputs, 1)?;
                let (acc, shape) =
                    integer_conv(cx, c, x, opt_input(inputs, 2), w, opt_input(inputs, 3))?;
                vec![Tensor::new(shape, Data::I32(acc))?]
            }
            QuantOp::QLinearMatMul => vec![qlinear_matmul(cx, inputs)?],
            QuantOp::QLinearConv(c) => vec![qlinear_conv(cx, c, inputs)?],
            QuantOp::PackedMatMul(p) => vec![packed_matmul(cx, p, inputs)?],
            QuantOp::PackedConv(p) => vec![packed_conv(cx, p, inputs)?],
            QuantOp::QConv(q) => vec![qconv(cx, q, x)?],
            QuantOp::QAdd(q) => vec![qadd(cx, q, x, input(inputs, 1)?)?],
        })
    }
}

impl QuantAxis {
    fn parse(a: &Attrs) -> Result<QuantAxis, String> {
        let block_size = a.int_or("block_size", 0)?;
        Ok(QuantAxis {
            axis: a.int_or("axis", 1)?,
            block_size: usize::try_from(block_size)
                .map_err(|_| format!("attribute \"block_size\" is {block_size}, not >= 0"))?,
        })
    }

    /// How elements of a tensor of shape `x` find their parameter in a tensor of shape `p`.
    fn map(&self, x: &[usize], p: &[usize], what: &str) -> OpResult<ParamMap> {
        if checked_numel(p)? == 1 {
            return Ok(ParamMap::default());
        }
        let axis = axis_in(self.axis, x.len())?;
        let (dim, inner) = (x[axis], x[axis + 1..].iter().product::<usize>());
        if self.block_size == 0 {
            if p != [dim] {
                return shape_err(format!(
                    "{what} of shape {p:?}: quantizing {x:?} along axis {axis} needs a scalar or {dim} values"
                ));
            }
            return Ok(ParamMap {
                dim,
                inner,
                block: 1,
                strides: [0, 1, 0],
            });
        }
        let blocks = dim.div_ceil(self.block_size);
        let mut want = x.to_vec();
        want[axis] = blocks;
        if p != want {
            return shape_err(format!(
                "{what} of shape {p:?}: blocks of {} along axis {axis} of {x:?} need shape {want:?}",
                self.block_size
            ));
        }
        Ok(ParamMap {
            dim,
            inner,
            block: self.block_size,
            strides: [blocks * inner, inner, 1],
        })
    }
}

/// The parameter of element `i`: with `i` split into (outer, index along the axis, inner), the
/// parameter at `outer * s0 + (index / block) * s1 + inner * s2`. The default is one parameter.
#[derive(Default)]
struct ParamMap {
    dim: usize,
    inner: usize,
    block: usize,
    strides: [usize; 3],
}

impl ParamMap {
    fn index(&self, i: usize) -> usize {
        if self.block == 0 {
            return 0;
        }
        let along = self.dim * self.inner;
        let (outer, a, inner) = (i / along, i % along / self.inner, i % self.inner);
        outer * self.strides[0] + a / self.block * self.strides[1] + inner * self.strides[2]
    }
}

/// An element type attribute (0 or absent: none) that must be one of `allowed`.
fn dtype_attr(a: &Attrs, name: &str, allowed: &[DType]) -> Result<Option<DType>, String> {
    match a.int_or(name, 0)? {
        0 => Ok(None),
        code => DType::from_onnx(code as i32)
            .filter(|d| allowed.contains(d))
            .map(Some)
            .ok_or_else(|| {
                format!("attribute {name:?} is element type {code}, which is not supported here")
            }),
    }
}

/// The range of a quantized type.
fn range(dtype: DType) -> OpResult<(f64, f64)> {
    match dtype {
        DType::I8 => Ok((-128.0, 127.0)),
        DType::U8 => Ok((0.0, 255.0)),
        DType::I16 => Ok((-32768.0, 32767.0)),
        DType::U16 => Ok((0.0, 65535.0)),
        DType::Low(l) if l.is_int() => {
            let bits = l.bits() as i32;
            Ok(match l {
                Low::I4 | Low::I2 => (-(2f64.powi(bits - 1)), 2f64.powi(bits - 1) - 1.0),
                _ => (0.0, 2f64.powi(bits) - 1.0),
            })
        }
        d => Err(OpError::DType(format!(
            "integer quantized values must be int8, uint8, int16, uint16, int4, uint4, int2 or \
             uint2, not {d:?}"
        ))),
    }
}

/// `n` values of a quantized type from already rounded ones, saturated to its range.
fn saturate(dtype: DType, n: usize, value: impl Fn(usize) -> f64) -> OpResult<Data> {
    let (lo, hi) = range(dtype)?;
    let v = (0..n).map(|i| value(i).clamp(lo, hi));
    Ok(match dtype {
        DType::I8 => Data::I8(v.map(|v| v as i8).collect()),
        DType::I16 => Data::I16(v.map(|v| v as i16).collect()),
        DType::U16 => Data::U16(v.map(|v| v as u16).collect()),
        DType::Low(l) => Data::Low(l, v.map(|v| l.from_int(v as i64)).collect()),
        _ => Data::U8(v.map(|v| v as u8).collect()),
    })
}

/// Float contents (any float type), for scales and quantizer inputs.
fn floats(t: &Tensor, what: &str) -> OpResult<Vec<f64>> {
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 | DType::F64 => Ok(t.to_f64_vec()),
        d => Err(OpError::DType(format!(
            "{what} must be a float tensor, not {d:?}"
        ))),
    }
}

/// `v` rounded to `dtype`'s precision (f32, or a half type), as the reference's arithmetic in
/// that type rounds each result.
fn in_precision(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F32 => v as f32 as f64,
        _ => v,
    }
}

/// Zero points (absent: none), which must be of the quantized tensor's type and shaped like its
/// scales. Those of float types must be zero, and count as none.
fn zero_points(zp: Option<&Tensor>, dtype: DType, scale: &[usize]) -> OpResult<Option<Vec<i64>>> {
    let Some(zp) = zp else {
        return Ok(None);
    };
    if zp.dtype() != dtype {
        return Err(OpError::DType(format!(
            "zero point of type {:?} for values of type {dtype:?}",
            zp.dtype()
        )));
    }
    if zp.shape != scale && !(zp.len() == 1 && checked_numel(scale)? == 1) {
        return shape_err(format!(
            "zero point of shape {:?} for scales of shape {scale:?}",
            zp.shape
        ));
    }
    if let DType::Low(l) = dtype
        && !l.is_int()
    {
        if zp.to_f64_vec().iter().any(|&z| z != 0.0) {
            return Err(OpError::Unsupported(format!(
                "a {l:?} zero point other than 0 (float quantization has no offset)"
            )));
        }
        return Ok(None);
    }
    zp.to_i64_vec().map(Some)
}

fn quantize(
    q: &QuantizeAttrs,
    x: &Tensor,
    scale: &Tensor,
    zp: Option<&Tensor>,
) -> OpResult<Tensor> {
    let dtype = match (zp.map(|z| z.dtype()), q.output_dtype) {
        (Some(z), Some(o)) if z != o => {
            return Err(OpError::DType(format!(
                "zero point of type {z:?} where output_dtype is {o:?}"
            )));
        }
        (Some(z), _) => z,
        (None, o) => o.unwrap_or(DType::U8),
    };
    let float = match dtype {
        DType::Low(l) if !l.is_int() && QUANTIZED.contains(&dtype) => Some(l),
        _ => {
            range(dtype)?;
            None
        }
    };
    // int32 inputs divide exactly (in f64), float ones in their common type.
    let precision = q.precision.unwrap_or(match (x.dtype(), scale.dtype()) {
        (DType::I32, _) => DType::F64,
        (a, b) if a == b => a,
        _ => DType::F32,
    });
    let map = q.layout.map(&x.shape, &scale.shape, "scale")?;
    if let Some(y) = quantize_f32(x, scale, zp, dtype, precision, &map)? {
        return Tensor::new(x.shape.clone(), y);
    }
    let xv = match x.dtype() {
        DType::I32 => x.to_f64_vec(),
        _ => floats(x, "QuantizeLinear input")?,
    };
    let sv = floats(scale, "scale")?;
    let zv = zero_points(zp, dtype, &scale.shape)?;
    if let Some(l) = float {
        // Rounded to the float type from `x / scale` in the working precision.
        let mode = CastMode {
            saturate: q.saturate,
            ..CastMode::default()
        };
        // The reference adds a float4 zero point (always zero), which turns -0 into +0.
        let offset = l == Low::F4E2M1 && zp.is_some();
        let codes = (0..xv.len())
            .map(|i| {
                let v = in_precision(xv[i] / sv[map.index(i)], precision);
                l.from_f64(if offset { v + 0.0 } else { v }, mode)
            })
            .collect();
        return Tensor::new(x.shape.clone(), Data::Low(l, codes));
    }
    let data = saturate(dtype, xv.len(), |i| {
        let p = map.index(i);
        let z = zv.as_ref().map_or(0, |z| z[p]);
        in_precision(xv[i] / sv[p], precision).round_ties_even() + z as f64
    })?;
    Tensor::new(x.shape.clone(), data)
}

/// `clamp(round(x / scale) + zero, lo, hi)` in f32, as the reference works it for f32 `x / scale`
/// (an f32 quotient is the f64 one rounded to f32): quotients past ±2^22 are clamped first,
/// where every zero point saturates them the same way, and NaN becomes 0 as there.
///
/// Returned as `i32` (in `lo..=hi`), and written with `clip` (one vector max and min; `f32`'s
/// `max` and `clamp` add a NaN test per bound, and a NaN is replaced at the end anyway) and a
/// select rather than a saturating cast, so that the loops over it vectorise.
#[inline(always)]
fn quantize_value(x: f32, scale: f32, zero: f32, lo: f32, hi: f32) -> i32 {
    let q = x / scale;
    let v = clip(
        round_even(clip(q, -4_194_304.0, 4_194_304.0)) + zero,
        lo,
        hi,
    );
    let v = if q.is_nan() { 0.0 } else { v };
    // SAFETY: v is finite and within lo..=hi, a range of 8-bit values.
    unsafe { v.to_int_unchecked::<i32>() }
}

/// Elements per parameter run and the parameter count of a per-tensor or per-axis layout
/// (blocked ones: `None`).
fn runs(map: &ParamMap, len: usize) -> Option<(usize, usize)> {
    match map.block {
        0 => Some((len.max(1), 1)),
        1 => Some((map.inner.max(1), map.dim)),
        _ => None,
    }
}

/// QuantizeLinear of f32 by f32 scales to int8 or uint8 worked in f32, per tensor or per axis:
/// the reference's result, without its f64 detour. `None` for other cases.
fn quantize_f32(
    x: &Tensor,
    scale: &Tensor,
    zp: Option<&Tensor>,
    dtype: DType,
    precision: DType,
    map: &ParamMap,
) -> OpResult<Option<Data>> {
    let (Ok(xv), Ok(sv), DType::F32) = (x.as_f32(), scale.as_f32(), precision) else {
        return Ok(None);
    };
    if !matches!(dtype, DType::U8 | DType::I8) || zp.is_some_and(|z| z.dtype() != dtype) {
        return Ok(None);
    }
    let Some((run, count)) = runs(map, xv.len()) else {
        return Ok(None);
    };
    let zv = match zero_points(zp, dtype, &scale.shape)? {
        Some(z) => z.iter().map(|&z| z as f32).collect(),
        None => vec![0.0; sv.len()],
    };
    let param = |r: usize| if sv.len() == 1 { 0 } else { r % count };
    let params = |r: usize| (sv[param(r)], zv[param(r)]);
    Ok(Some(match dtype {
        DType::I8 => Data::I8(quantize_runs(xv, run, params)),
        _ => {
            // The kernels' vector loop, the same bytes.
            let mut y = vec![0u8; xv.len()];
            for (r, (y, x)) in y.chunks_mut(run).zip(xv.chunks(run)).enumerate() {
                let (s, z) = params(r);
                quantize_u8(x, s, z, y);
            }
            Data::U8(y)
        }
    }))
}

/// [`quantize_value`] of `x` in runs of `run` values, run `r` by `params(r)` (scale, zero).
fn quantize_runs<Y: Requantized>(
    x: &[f32],
    run: usize,
    params: impl Fn(usize) -> (f32, f32),
) -> Vec<Y> {
    let (lo, hi) = Y::RANGE;
    let mut y = vec![Y::default(); x.len()];
    for (r, (y, x)) in y.chunks_mut(run).zip(x.chunks(run)).enumerate() {
        let (s, z) = params(r);
        wide(
            #[inline(always)]
            || {
                for (y, &x) in y.iter_mut().zip(x) {
                    *y = Y::from_i32(quantize_value(x, s, z, lo, hi));
                }
            },
        );
    }
    y
}

/// DequantizeLinear of int8 or uint8 by f32 scales to f32, per tensor or per axis: the
/// reference's arithmetic (`(x - zero) as f32 * scale`) without its i64 and f64 copies.
fn dequantize_f32(
    cx: &Cx,
    x: &Tensor,
    scale: &Tensor,
    zp: Option<&Tensor>,
    map: &ParamMap,
) -> OpResult<Option<Tensor>> {
    let Ok(sv) = scale.as_f32() else {
        return Ok(None);
    };
    let Some((run, count)) = runs(map, x.len()) else {
        return Ok(None);
    };
    if !matches!(x.dtype(), DType::U8 | DType::I8) {
        return Ok(None);
    }
    let zv = zero_points(zp, x.dtype(), &scale.shape)?.unwrap_or_else(|| vec![0; sv.len()]);
    let param = |r: usize| if sv.len() == 1 { 0 } else { r % count };
    let mut y = cx.take_f32(x.len());
    match &x.data {
        Data::U8(v) => {
            for (r, (y, x)) in y.chunks_mut(run).zip(v.chunks(run)).enumerate() {
                let (s, z) = (sv[param(r)], zv[param(r)] as i32);
                for (y, &x) in y.iter_mut().zip(x) {
                    *y = (x as i32 - z) as f32 * s;
                }
            }
        }
        Data::I8(v) => {
            for (r, (y, x)) in y.chunks_mut(run).zip(v.chunks(run)).enumerate() {
                let (s, z) = (sv[param(r)], zv[param(r)] as i32);
                for (y, &x) in y.iter_mut().zip(x) {
                    *y = (x as i32 - z) as f32 * s;
                }
            }
        }
        _ => return Ok(None),
    }
    Ok(Some(Tensor::f32(x.shape.clone(), y)?))
}

fn dequantize(
    cx: &Cx,
    d: &DequantizeAttrs,
    x: &Tensor,
    scale: &Tensor,
    zp: Option<&Tensor>,
) -> OpResult<Tensor> {
    let float = match x.dtype() {
        DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::I32 => false,
        DType::Low(l) if l != Low::F8E8M0 => !l.is_int(),
        d => {
            return Err(OpError::DType(format!(
                "DequantizeLinear of {d:?}: int8, uint8, int16, uint16, int32, int4, uint4, \
                 int2, uint2, float8 (not e8m0) and float4 are supported"
            )));
        }
    };
    let map = d.layout.map(&x.shape, &scale.shape, "scale")?;
    if matches!(d.output_dtype, None | Some(DType::F32))
        && let Some(y) = dequantize_f32(cx, x, scale, zp, &map)?
    {
        return Ok(y);
    }
    let sv = floats(scale, "scale")?;
    let zv = zero_points(zp, x.dtype(), &scale.shape)?;
    let y: Vec<f32> = if float {
        let xv = x.to_f64_vec();
        (0..xv.len())
            .map(|i| xv[i] as f32 * sv[map.index(i)] as f32)
            .collect()
    } else {
        let xv = x.to_i64_vec()?;
        (0..xv.len())
            .map(|i| {
                let p = map.index(i);
                let z = zv.as_ref().map_or(0, |z| z[p]);
                (xv[i] - z) as f32 * sv[p] as f32
            })
            .collect()
    };
    let y = Tensor::f32(x.shape.clone(), y)?;
    Ok(narrow(&y, d.output_dtype.unwrap_or(scale.dtype())))
}

/// uint8 quantization of `x` over its own range widened to include 0: `[y, scale, zero point]`.
fn dynamic_quantize(cx: &Cx, x: &Tensor) -> OpResult<Vec<Tensor>> {
    use rayon::prelude::*;
    let v = x.as_f32()?;
    // The extremes of pieces, then of those: max and min are exact, so any split gives the
    // sequential fold's result.
    let (min, max) = match cx.pieces(v.len(), 16) {
        Some(len) => v
            .par_chunks(len)
            .map(extremes)
            .reduce(|| (0.0, 0.0), |a, b| (a.0.min(b.0), a.1.max(b.1))),
        None => extremes(v),
    };
    let (scale, zp) = dynamic_params(min, max);
    let mut y = cx.take_u8(v.len());
    cx.in_pieces(&mut y, 16, |at, y| {
        quantize_u8(&v[at..at + y.len()], scale, zp, y)
    });
    Ok(vec![
        Tensor::new(x.shape.clone(), Data::U8(y))?,
        Tensor::scalar_f32(scale),
        Tensor::new(vec![], Data::U8(vec![zp as u8]))?,
    ])
}

/// DynamicQuantizeLinear's uint8 scale and zero point for values from `min` to `max` (both
/// counting 0).
fn dynamic_params(min: f32, max: f32) -> (f32, f32) {
    let scale = if max == min { 1.0 } else { max - min } / 255.0;
    (
        scale,
        (0.0 - min / scale).clamp(0.0, 255.0).round_ties_even(),
    )
}

/// `v` quantized into `y` as DynamicQuantizeLinear does it on one thread: its scale and zero
/// point.
pub(crate) fn dynamic_quantize_into(v: &[f32], y: &mut [u8]) -> (f32, f32) {
    let (min, max) = extremes(v);
    let (scale, zp) = dynamic_params(min, max);
    quantize_u8(v, scale, zp, y);
    (scale, zp)
}

/// The smallest and largest of `v` and 0, NaN ignored.
fn extremes(v: &[f32]) -> (f32, f32) {
    // In 16 lanes, so that it vectorises: max and min ignore NaN, so any order gives the
    // sequential fold's result. Written as compares that keep the lane's value for NaN (one
    // vector max or min each), over whole arrays of 16, into extremes local to the loop:
    // with bounds checks, or with the extremes in memory, it stayed scalar.
    let (chunks, tail) = v.as_chunks::<16>();
    let (hi, lo) = wide(
        #[inline(always)]
        || {
            let (mut hi, mut lo) = ([0.0f32; 16], [0.0f32; 16]);
            for c in chunks {
                for l in 0..16 {
                    hi[l] = if c[l] > hi[l] { c[l] } else { hi[l] };
                    lo[l] = if c[l] < lo[l] { c[l] } else { lo[l] };
                }
            }
            (hi, lo)
        },
    );
    let max = tail.iter().chain(&hi).fold(0.0f32, |m, &e| m.max(e));
    let min = tail.iter().chain(&lo).fold(0.0f32, |m, &e| m.min(e));
    (min, max)
}

/// An 8-bit operand as `i16` less its zero point: one for the whole tensor, or with `per` set to
/// `(count, index)` one per `index(i)` of `count` (a row or a channel).
fn centred(
    t: &Tensor,
    zp: Option<&Tensor>,
    per: Option<(usize, &dyn Fn(usize) -> usize)>,
    what: &str,
) -> OpResult<Vec<i16>> {
    if !matches!(t.dtype(), DType::I8 | DType::U8) {
        return Err(OpError::DType(format!(
            "{what} must be int8 or uint8, not {:?}",
            t.dtype()
        )));
    }
    let z = match zp {
        None => vec![0],
        Some(z) if z.dtype() != t.dtype() => {
            return Err(OpError::DType(format!(
                "{what}'s zero point is {:?}, not {:?}",
                z.dtype(),
                t.dtype()
            )));
        }
        Some(z) => z.to_i64_vec()?,
    };
    let pick: &dyn Fn(usize) -> usize = match (z.len(), per) {
        (1, _) => &|_| 0,
        (n, Some((count, index))) if n == count => index,
        (n, _) => {
            return Err(OpError::Unsupported(format!(
                "{what} has {n} zero points: per-tensor{} are supported",
                per.map_or(String::new(), |(c, _)| format!(" and {c} (one per output)"))
            )));
        }
    };
    let v = t.to_i64_vec()?;
    Ok(v.iter()
        .enumerate()
        .map(|(i, &e)| (e - z[pick(i)]) as i16)
        .collect())
}

/// `(a - a_zp) · (b - b_zp)` in `i32`, numpy-batched; `b_zp` may be one per column.
fn integer_matmul(
    cx: &Cx,
    a: &Tensor,
    a_zp: Option<&Tensor>,
    b: &Tensor,
    b_zp: Option<&Tensor>,
) -> OpResult<(Vec<i32>, MatMulShape)> {
    let s = MatMulShape::of(&a.shape, &b.shape)?;
    let (m, k, n) = (s.m, s.k, s.n);
    let av = centred(a, a_zp, None, "A")?;
    let column = |i: usize| i % n.max(1);
    let bv = centred(b, b_zp, Some((n, &column)), "B")?;
    let mut out = vec![0i32; checked_numel(&s.out)?];
    if m * n > 0 {
        let (ia, ib) = s.operands();
        for (bi, dst) in out.chunks_mut(m * n).enumerate() {
            let am = &av[ia[bi] * m * k..(ia[bi] + 1) * m * k];
            let bm = &bv[ib[bi] * k * n..(ib[bi] + 1) * k * n];
            igemm(cx.threads, m, n, k, am, bm, dst);
        }
    }
    Ok((out, s))
}

/// `conv(x - x_zp, w - w_zp)` in `i32`; `w_zp` may be one per output channel.
fn integer_conv(
    cx: &Cx,
    c: &ConvAttrs,
    x: &Tensor,
    x_zp: Option<&Tensor>,
    w: &Tensor,
    w_zp: Option<&Tensor>,
) -> OpResult<(Vec<i32>, Vec<usize>)> {
    let (p, shape) = conv_geometry(c, &x.shape, &w.shape)?;
    let mut out = vec![0i32; checked_numel(&shape)?];
    if out.is_empty() {
        return Ok((out, shape));
    }
    // The im2col buffer of one group.
    checked_numel(&[p.c / p.groups, p.kh, p.kw, p.oh, p.ow])?;
    let xv = centred(x, x_zp, None, "x")?;
    let per_filter = w.len() / p.m.max(1);
    let channel = |i: usize| i / per_filter.max(1);
    let wv = centred(w, w_zp, Some((p.m, &channel)), "w")?;
    conv2d_integer(&p, &xv, &wv, &mut out, cx.threads);
    Ok((out, shape))
}

/// That `what`'s zero point, where there is one, is a single value of `t`'s type.
fn single_zero_point(zp: Option<&Tensor>, t: &Tensor, what: &str) -> OpResult<()> {
    let Some(z) = zp else {
        return Ok(());
    };
    single(z, &format!("{what}'s zero point"))?;
    if z.dtype() != t.dtype() {
        return Err(OpError::DType(format!(
            "{what}'s zero point is {:?}, not {:?}",
            z.dtype(),
            t.dtype()
        )));
    }
    Ok(())
}

/// `a` (8-bit, with a single zero point) packed for `qgemm` as `m` rows of `k`.
fn pack_rows(a: &Tensor, zp: Option<&Tensor>, m: usize, k: usize) -> OpResult<PackedA> {
    single_zero_point(zp, a, "A")?;
    let mut pa = PackedA::default();
    match (&a.data, zp.map(|z| &z.data)) {
        (Data::U8(v), z) => {
            let z = match z {
                Some(Data::U8(z)) => z[0],
                _ => 0,
            };
            pa.pack(m, k, v, k, z)
        }
        (Data::I8(v), z) => {
            let z = match z {
                Some(Data::I8(z)) => z[0],
                _ => 0,
            };
            pa.pack(m, k, v, k, z)
        }
        (d, _) => {
            return Err(OpError::DType(format!(
                "A must be int8 or uint8, not {:?}",
                d.dtype()
            )));
        }
    }
    Ok(pa)
}

/// Constant weights `[k, n]` (int8 or uint8) with their zero point (none, one, or one per
/// column) packed for `qgemm`; `None` when they are of another type or shape.
pub fn pack_weights(b: &Tensor, zp: Option<&Tensor>) -> Option<PackedB> {
    let &[k, n] = b.shape.as_slice() else {
        return None;
    };
    let zn = zp.map_or(1, |z| z.len());
    if zp.is_some_and(|z| z.rank() > 1 || z.dtype() != b.dtype()) || (zn != 1 && zn != n) {
        return None;
    }
    Some(match (&b.data, zp.map(|z| &z.data)) {
        (Data::I8(v), None) => PackedB::new(k, n, v, (n, 1), &[0]),
        (Data::I8(v), Some(Data::I8(z))) => PackedB::new(k, n, v, (n, 1), z),
        (Data::U8(v), None) => PackedB::new(k, n, v, (n, 1), &[0]),
        (Data::U8(v), Some(Data::U8(z))) => PackedB::new(k, n, v, (n, 1), z),
        _ => return None,
    })
}

fn packed_matmul(cx: &Cx, p: &PackedMatMul, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let a = input(inputs, 0)?;
    let s = MatMulShape::of(&a.shape, &p.shape)?;
    let (k, n) = (p.shape[0], p.shape[1]);
    let rows = checked_numel(&s.out)? / n.max(1);
    let pa = pack_rows(a, opt_input(inputs, 1), rows, k)?;
    if !p.scaled {
        let mut acc = vec![0i32; rows * n];
        qgemm(cx.threads, &pa, &p.b, &mut acc);
        return Tensor::new(s.out, Data::I32(acc));
    }
    let scale = input(inputs, 2)?;
    if scale.len() != 1 || scale.rank() > s.out.len() {
        return shape_err(format!(
            "a scale of shape {:?} for a product of shape {:?}",
            scale.shape, s.out
        ));
    }
    let scale = scale.as_f32()?[0];
    let mut out = cx.take_f32(rows * n);
    // Cast, Mul and Add as those ops round them, on the sums while they are in cache.
    match &p.bias {
        Some(bias) => qgemm_map(cx.threads, &pa, &p.b, &mut out, |_, j0, acc, o| {
            for ((o, &a), &b) in o.iter_mut().zip(acc).zip(&bias[j0..]) {
                *o = a as f32 * scale + b;
            }
        }),
        None => qgemm_map(cx.threads, &pa, &p.b, &mut out, |_, _, acc, o| {
            for (o, &a) in o.iter_mut().zip(acc) {
                *o = a as f32 * scale;
            }
        }),
    }
    Tensor::f32(s.out, out)
}

fn packed_conv(cx: &Cx, pc: &PackedConv, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let (p, shape) = conv_geometry(&pc.conv, &x.shape, &pc.w_shape)?;
    let total = checked_numel(&shape)?;
    if !pc.scaled {
        let mut acc = vec![0i32; total];
        conv_groups(cx, pc, &p, x, opt_input(inputs, 1), &mut acc, &|_, a, o| {
            o.copy_from_slice(a)
        })?;
        return Tensor::new(shape, Data::I32(acc));
    }
    let scale = input(inputs, 2)?;
    if scale.len() != 1 {
        return shape_err(format!(
            "a scale of shape {:?} for a convolution's sums: one value is fused",
            scale.shape
        ));
    }
    let scale = scale.as_f32()?[0];
    let bias = match opt_input(inputs, 3) {
        Some(b) => match &b.data {
            Data::I32(v) if v.len() == p.m || v.len() == 1 => Some(v.as_slice()),
            _ => {
                return shape_err(format!(
                    "a bias of {:?} {:?} added to the int32 sums of {} channels: one value \
                     or one per channel is fused",
                    b.dtype(),
                    b.shape,
                    p.m
                ));
            }
        },
        None => None,
    };
    let mut out = cx.take_f32(total);
    // Add, Cast, Mul, the float bias and the activation as those ops round them, on the sums
    // while they are in cache.
    conv_groups(
        cx,
        pc,
        &p,
        x,
        opt_input(inputs, 1),
        &mut out,
        &|c, acc, o| {
            let b = bias.map_or(0, |b| b[if b.len() == 1 { 0 } else { c }]);
            for (o, &a) in o.iter_mut().zip(acc) {
                *o = a.wrapping_add(b) as f32 * scale;
            }
            if let Some(f) = &pc.bias {
                o.iter_mut().for_each(|o| *o += f[c]);
            }
            if let Some(act) = pc.act {
                o.iter_mut().for_each(|o| *o = act.apply(*o));
            }
        },
    )?;
    Tensor::f32(shape, out)
}

/// [`conv_rows`] of each group of every image of `x` (8-bit, with its single zero point `zp`)
/// by `pc`'s packs, the epilogue given the channel's index among all `M`.
fn conv_groups<Y: Copy + Default + Send>(
    cx: &Cx,
    pc: &PackedConv,
    p: &Conv2d,
    x: &Tensor,
    zp: Option<&Tensor>,
    y: &mut [Y],
    epilogue: &(impl Fn(usize, &[i32], &mut [Y]) + Sync),
) -> OpResult<()> {
    single_zero_point(zp, x, "x")?;
    match (&x.data, zp.map(|z| &z.data)) {
        (Data::U8(v), z) => {
            let zero = if let Some(Data::U8(z)) = z { z[0] } else { 0 };
            conv_each_group(cx, &pc.w, p, v, zero, y, epilogue);
        }
        (Data::I8(v), z) => {
            let zero = if let Some(Data::I8(z)) = z { z[0] } else { 0 };
            conv_each_group(cx, &pc.w, p, v, zero, y, epilogue);
        }
        (d, _) => {
            return Err(OpError::DType(format!(
                "ConvInteger's x must be int8 or uint8, not {:?}",
                d.dtype()
            )));
        }
    }
    Ok(())
}

fn conv_each_group<T: Int8, Y: Copy + Default + Send>(
    cx: &Cx,
    w: &IntegerFilter,
    p: &Conv2d,
    x: &[T],
    zero: T,
    y: &mut [Y],
    epilogue: &(impl Fn(usize, &[i32], &mut [Y]) + Sync),
) {
    if y.is_empty() {
        return;
    }
    let packs = match w {
        IntegerFilter::Rows(packs) => packs,
        IntegerFilter::Depthwise(w) => return qdepthwise(cx.threads, p, x, zero, w, y, epilogue),
    };
    let [w] = packs.as_slice() else {
        // One image's group at a time: its channels are contiguous in `x` and in `y`.
        let (c, m) = (p.c / packs.len(), p.m / packs.len());
        let part = Conv2d {
            n: 1,
            c,
            m,
            groups: 1,
            ..*p
        };
        let (x_part, y_part) = (c * p.h * p.w, m * p.oh * p.ow);
        let parts = x.chunks_exact(x_part).zip(y.chunks_exact_mut(y_part));
        for (i, (x, y)) in parts.enumerate() {
            let first = i % packs.len() * m;
            let w = &packs[i % packs.len()];
            conv_rows(cx, w, &part, x, zero, y, &|c, acc, out| {
                epilogue(first + c, acc, out)
            });
        }
        return;
    };
    conv_rows(cx, w, p, x, zero, y, epilogue);
}

/// Row `row` of one image's im2col matrix, `oh·ow` values: the input under kernel tap `row`
/// (a channel, kernel row and kernel column) at every output position, the zero point where
/// the tap hangs over the padding.
fn im2col_row<T: Int8>(p: &Conv2d, x: &[T], row: usize, zero: T, dst: &mut [T]) {
    let (ci, ky, kx) = (row / (p.kh * p.kw), row / p.kw % p.kh, row % p.kw);
    let ch = &x[ci * p.h * p.w..(ci + 1) * p.h * p.w];
    let off = kx * p.dw;
    // The padding, in one pass rather than a few values at a time.
    let past_end = (p.oh - 1) * p.sh + (p.kh - 1) * p.dh >= p.h + p.pt
        || (p.ow - 1) * p.sw + (p.kw - 1) * p.dw >= p.w + p.pl;
    if p.pt > 0 || p.pl > 0 || past_end {
        dst.fill(zero);
    }
    for (oy, d) in dst.chunks_exact_mut(p.ow).enumerate() {
        let iy = (oy * p.sh + ky * p.dh).wrapping_sub(p.pt);
        if iy >= p.h {
            continue;
        }
        let src = &ch[iy * p.w..(iy + 1) * p.w];
        if p.sw == 1 {
            // ix = ox + off - pl, valid for ox in lo..hi.
            let lo = p.pl.saturating_sub(off).min(p.ow);
            let hi = (p.w + p.pl).saturating_sub(off).min(p.ow);
            d[lo..hi].copy_from_slice(&src[lo + off - p.pl..hi + off - p.pl]);
        } else {
            // ix = ox·sw + off - pl, valid for ox in lo..hi.
            let lo = p.pl.saturating_sub(off).div_ceil(p.sw).min(p.ow);
            let hi = (p.w + p.pl).saturating_sub(off).div_ceil(p.sw).min(p.ow);
            if lo < hi {
                let from = lo * p.sw + off - p.pl;
                for (d, &v) in d[lo..hi].iter_mut().zip(src[from..].iter().step_by(p.sw)) {
                    *d = v;
                }
            }
        }
    }
}

fn qconv(cx: &Cx, q: &QConv, x: &Tensor) -> OpResult<Tensor> {
    let w = match &q.w {
        QConvWeights::Taps(w) => return qconv_nhwc(cx, q, w, x),
        QConvWeights::Rows(w) => w,
    };
    let (p, shape) = conv_geometry(&q.conv, &x.shape, &q.w_shape)?;
    if x.dtype() != q.x_dtype || p.groups != 1 {
        return Err(OpError::DType(format!(
            "quantized Conv of {:?} in {} groups, built for {:?} in one",
            x.dtype(),
            p.groups,
            q.x_dtype
        )));
    }
    let total = checked_numel(&shape)?;
    let data = match (&x.data, q.y_dtype) {
        (Data::U8(v), DType::I8) => Data::I8(qconv_images(cx, q, w, &p, v, q.x_zero, total)),
        (Data::U8(v), _) => Data::U8(qconv_images(cx, q, w, &p, v, q.x_zero, total)),
        (Data::I8(v), DType::I8) => Data::I8(qconv_images(cx, q, w, &p, v, q.x_zero as i8, total)),
        (Data::I8(v), _) => Data::U8(qconv_images(cx, q, w, &p, v, q.x_zero as i8, total)),
        _ => unreachable!("x's type is checked above"),
    };
    Tensor::new(shape, data)
}

/// [`qconv`] of NHWC uint8 `x` to NHWC, by weights packed as taps.
fn qconv_nhwc(cx: &Cx, q: &QConv, w: &PackedB, x: &Tensor) -> OpResult<Tensor> {
    let Data::U8(xv) = &x.data else {
        return Err(OpError::DType(format!(
            "NHWC quantized Conv of {:?}, built for uint8",
            x.dtype()
        )));
    };
    if q.matmul {
        return qmatmul(cx, q, w, x, xv);
    }
    if x.rank() != 4 {
        return shape_err(format!("NHWC quantized Conv of shape {:?}", x.shape));
    }
    let nchw = [x.shape[0], x.shape[3], x.shape[1], x.shape[2]];
    let (mut p, shape) = conv_geometry(&q.conv, &nchw, &q.w_shape)?;
    p.n = x.shape[0];
    if !nhwc_applies(&p, w) {
        return Err(OpError::Unsupported(format!(
            "NHWC quantized Conv of {p:?} with these weights"
        )));
    }
    let shape = vec![shape[0], shape[2], shape[3], shape[1]];
    let total = checked_numel(&shape)?;
    let data = match q.y_dtype {
        DType::I8 => Data::I8(qconv_nhwc_into(cx, q, &p, w, xv, total)),
        _ => Data::U8(qconv_nhwc_into(cx, q, &p, w, xv, total)),
    };
    Tensor::new(shape, data)
}

/// [`qconv_nhwc`] of a [`QConv::matmul`]: the rows of `x` `[..., K]` as the positions of a
/// 1x1 convolution over `[rows, 1, 1, K]`.
fn qmatmul(cx: &Cx, q: &QConv, w: &PackedB, x: &Tensor, xv: &[u8]) -> OpResult<Tensor> {
    let (m, k) = (q.w_shape[0], q.w_shape[1]);
    let Some((&kx, lead)) = x.shape.split_last() else {
        return shape_err("quantized MatMul of a scalar".to_string());
    };
    if kx != k {
        return shape_err(format!(
            "quantized MatMul of shape {:?} by weights of {k} rows",
            x.shape
        ));
    }
    let rows = checked_numel(lead)?;
    let (mut p, _) = conv_geometry(&q.conv, &[rows, k, 1, 1], &q.w_shape)?;
    p.n = rows;
    let shape = [lead, &[m]].concat();
    let total = checked_numel(&shape)?;
    let data = match q.y_dtype {
        DType::I8 => Data::I8(qconv_nhwc_into(cx, q, &p, w, xv, total)),
        _ => Data::U8(qconv_nhwc_into(cx, q, &p, w, xv, total)),
    };
    Tensor::new(shape, data)
}

fn qconv_nhwc_into<Y: Requantized>(
    cx: &Cx,
    q: &QConv,
    p: &Conv2d,
    w: &PackedB,
    x: &[u8],
    total: usize,
) -> Vec<Y> {
    let mut y = Y::buffer(cx, total);
    qconv::qconv_nhwc(
        cx.threads,
        p,
        x,
        q.x_zero,
        w,
        &requantization::<Y>(q),
        &mut y,
    );
    y
}

/// How `q`'s sums become its output values of type `Y`.
fn requantization<Y: Requantized>(q: &QConv) -> Requantize<'_> {
    let (lo, hi) = Y::RANGE;
    Requantize {
        mult: &q.mult,
        offset: &q.offset,
        zero: q.y_zero,
        lo: if q.relu { q.y_zero.max(lo) } else { lo },
        hi,
    }
}

/// An 8-bit output type, as the requantization writes it.
trait Requantized: Byte + Default {
    const RANGE: (f32, f32);
    /// A buffer of `n` values to write every one of: a recycled one where `cx` has one.
    fn buffer(cx: &Cx, n: usize) -> Vec<Self>;
}
impl Requantized for u8 {
    const RANGE: (f32, f32) = (0.0, 255.0);
    fn buffer(cx: &Cx, n: usize) -> Vec<u8> {
        cx.take_u8(n)
    }
}
impl Requantized for i8 {
    const RANGE: (f32, f32) = (-128.0, 127.0);
    fn buffer(_: &Cx, n: usize) -> Vec<i8> {
        vec![0; n]
    }
}

/// Output positions one integer product covers at most. Images whose outputs are small (14x14,
/// 7x7) go into one product several at a time: fewer columns of a 16-wide panel are padding,
/// and there is more to split across threads.
const PRODUCT_COLUMNS: usize = 1024;

/// The quantized convolution of every image: `[n][M][oh·ow]`.
fn qconv_images<T: Int8, Y: Requantized>(
    cx: &Cx,
    q: &QConv,
    w: &PackedA,
    p: &Conv2d,
    x: &[T],
    zero: T,
    total: usize,
) -> Vec<Y> {
    let mut y = Y::buffer(cx, total);
    let rq = requantization::<Y>(q);
    conv_rows(cx, w, p, x, zero, &mut y, &|c, acc, out| {
        rq.channel(c, acc, out)
    });
    y
}

/// The integer convolution (one group) of every image of `x` by weights packed as rows, into
/// `y` (`[n][M][oh·ow]`): each output channel's sums pass through `epilogue(channel, sums,
/// out)` on their way out, at most 16 at a time.
fn conv_rows<T: Int8, Y: Copy + Default + Send>(
    cx: &Cx,
    w: &PackedA,
    p: &Conv2d,
    x: &[T],
    zero: T,
    y: &mut [Y],
    epilogue: &(impl Fn(usize, &[i32], &mut [Y]) + Sync),
) {
    let (plane, positions) = (p.c * p.h * p.w, p.oh * p.ow);
    let k = p.c * p.kh * p.kw;
    if y.is_empty() {
        return;
    }
    let rows = |c: usize, _, acc: &[i32], out: &mut [Y]| epilogue(c, acc, out);
    // The packed images live on between runs (no page faults, no zeroing).
    thread_local! {
        static PACKED: std::cell::RefCell<PackedB> = std::cell::RefCell::default();
    }
    let mut b = PACKED.take();
    let per = (PRODUCT_COLUMNS / positions).clamp(1, y.len() / (p.m * positions));
    let mut staged = Vec::new();
    for (chunk, y) in y.chunks_mut(per * p.m * positions).enumerate() {
        let images = y.len() / (p.m * positions);
        let x = &x[chunk * per * plane..][..images * plane];
        let n = images * positions;
        if images == 1 && p.is_pointwise() {
            // A 1x1 convolution with stride 1 reads the image itself, `C × positions`.
            b.pack_rows(k, n, x, zero);
        } else {
            b.pack_filled(k, n, zero, |row, cols| {
                for (x, cols) in x.chunks_exact(plane).zip(cols.chunks_exact_mut(positions)) {
                    match p.is_pointwise() {
                        true => cols.copy_from_slice(&x[row * positions..(row + 1) * positions]),
                        false => im2col_row(p, x, row, zero, cols),
                    }
                }
            });
        }
        if images == 1 {
            qgemm_map(cx.threads, w, &b, y, rows);
            continue;
        }
        // `[M][images·positions]`, then each image's columns to its own `[M][positions]`.
        staged.clear();
        staged.resize(p.m * n, Y::default());
        qgemm_map(cx.threads, w, &b, &mut staged, rows);
        for (c, row) in staged.chunks_exact(n).enumerate() {
            for (img, cols) in row.chunks_exact(positions).enumerate() {
                y[(img * p.m + c) * positions..][..positions].copy_from_slice(cols);
            }
        }
    }
    PACKED.set(b);
}

/// A tensor of 8-bit values with its scale and zero point as a [`DequantizeAttrs`] call.
fn dequantized(cx: &Cx, t: &Tensor, q: &Quantized) -> OpResult<Tensor> {
    let zero = match q.dtype {
        DType::I8 => Tensor::new(vec![], Data::I8(vec![q.zero as i8]))?,
        _ => Tensor::new(vec![], Data::U8(vec![q.zero as u8]))?,
    };
    let d = DequantizeAttrs {
        layout: QuantAxis {
            axis: 1,
            block_size: 0,
        },
        output_dtype: None,
    };
    dequantize(cx, &d, t, &Tensor::scalar_f32(q.scale), Some(&zero))
}

/// `quantize(f(i))` for `n` elements, to the output's type.
fn quantized_data(y: &Quantized, n: usize, f: impl Fn(usize) -> f32) -> Data {
    let (lo, hi) = match y.dtype {
        DType::I8 => (-128.0, 127.0),
        _ => (0.0, 255.0),
    };
    let (sy, zy) = (y.scale, y.zero as f32);
    match y.dtype {
        DType::I8 => Data::I8(
            (0..n)
                .map(|i| quantize_value(f(i), sy, zy, lo, hi) as i8)
                .collect(),
        ),
        _ => Data::U8(
            (0..n)
                .map(|i| quantize_value(f(i), sy, zy, lo, hi) as u8)
                .collect(),
        ),
    }
}

/// `Q(Relu?((a - za)·sa + (b - zb)·sb))` over two slices of equal length.
fn qadd_slices<A: Copy + Into<i32> + Sync, B: Copy + Into<i32> + Sync>(
    cx: &Cx,
    q: &QAdd,
    a: &[A],
    b: &[B],
) -> Data {
    match q.y.dtype {
        DType::I8 => Data::I8(qadd_into(cx, q, a, b)),
        _ => Data::U8(qadd_into(cx, q, a, b)),
    }
}

/// [`qadd_slices`] to one output type. Every parameter is a local copy and the loop writes a
/// buffer of its own, so nothing it stores can alias what it reads and the loop vectorises.
fn qadd_into<A: Copy + Into<i32> + Sync, B: Copy + Into<i32> + Sync, Y: Requantized>(
    cx: &Cx,
    q: &QAdd,
    a: &[A],
    b: &[B],
) -> Vec<Y> {
    let (lo, hi) = Y::RANGE;
    let (sa, za, sb, zb) = (q.a.scale, q.a.zero, q.b.scale, q.b.zero);
    let (sy, zy, relu) = (q.y.scale, q.y.zero as f32, q.relu);
    let floor = if relu { 0.0 } else { f32::NEG_INFINITY };
    let mut y = Y::buffer(cx, a.len().min(b.len()));
    in_pieces(cx, &mut y, a, b, |y, a, b| {
        wide(
            #[inline(always)]
            || {
                for (y, (&a, &b)) in y.iter_mut().zip(a.iter().zip(b)) {
                    let v = (a.into() - za) as f32 * sa + (b.into() - zb) as f32 * sb;
                    // `v.max(floor)` as one vector max (NaN gives `floor` either way).
                    let v = if v > floor { v } else { floor };
                    *y = Y::from_i32(quantize_value(v, sy, zy, lo, hi));
                }
            },
        )
    });
    y
}

/// `f(y, a, b)` over pieces of `y` and the same elements of `a` and `b`: split across the
/// threads in cache-sized pieces when there is enough to split.
fn in_pieces<A: Sync, B: Sync, Y: Send>(
    cx: &Cx,
    y: &mut [Y],
    a: &[A],
    b: &[B],
    f: impl Fn(&mut [Y], &[A], &[B]) + Sync,
) {
    const PIECE: usize = 1 << 14;
    let (a, b) = (&a[..y.len()], &b[..y.len()]);
    if cx.threads > 1 && y.len() >= 2 * PIECE {
        use rayon::prelude::*;
        y.par_chunks_mut(PIECE)
            .zip(a.par_chunks(PIECE).zip(b.par_chunks(PIECE)))
            .for_each(|(y, (a, b))| f(y, a, b));
    } else {
        f(y, a, b);
    }
}

/// [`qadd_into`] of uint8 inputs to uint8, on the kernels' vector loop (the same bytes).
fn qadd_bytes(cx: &Cx, q: &QAdd, a: &[u8], b: &[u8]) -> Vec<u8> {
    let p = QAddParams {
        a_scale: q.a.scale,
        a_zero: q.a.zero,
        b_scale: q.b.scale,
        b_zero: q.b.zero,
        y_scale: q.y.scale,
        y_zero: q.y.zero as f32,
        floor: if q.relu { 0.0 } else { f32::NEG_INFINITY },
    };
    let mut y = cx.take_u8(a.len().min(b.len()));
    in_pieces(cx, &mut y, a, b, |y, a, b| qadd_u8(&p, a, b, y));
    y
}

fn qadd(cx: &Cx, q: &QAdd, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    if a.shape != b.shape || a.dtype() != q.a.dtype || b.dtype() != q.b.dtype {
        // A broadcast (or inputs of other types): the separate ops.
        let sum = super::elementwise::binary(
            super::elementwise::Binary::Add,
            &dequantized(cx, a, &q.a)?,
            &dequantized(cx, b, &q.b)?,
        )?;
        let v = sum.as_f32()?;
        let data = quantized_data(&q.y, v.len(), |i| match q.relu {
            true => v[i].max(0.0),
            false => v[i],
        });
        return Tensor::new(sum.shape, data);
    }
    let data = match (&a.data, &b.data) {
        (Data::U8(a), Data::U8(b)) if q.y.dtype == DType::U8 => Data::U8(qadd_bytes(cx, q, a, b)),
        (Data::U8(a), Data::U8(b)) => qadd_slices(cx, q, a, b),
        (Data::U8(a), Data::I8(b)) => qadd_slices(cx, q, a, b),
        (Data::I8(a), Data::U8(b)) => qadd_slices(cx, q, a, b),
        (Data::I8(a), Data::I8(b)) => qadd_slices(cx, q, a, b),
        (a, _) => {
            return Err(OpError::DType(format!(
                "a quantized Add of {:?}",
                a.dtype()
            )));
        }
    };
    Tensor::new(a.shape.clone(), data)
}

/// A scale or zero point that must be a single value.
fn single(t: &Tensor, what: &str) -> OpResult<f64> {
    match t.len() {
        1 => Ok(t.to_f64_vec()[0]),
        n => Err(OpError::Unsupported(format!(
            "{what} has {n} values: only a per-tensor one is supported"
        ))),
    }
}

/// Per output channel, `scale_a * scale_b[c] / scale_y` worked in the scales' type (every one
/// of them exact in f32); `scale_b` is one value or `channels`.
fn multipliers(a: &Tensor, b: &Tensor, y: &Tensor, channels: usize) -> OpResult<Vec<f32>> {
    let dtype = a.dtype();
    if b.dtype() != dtype || y.dtype() != dtype {
        return Err(OpError::DType(format!(
            "scales of types {dtype:?}, {:?} and {:?}",
            b.dtype(),
            y.dtype()
        )));
    }
    let (sa, sy) = (
        single(a, "the first scale")?,
        single(y, "the output scale")?,
    );
    let sb = floats(b, "scale")?;
    if sb.len() != 1 && sb.len() != channels {
        return shape_err(format!(
            "{} weight scales for {channels} output channels",
            sb.len()
        ));
    }
    Ok(sb
        .iter()
        .map(|&sb| in_precision(in_precision(sa * sb, dtype) / sy, dtype) as f32)
        .collect())
}

/// `round(acc * multiplier[channel(i)]) + zp`, saturated to `dtype`. The product is rounded to
/// f32 first, as onnxruntime's requantization (and the packed kernels') computes it: in f64 a
/// product an f32 rounding puts on a tie (25.4999996 → 25.5) rounds the other way, one step
/// off in one output of a few hundred thousand, and those steps grow through a network.
fn requantize(
    acc: &[i32],
    mult: &[f32],
    channel: impl Fn(usize) -> usize,
    zp: f64,
    dtype: DType,
) -> OpResult<Data> {
    let pick = |i| if mult.len() == 1 { 0 } else { channel(i) };
    saturate(dtype, acc.len(), |i| {
        f64::from((acc[i] as f32 * mult[pick(i)]).round_ties_even()) + zp
    })
}

/// The output zero point (a single value) and the output type it sets (`like` without one).
fn output_zero_point(zp: Option<&Tensor>, like: &Tensor) -> OpResult<(f64, DType)> {
    match zp {
        Some(z) => Ok((single(z, "the output zero point")?, z.dtype())),
        None => Ok((0.0, like.dtype())),
    }
}

fn qlinear_matmul(cx: &Cx, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let (a, b) = (input(inputs, 0)?, input(inputs, 3)?);
    let a_zp = opt_input(inputs, 2);
    if let Some(z) = a_zp {
        single(z, "a's zero point")?;
    }
    let (acc, s) = integer_matmul(cx, a, a_zp, b, opt_input(inputs, 5))?;
    let mult = multipliers(input(inputs, 1)?, input(inputs, 4)?, input(inputs, 6)?, s.n)?;
    let (zp, dtype) = output_zero_point(opt_input(inputs, 7), a)?;
    let n = s.n.max(1);
    Tensor::new(s.out, requantize(&acc, &mult, |i| i % n, zp, dtype)?)
}

fn qlinear_conv(cx: &Cx, c: &ConvAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let (x, w) = (input(inputs, 0)?, input(inputs, 3)?);
    let x_zp = opt_input(inputs, 2);
    if let Some(z) = x_zp {
        single(z, "x's zero point")?;
    }
    let (mut acc, shape) = integer_conv(cx, c, x, x_zp, w, opt_input(inputs, 5))?;
    let m = shape[1];
    let plane = shape[2..].iter().product::<usize>().max(1);
    let channel = |i: usize| i / plane % m.max(1);
    if let Some(bias) = opt_input(inputs, 8) {
        let Data::I32(bv) = &bias.data else {
            return Err(OpError::DType(format!(
                "bias of {:?}, not int32",
                bias.dtype()
            )));
        };
        if bv.len() != m {
            return shape_err(format!("{} bias values for {m} output channels", bv.len()));
        }
        for (i, v) in acc.iter_mut().enumerate() {
            *v = v.wrapping_add(bv[channel(i)]);
        }
    }
    let mult = multipliers(input(inputs, 1)?, input(inputs, 4)?, input(inputs, 6)?, m)?;
    let (zp, dtype) = output_zero_point(opt_input(inputs, 7), x)?;
    Tensor::new(shape, requantize(&acc, &mult, channel, zp, dtype)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u8s(shape: Vec<usize>, v: Vec<u8>) -> Tensor {
        Tensor::new(shape, Data::U8(v)).unwrap()
    }

    fn layout(axis: i64, block_size: usize) -> QuantAxis {
        QuantAxis { axis, block_size }
    }

    #[test]
    fn quantize_rounds_half_to_even_then_adds_the_zero_point() {
        let q = QuantizeAttrs {
            layout: layout(1, 0),
            output_dtype: None,
            precision: None,
            saturate: true,
        };
        let x = Tensor::f32(vec![6], vec![1.0, 3.0, 5.0, -1.0, 1000.0, -1000.0]).unwrap();
        let s = Tensor::scalar_f32(2.0);
        let z = u8s(vec![], vec![1]);
        let y = quantize(&q, &x, &s, Some(&z)).unwrap();
        assert_eq!(y.data, Data::U8(vec![1, 3, 3, 1, 255, 0]));
        // No zero point: uint8, or output_dtype.
        let q8 = QuantizeAttrs {
            output_dtype: Some(DType::I8),
            ..q.clone()
        };
        let y = quantize(&q8, &x, &s, None).unwrap();
        assert_eq!(y.data, Data::I8(vec![0, 2, 2, 0, 127, -128]));
        // A zero point that disagrees with output_dtype.
        assert!(quantize(&q8, &x, &s, Some(&z)).is_err());
    }

    #[test]
    fn per_axis_and_blocked_parameters_are_checked_and_applied() {
        let x = Tensor::new(vec![2, 4], Data::U8(vec![10, 20, 30, 40, 50, 60, 70, 80])).unwrap();
        let d = |axis, block_size| DequantizeAttrs {
            layout: layout(axis, block_size),
            output_dtype: None,
        };
        // One scale per column.
        let s = Tensor::f32(vec![4], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let y = dequantize(&Cx::new(1), &d(1, 0), &x, &s, None).unwrap();
        assert_eq!(
            y.as_f32().unwrap(),
            &[10., 40., 90., 160., 50., 120., 210., 320.]
        );
        // The wrong count, or a zero point of another shape or type.
        assert!(dequantize(&Cx::new(1), &d(0, 0), &x, &s, None).is_err());
        assert!(
            dequantize(
                &Cx::new(1),
                &d(1, 0),
                &x,
                &s,
                Some(&u8s(vec![2], vec![0, 0]))
            )
            .is_err()
        );
        let i8z = Tensor::new(vec![4], Data::I8(vec![0; 4])).unwrap();
        assert!(dequantize(&Cx::new(1), &d(1, 0), &x, &s, Some(&i8z)).is_err());
        // Blocks of 3 along the columns: two per row, the last one short.
        let s = Tensor::f32(vec![2, 2], vec![1.0, 10.0, 2.0, 20.0]).unwrap();
        let z = u8s(vec![2, 2], vec![0, 40, 50, 0]);
        let y = dequantize(&Cx::new(1), &d(1, 3), &x, &s, Some(&z)).unwrap();
        assert_eq!(
            y.as_f32().unwrap(),
            &[10., 20., 30., 0., 0., 20., 40., 1600.]
        );
        assert!(dequantize(&Cx::new(1), &d(1, 1), &x, &s, None).is_err());
        assert!(dequantize(&Cx::new(1), &d(3, 0), &x, &s, None).is_err());
    }

    #[test]
    fn integer_products_subtract_zero_points_exactly() {
        let cx = Cx::new(1);
        let a = u8s(vec![2, 2], vec![1, 2, 3, 4]);
        let b = u8s(vec![2, 2], vec![255, 0, 0, 255]);
        let (acc, s) = integer_matmul(
            &cx,
            &a,
            Some(&u8s(vec![], vec![1])),
            &b,
            Some(&u8s(vec![2], vec![0, 255])),
        )
        .unwrap();
        assert_eq!((acc, s.out), (vec![0, 0, 510, -510], vec![2, 2]));
        // Per-row zero points of A are not supported.
        let per_row = u8s(vec![2], vec![0, 0]);
        assert!(integer_matmul(&cx, &a, Some(&per_row), &b, None).is_err());
        // Requantized: 0.5 rounds to 0, 1.5 to 2, and saturates.
        let mult = [0.5f32 / 255.0 * 255.0];
        let d = requantize(&[1, 3, 1000, -1000], &mult, |_| 0, 0.0, DType::I8).unwrap();
        assert_eq!(d, Data::I8(vec![0, 2, 127, -128]));
        // A product on a tie in f32 (25.4999996 in f64) rounds as onnxruntime rounds it: to
        // even, 26, plus the zero point.
        let mult = [f32::from_bits(982_534_316)];
        let d = requantize(&[23_165, -23_165], &mult, |_| 0, 120.0, DType::U8).unwrap();
        assert_eq!(d, Data::U8(vec![146, 94]));
    }

    #[test]
    fn dynamic_quantization_spans_zero() {
        let x = Tensor::f32(vec![3], vec![1.0, 2.0, 2.55]).unwrap();
        let out = dynamic_quantize(&Cx::new(1), &x).unwrap();
        assert_eq!(out[0].data, Data::U8(vec![100, 200, 255]));
        assert_eq!(out[1].as_f32().unwrap(), &[0.01]);
        assert_eq!(out[2].data, Data::U8(vec![0]));
    }

    #[test]
    fn dynamic_quantization_split_across_threads_matches_one_thread() {
        // Enough to split, with the extremes in the last piece and a NaN in the first.
        let mut v: Vec<f32> = (0..100_003)
            .map(|i| (i as f32 * 0.013).sin() * 3.0)
            .collect();
        v[5] = f32::NAN;
        v[99_000] = 11.0;
        v[100_002] = -4.5;
        let x = Tensor::f32(vec![100_003], v).unwrap();
        let one = dynamic_quantize(&Cx::new(1), &x).unwrap();
        let three = dynamic_quantize(&Cx::new(3), &x).unwrap();
        assert_eq!(one[1].as_f32().unwrap(), &[(11.0f32 + 4.5) / 255.0]);
        for (a, b) in one.iter().zip(&three) {
            assert_eq!(a.data, b.data);
        }
    }

    #[test]
    fn dynamic_quantization_range_ignores_nan_in_lanes_and_tail() {
        // 37 values: two whole chunks of 16 and a tail of 5; the extremes in a lane of the
        // second chunk and in the tail, a NaN in the first chunk.
        for (at_max, at_min) in [(17, 35), (35, 3), (0, 31)] {
            let mut v: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
            v[at_max] = 7.5;
            v[at_min] = -2.25;
            v[9] = f32::NAN;
            let x = Tensor::f32(vec![37], v).unwrap();
            let out = dynamic_quantize(&Cx::new(1), &x).unwrap();
            let scale = (7.5f32 - -2.25) / 255.0;
            assert_eq!(out[1].as_f32().unwrap(), &[scale], "{at_max} {at_min}");
            let zp = (2.25 / scale).round_ties_even() as u8;
            assert_eq!(out[2].data, Data::U8(vec![zp]));
            let Data::U8(y) = &out[0].data else {
                panic!("uint8 output")
            };
            assert_eq!(
                (y[at_max], y[at_min], y[9]),
                (255, 0, 0),
                "NaN quantizes to 0"
            );
        }
    }
}
