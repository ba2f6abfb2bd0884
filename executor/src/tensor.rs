//! Host tensors: a shape and a typed, dense, row-major buffer.

use crate::error::{OpError, OpResult};
pub use half::{bf16, f16};

pub mod lowbit;
pub use lowbit::{CastMode, E8M0Round, Low};

/// Largest element count any single tensor may have (4 GiB of f32): a guard against files and
/// shape inputs that declare absurd sizes, far above any real activation or weight.
pub const MAX_ELEMENTS: usize = 1 << 30;

/// Element types the executor computes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    /// IEEE half precision; ops compute in f32 and round their outputs (see `ops::eval`).
    F16,
    /// bfloat16, computed like F16.
    BF16,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    Bool,
    /// float8, float4, int4 and int2 types: stored and converted, not computed with.
    Low(Low),
}

impl DType {
    pub fn from_onnx(code: i32) -> Option<DType> {
        use crate::proto::data_type as t;
        Some(match code {
            t::FLOAT => DType::F32,
            t::DOUBLE => DType::F64,
            t::FLOAT16 => DType::F16,
            t::BFLOAT16 => DType::BF16,
            t::INT64 => DType::I64,
            t::INT32 => DType::I32,
            t::INT16 => DType::I16,
            t::INT8 => DType::I8,
            t::UINT64 => DType::U64,
            t::UINT32 => DType::U32,
            t::UINT16 => DType::U16,
            t::UINT8 => DType::U8,
            t::BOOL => DType::Bool,
            _ => return Low::from_onnx(code).map(DType::Low),
        })
    }
    pub fn onnx(self) -> i32 {
        use crate::proto::data_type as t;
        match self {
            DType::F32 => t::FLOAT,
            DType::F64 => t::DOUBLE,
            DType::F16 => t::FLOAT16,
            DType::BF16 => t::BFLOAT16,
            DType::I64 => t::INT64,
            DType::I32 => t::INT32,
            DType::I16 => t::INT16,
            DType::I8 => t::INT8,
            DType::U64 => t::UINT64,
            DType::U32 => t::UINT32,
            DType::U16 => t::UINT16,
            DType::U8 => t::UINT8,
            DType::Bool => t::BOOL,
            DType::Low(l) => l.onnx(),
        }
    }
    /// float16 or bfloat16.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            // A low-bit type holds one code per byte (TensorProto packs 4- and 2-bit ones).
            DType::I8 | DType::U8 | DType::Bool | DType::Low(_) => 1,
        }
    }
}

/// A typed buffer.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I16(Vec<i16>),
    I8(Vec<i8>),
    U64(Vec<u64>),
    U32(Vec<u32>),
    U16(Vec<u16>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
    /// One code per element (see [`lowbit`]).
    Low(Low, Vec<u8>),
}

/// The element type of a [`Data::Low`] bound by value or by reference (for the macros).
#[doc(hidden)]
pub trait LowTag {
    fn tag(self) -> Low;
}
impl LowTag for Low {
    fn tag(self) -> Low {
        self
    }
}
impl LowTag for &Low {
    fn tag(self) -> Low {
        *self
    }
}
impl LowTag for &mut Low {
    fn tag(self) -> Low {
        *self
    }
}

/// Runs `$body` with `$v` bound to the inner Vec of any variant.
#[macro_export]
macro_rules! with_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::tensor::Data::F32($v) => $body,
            $crate::tensor::Data::F64($v) => $body,
            $crate::tensor::Data::F16($v) => $body,
            $crate::tensor::Data::BF16($v) => $body,
            $crate::tensor::Data::I64($v) => $body,
            $crate::tensor::Data::I32($v) => $body,
            $crate::tensor::Data::I16($v) => $body,
            $crate::tensor::Data::U64($v) => $body,
            $crate::tensor::Data::U32($v) => $body,
            $crate::tensor::Data::U16($v) => $body,
            $crate::tensor::Data::I8($v) => $body,
            $crate::tensor::Data::U8($v) => $body,
            $crate::tensor::Data::Bool($v) => $body,
            $crate::tensor::Data::Low(_, $v) => $body,
        }
    };
}

/// Like `with_data!`, but rebuilds the same variant from what `$body` returns.
#[macro_export]
macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::tensor::Data::F32($v) => $crate::tensor::Data::F32($body),
            $crate::tensor::Data::F64($v) => $crate::tensor::Data::F64($body),
            $crate::tensor::Data::F16($v) => $crate::tensor::Data::F16($body),
            $crate::tensor::Data::BF16($v) => $crate::tensor::Data::BF16($body),
            $crate::tensor::Data::I64($v) => $crate::tensor::Data::I64($body),
            $crate::tensor::Data::I32($v) => $crate::tensor::Data::I32($body),
            $crate::tensor::Data::I16($v) => $crate::tensor::Data::I16($body),
            $crate::tensor::Data::U64($v) => $crate::tensor::Data::U64($body),
            $crate::tensor::Data::U32($v) => $crate::tensor::Data::U32($body),
            $crate::tensor::Data::U16($v) => $crate::tensor::Data::U16($body),
            $crate::tensor::Data::I8($v) => $crate::tensor::Data::I8($body),
            $crate::tensor::Data::U8($v) => $crate::tensor::Data::U8($body),
            $crate::tensor::Data::Bool($v) => $crate::tensor::Data::Bool($body),
            $crate::tensor::Data::Low(__low, $v) => {
                $crate::tensor::Data::Low($crate::tensor::LowTag::tag(__low), $body)
            }
        }
    };
}

/// Like `map_data!` over the integer variants; any other buffer goes to `$rest => $other`,
/// which must diverge or give a `Data` itself.
#[macro_export]
macro_rules! map_int {
    ($data:expr, $v:ident => $body:expr, $rest:ident => $other:expr) => {
        match $data {
            $crate::tensor::Data::I64($v) => $crate::tensor::Data::I64($body),
            $crate::tensor::Data::I32($v) => $crate::tensor::Data::I32($body),
            $crate::tensor::Data::I16($v) => $crate::tensor::Data::I16($body),
            $crate::tensor::Data::I8($v) => $crate::tensor::Data::I8($body),
            $crate::tensor::Data::U64($v) => $crate::tensor::Data::U64($body),
            $crate::tensor::Data::U32($v) => $crate::tensor::Data::U32($body),
            $crate::tensor::Data::U16($v) => $crate::tensor::Data::U16($body),
            $crate::tensor::Data::U8($v) => $crate::tensor::Data::U8($body),
            $rest => $other,
        }
    };
}

/// Like `map_int!` over the numeric variants: f32, f64 and every integer type (not bool,
/// float16 or bfloat16).
#[macro_export]
macro_rules! map_numeric {
    ($data:expr, $v:ident => $body:expr, $rest:ident => $other:expr) => {
        match $data {
            $crate::tensor::Data::F32($v) => $crate::tensor::Data::F32($body),
            $crate::tensor::Data::F64($v) => $crate::tensor::Data::F64($body),
            d => $crate::map_int!(d, $v => $body, $rest => $other),
        }
    };
}

impl Data {
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::F16(_) => DType::F16,
            Data::BF16(_) => DType::BF16,
            Data::I64(_) => DType::I64,
            Data::I32(_) => DType::I32,
            Data::I16(_) => DType::I16,
            Data::U64(_) => DType::U64,
            Data::U32(_) => DType::U32,
            Data::U16(_) => DType::U16,
            Data::I8(_) => DType::I8,
            Data::U8(_) => DType::U8,
            Data::Bool(_) => DType::Bool,
            Data::Low(l, _) => DType::Low(*l),
        }
    }
    pub fn len(&self) -> usize {
        with_data!(self, v => v.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn zeros(dtype: DType, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![0.0; n]),
            DType::F64 => Data::F64(vec![0.0; n]),
            DType::F16 => Data::F16(vec![f16::ZERO; n]),
            DType::BF16 => Data::BF16(vec![bf16::ZERO; n]),
            DType::I64 => Data::I64(vec![0; n]),
            DType::I32 => Data::I32(vec![0; n]),
            DType::I16 => Data::I16(vec![0; n]),
            DType::U64 => Data::U64(vec![0; n]),
            DType::U32 => Data::U32(vec![0; n]),
            DType::U16 => Data::U16(vec![0; n]),
            DType::I8 => Data::I8(vec![0; n]),
            DType::U8 => Data::U8(vec![0; n]),
            DType::Bool => Data::Bool(vec![false; n]),
            DType::Low(l) => Data::Low(l, vec![0; n]),
        }
    }
    /// An empty buffer of `dtype` with room for `cap` elements.
    pub fn with_capacity(dtype: DType, cap: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(Vec::with_capacity(cap)),
            DType::F64 => Data::F64(Vec::with_capacity(cap)),
            DType::F16 => Data::F16(Vec::with_capacity(cap)),
            DType::BF16 => Data::BF16(Vec::with_capacity(cap)),
            DType::I64 => Data::I64(Vec::with_capacity(cap)),
            DType::I32 => Data::I32(Vec::with_capacity(cap)),
            DType::I16 => Data::I16(Vec::with_capacity(cap)),
            DType::U64 => Data::U64(Vec::with_capacity(cap)),
            DType::U32 => Data::U32(Vec::with_capacity(cap)),
            DType::U16 => Data::U16(Vec::with_capacity(cap)),
            DType::I8 => Data::I8(Vec::with_capacity(cap)),
            DType::U8 => Data::U8(Vec::with_capacity(cap)),
            DType::Bool => Data::Bool(Vec::with_capacity(cap)),
            DType::Low(l) => Data::Low(l, Vec::with_capacity(cap)),
        }
    }
    /// Appends `other[range]`; false when the element types differ.
    pub fn extend_from(&mut self, other: &Data, range: std::ops::Range<usize>) -> bool {
        match (self, other) {
            (Data::F32(a), Data::F32(b)) => a.extend_from_slice(&b[range]),
            (Data::F64(a), Data::F64(b)) => a.extend_from_slice(&b[range]),
            (Data::F16(a), Data::F16(b)) => a.extend_from_slice(&b[range]),
            (Data::BF16(a), Data::BF16(b)) => a.extend_from_slice(&b[range]),
            (Data::I64(a), Data::I64(b)) => a.extend_from_slice(&b[range]),
            (Data::I32(a), Data::I32(b)) => a.extend_from_slice(&b[range]),
            (Data::I16(a), Data::I16(b)) => a.extend_from_slice(&b[range]),
            (Data::U64(a), Data::U64(b)) => a.extend_from_slice(&b[range]),
            (Data::U32(a), Data::U32(b)) => a.extend_from_slice(&b[range]),
            (Data::U16(a), Data::U16(b)) => a.extend_from_slice(&b[range]),
            (Data::I8(a), Data::I8(b)) => a.extend_from_slice(&b[range]),
            (Data::U8(a), Data::U8(b)) => a.extend_from_slice(&b[range]),
            (Data::Bool(a), Data::Bool(b)) => a.extend_from_slice(&b[range]),
            (Data::Low(ka, a), Data::Low(kb, b)) if ka == kb => a.extend_from_slice(&b[range]),
            _ => return false,
        }
        true
    }
    /// Runs of `len` elements from each of `starts`, one after another (Slice's contiguous
    /// runs).
    pub fn runs(&self, starts: &[usize], len: usize) -> Data {
        map_data!(self, v => {
            let mut out = Vec::with_capacity(starts.len() * len);
            for &s in starts {
                out.extend_from_slice(&v[s..s + len]);
            }
            out
        })
    }
    /// `len` elements from each of `starts`, `step` apart (which may be negative), one run
    /// after another.
    pub fn strided_runs(&self, starts: &[usize], len: usize, step: isize) -> Data {
        map_data!(self, v => {
            let mut out = Vec::with_capacity(starts.len() * len);
            for &s in starts {
                match step > 0 {
                    true => out.extend(v[s..].iter().step_by(step as usize).take(len)),
                    false => out.extend((0..len).map(|j| v[s - j * step.unsigned_abs()])),
                }
            }
            out
        })
    }
    /// Picks elements by index (used by gather-like ops: Transpose, Slice, Expand, ...).
    pub fn gather(&self, idx: &[usize]) -> Data {
        map_data!(self, v => idx.iter().map(|&i| v[i]).collect())
    }
}

/// A dense row-major tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Data,
}

/// Cuts named tensors into parts of `rows` rows along the first axis (a batch back into its
/// requests, or into the lanes that run it); a tensor without that batch dimension goes to
/// every part whole.
pub fn split_rows(named: Vec<(String, Tensor)>, rows: &[usize]) -> Vec<Vec<(String, Tensor)>> {
    let total: usize = rows.iter().sum();
    let mut parts: Vec<Vec<(String, Tensor)>> = rows.iter().map(|_| Vec::new()).collect();
    for (name, tensor) in named {
        let by_rows = rows.len() > 1 && tensor.shape.first() == Some(&total) && total > 0;
        if !by_rows {
            for part in parts.iter_mut() {
                part.push((name.clone(), tensor.clone()));
            }
            continue;
        }
        let mut start = 0;
        for (part, &r) in parts.iter_mut().zip(rows) {
            part.push((name.clone(), tensor.rows(start..start + r)));
            start += r;
        }
    }
    parts
}

/// Element count of `shape`; saturates instead of overflowing (callers check sizes with
/// [`checked_numel`]).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
}

/// Element count of `shape`, refusing overflow and anything above [`MAX_ELEMENTS`]. An empty
/// tensor's other dimensions are held to the same limit, so that strides and partial products
/// of any accepted shape fit in a `usize`.
pub fn checked_numel(shape: &[usize]) -> OpResult<usize> {
    let mut nonzero: usize = 1;
    for &d in shape.iter().filter(|&&d| d != 0) {
        nonzero = nonzero
            .checked_mul(d)
            .ok_or(OpError::TooLarge(usize::MAX))?;
    }
    if nonzero > MAX_ELEMENTS {
        return Err(OpError::TooLarge(nonzero));
    }
    Ok(if shape.contains(&0) { 0 } else { nonzero })
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Data) -> OpResult<Tensor> {
        if checked_numel(&shape)? != data.len() {
            return Err(OpError::Shape(format!(
                "shape {shape:?} does not hold {} elements",
                data.len()
            )));
        }
        Ok(Tensor { shape, data })
    }
    pub fn f32(shape: Vec<usize>, v: Vec<f32>) -> OpResult<Tensor> {
        Tensor::new(shape, Data::F32(v))
    }
    pub fn i64(shape: Vec<usize>, v: Vec<i64>) -> OpResult<Tensor> {
        Tensor::new(shape, Data::I64(v))
    }
    pub fn scalar_f32(v: f32) -> Tensor {
        Tensor {
            shape: vec![],
            data: Data::F32(vec![v]),
        }
    }
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> OpResult<Tensor> {
        let n = checked_numel(&shape)?;
        Ok(Tensor {
            shape,
            data: Data::zeros(dtype, n),
        })
    }
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    /// Rows `range` of the first axis (a tensor of rank at least 1, `range` within it).
    pub fn rows(&self, range: std::ops::Range<usize>) -> Tensor {
        let row = self.shape[1..].iter().product::<usize>();
        let mut shape = self.shape.clone();
        shape[0] = range.len();
        let mut data = Data::with_capacity(self.dtype(), range.len() * row);
        data.extend_from(&self.data, range.start * row..range.end * row);
        Tensor { shape, data }
    }
    /// `parts` joined along the first axis; they must agree in dtype and in every other axis.
    pub fn cat_rows(parts: &[&Tensor]) -> OpResult<Tensor> {
        let first = parts
            .first()
            .filter(|t| t.rank() > 0)
            .ok_or_else(|| OpError::Shape("nothing to join along a first axis".into()))?;
        let mut shape = first.shape.clone();
        let mut data = Data::with_capacity(first.dtype(), parts.iter().map(|t| t.len()).sum());
        shape[0] = 0;
        for t in parts {
            if t.rank() != first.rank() || t.shape[1..] != first.shape[1..] {
                return Err(OpError::Shape(format!(
                    "cannot join {:?} to {:?} along the first axis",
                    t.shape, first.shape
                )));
            }
            if !data.extend_from(&t.data, 0..t.len()) {
                return Err(OpError::DType(format!(
                    "cannot join {:?} to {:?}",
                    t.dtype(),
                    first.dtype()
                )));
            }
            shape[0] += t.shape[0];
        }
        Tensor::new(shape, data)
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype().size()
    }
    pub fn as_f32(&self) -> OpResult<&[f32]> {
        match &self.data {
            Data::F32(v) => Ok(v),
            d => Err(OpError::DType(format!(
                "expected float32, got {:?}",
                d.dtype()
            ))),
        }
    }
    pub fn as_f32_mut(&mut self) -> OpResult<&mut Vec<f32>> {
        match &mut self.data {
            Data::F32(v) => Ok(v),
            d => Err(OpError::DType(format!(
                "expected float32, got {:?}",
                d.dtype()
            ))),
        }
    }
    pub fn into_f32(self) -> OpResult<Vec<f32>> {
        match self.data {
            Data::F32(v) => Ok(v),
            d => Err(OpError::DType(format!(
                "expected float32, got {:?}",
                d.dtype()
            ))),
        }
    }
    /// Integer contents (any integer type; a uint64 past int64 is an error), as used by
    /// shape-like inputs.
    pub fn to_i64_vec(&self) -> OpResult<Vec<i64>> {
        Ok(match &self.data {
            Data::I64(v) => v.clone(),
            Data::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U64(v) => v
                .iter()
                .map(|&x| i64::try_from(x))
                .collect::<Result<_, _>>()
                .map_err(|_| OpError::Shape("a uint64 value past int64".into()))?,
            Data::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Data::Low(l, v) if l.is_int() => v.iter().map(|&c| l.int(c)).collect(),
            d => {
                return Err(OpError::DType(format!(
                    "expected an integer tensor, got {:?}",
                    d.dtype()
                )));
            }
        })
    }
    /// Contents as f64, for scalar parameters (Clip bounds, Range, Pad value, ...).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.clone(),
            Data::F16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            Data::BF16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I16(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U16(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
            Data::Low(l, v) => v.iter().map(|&c| l.to_f32(c) as f64).collect(),
        }
    }
    pub fn reshaped(mut self, shape: Vec<usize>) -> OpResult<Tensor> {
        if checked_numel(&shape)? != self.len() {
            return Err(OpError::Shape(format!(
                "cannot reshape {:?} to {shape:?}",
                self.shape
            )));
        }
        self.shape = shape;
        Ok(self)
    }
}

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Normalises a possibly negative axis against `rank`, which must have that axis (unlike
/// [`norm_axis`], a scalar has none): for ops that index the shape with it.
pub fn axis_in(axis: i64, rank: usize) -> OpResult<usize> {
    match norm_axis(axis, rank)? {
        a if a < rank => Ok(a),
        _ => Err(OpError::Shape(format!("axis {axis} of a scalar"))),
    }
}

/// Normalises a possibly negative axis against `rank`.
pub fn norm_axis(axis: i64, rank: usize) -> OpResult<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(1) && !(r == 0 && a == 0) {
        return Err(OpError::Shape(format!(
            "axis {axis} out of range for rank {rank}"
        )));
    }
    Ok(a as usize)
}
