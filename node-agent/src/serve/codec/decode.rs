//! Decoding an inference request. The JSON header is parsed with every list bounded and each
//! tensor's `data` kept as a borrowed slice of the body; the request is then checked against the
//! model's signature (names, datatypes, shapes, binary sizes) and its decoded size reserved, and
//! only then is each tensor decoded straight into a typed buffer: no `serde_json::Value` tree.

use super::{MAX_ELEMENTS, WireType, dtype_size, wire_name};
use crate::registry::TensorMeta;
use crate::serve::error::ApiError;
use axum::http::StatusCode;
use cotenant_executor::graph::{Dim, GraphInput};
use cotenant_executor::tensor::{bf16, f16};
use cotenant_executor::{Data, Tensor};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;

/// Most dimensions a tensor's shape may have.
pub const MAX_RANK: usize = 32;
/// Most tensors a request may name as inputs or as outputs.
pub const MAX_TENSORS: usize = 256;

/// What the model takes and gives, to check a request against before decoding it.
pub struct Signature<'m> {
    pub inputs: &'m [GraphInput],
    pub outputs: &'m [TensorMeta],
}

/// A decoded inference request.
#[derive(Debug)]
pub struct InferRequest {
    pub id: Option<String>,
    pub inputs: Vec<(String, Tensor)>,
    /// Outputs asked for (all when empty), and whether each wants binary data.
    pub outputs: Vec<(String, bool)>,
    /// `binary_data_output` on the request: every output in binary.
    pub all_binary: bool,
}

/// The value of `Inference-Header-Content-Length`, if given: a non-negative integer no larger
/// than the body (when its length is known).
pub fn header_length(value: Option<&[u8]>, body: Option<u64>) -> Result<Option<usize>, ApiError> {
    let Some(raw) = value else {
        return Ok(None);
    };
    let text = std::str::from_utf8(raw).unwrap_or("").trim();
    let len: usize = text.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "Inference-Header-Content-Length {:?} is not a non-negative integer",
            String::from_utf8_lossy(raw)
        ))
    })?;
    if let Some(body) = body
        && len as u64 > body
    {
        return Err(ApiError::bad_request(format!(
            "Inference-Header-Content-Length {len} exceeds the body of {body} bytes"
        )));
    }
    Ok(Some(len))
}

/// A JSON list of at most `N` items; more is an error before they are stored.
struct Bounded<T, const N: usize>(Vec<T>);

impl<T, const N: usize> Default for Bounded<T, N> {
    fn default() -> Self {
        Bounded(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Bounded<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Items<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for Items<T, N> {
            type Value = Bounded<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a list of at most {N} items")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    if items.len() == N {
                        return Err(de::Error::custom(format!(
                            "a list here may have at most {N} items"
                        )));
                    }
                    items.push(item);
                }
                Ok(Bounded(items))
            }
        }
        d.deserialize_seq(Items::<T, N>(PhantomData))
    }
}

/// The parameters this server reads; any others are skipped without being stored.
#[derive(Deserialize, Default)]
struct Parameters {
    #[serde(default)]
    binary_data_size: Option<u64>,
    #[serde(default)]
    binary_data: Option<bool>,
    #[serde(default)]
    binary_data_output: Option<bool>,
}

#[derive(Deserialize)]
struct RequestJson<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Parameters,
    #[serde(borrow)]
    inputs: Bounded<InputJson<'a>, MAX_TENSORS>,
    #[serde(default)]
    outputs: Bounded<OutputJson, MAX_TENSORS>,
}

#[derive(Deserialize)]
struct InputJson<'a> {
    name: String,
    shape: Bounded<i64, MAX_RANK>,
    datatype: String,
    #[serde(default)]
    parameters: Parameters,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Parameters,
}

/// Where one input's data is.
enum Source<'a> {
    Json(&'a RawValue),
    Binary(&'a [u8]),
}

/// One input, checked and ready to decode.
struct Checked<'a> {
    name: String,
    wire: WireType,
    shape: Vec<usize>,
    elements: usize,
    source: Source<'a>,
}

/// Decodes `body` (its JSON header is the first `header_len` bytes when given, binary tensors
/// follow) for a model of signature `sig`. Before decoding any tensor it calls `reserve` with
/// the bytes the decoded tensors will take, and gives up if that refuses.
pub fn decode_request(
    body: &[u8],
    header_len: Option<usize>,
    sig: &Signature,
    reserve: impl FnOnce(u64) -> Result<(), ApiError>,
) -> Result<InferRequest, ApiError> {
    let (header, binary) = match header_len {
        Some(len) if len > body.len() => {
            return Err(ApiError::bad_request(format!(
                "Inference-Header-Content-Length {len} exceeds the body of {} bytes",
                body.len()
            )));
        }
        Some(len) => body.split_at(len),
        None => (body, &[][..]),
    };
    let json: RequestJson = serde_json::from_slice(header)
        .map_err(|e| ApiError::bad_request(format!("malformed request JSON: {e}")))?;

    let mut offset = 0usize;
    let mut checked = Vec::with_capacity(json.inputs.0.len());
    let mut seen = BTreeSet::new();
    for input in json.inputs.0 {
        let name = input.name.clone();
        if !seen.insert(name.clone()) {
            return Err(ApiError::bad_request(format!(
                "input {name:?} is given twice"
            )));
        }
        let input = check_input(input, sig, binary, &mut offset).map_err(|e| ApiError {
            message: format!("input {name:?}: {}", e.message),
            ..e
        })?;
        checked.push(input);
    }
    if offset != binary.len() {
        return Err(ApiError::bad_request(format!(
            "{} bytes of binary data follow the JSON but the inputs declare {offset}",
            binary.len()
        )));
    }
    if let Some(missing) = sig.inputs.iter().find(|i| !seen.contains(&i.name)) {
        return Err(ApiError::bad_request(format!(
            "input {:?} was not given",
            missing.name
        )));
    }
    let mut outputs = Vec::with_capacity(json.outputs.0.len());
    for o in json.outputs.0 {
        if !sig.outputs.iter().any(|m| m.name == o.name) {
            return Err(ApiError::bad_request(format!(
                "unknown output {:?}; the model's outputs are {:?}",
                o.name,
                sig.outputs.iter().map(|m| &m.name).collect::<Vec<_>>()
            )));
        }
        if outputs.iter().any(|(n, _)| *n == o.name) {
            return Err(ApiError::bad_request(format!(
                "output {:?} is asked for twice",
                o.name
            )));
        }
        let binary = o.parameters.binary_data.unwrap_or(false);
        outputs.push((o.name, binary));
    }

    // Everything is known to fit the model: reserve what decoding allocates, then decode.
    let decoded_bytes: u64 = checked
        .iter()
        .map(|c| (c.elements * dtype_size(c.wire.dtype())) as u64)
        .sum();
    reserve(decoded_bytes)?;
    let mut inputs = Vec::with_capacity(checked.len());
    for c in checked {
        let data = match c.source {
            Source::Binary(bytes) => from_bytes(c.wire, bytes),
            Source::Json(raw) => from_json(c.wire, raw, &c.shape, c.elements)
                .map_err(|e| ApiError::bad_request(format!("input {:?}: data: {e}", c.name)))?,
        };
        let tensor = Tensor::new(c.shape, data)
            .map_err(|e| ApiError::bad_request(format!("input {:?}: {e}", c.name)))?;
        inputs.push((c.name, tensor));
    }
    Ok(InferRequest {
        id: json.id,
        inputs,
        outputs,
        all_binary: json.parameters.binary_data_output.unwrap_or(false),
    })
}

/// Checks one input against the model and the body, allocating nothing for its data.
fn check_input<'a>(
    input: InputJson<'a>,
    sig: &Signature,
    binary: &'a [u8],
    offset: &mut usize,
) -> Result<Checked<'a>, ApiError> {
    let TensorCheck {
        wire,
        shape,
        elements,
    } = check_tensor(&input.name, &input.datatype, &input.shape.0, sig)?;
    let dims = &input.shape.0;
    let source = match (input.parameters.binary_data_size, input.data) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("has both data and binary_data_size"));
        }
        (None, None) => {
            return Err(ApiError::bad_request(
                "has neither data nor binary_data_size",
            ));
        }
        (Some(size), None) => {
            let want = elements * wire.size();
            if size != want as u64 {
                return Err(ApiError::bad_request(format!(
                    "binary_data_size {size} does not match shape {dims:?} of {} ({want} bytes)",
                    input.datatype
                )));
            }
            let end = offset
                .checked_add(want)
                .filter(|e| *e <= binary.len())
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "binary data truncated: needs {want} bytes at offset {offset}, {} follow the JSON",
                        binary.len()
                    ))
                })?;
            let bytes = &binary[*offset..end];
            *offset = end;
            Source::Binary(bytes)
        }
        (None, Some(raw)) => {
            // Each element takes at least one character and a separator: a shape asking for
            // more than the data can hold is refused before anything is allocated for it.
            let room = raw.get().len().div_ceil(2);
            if elements > room {
                return Err(ApiError::bad_request(format!(
                    "data of {} bytes cannot hold the {elements} elements of shape {dims:?}",
                    raw.get().len()
                )));
            }
            Source::Json(raw)
        }
    };
    Ok(Checked {
        name: input.name,
        wire,
        shape,
        elements,
        source,
    })
}

/// An input's datatype and shape, checked against the model.
pub struct TensorCheck {
    pub wire: WireType,
    pub shape: Vec<usize>,
    pub elements: usize,
}

/// Checks an input's name, datatype and shape against the model's signature, refusing shapes
/// whose element count overflows or passes [`MAX_ELEMENTS`]; allocates nothing for its data.
pub fn check_tensor(
    name: &str,
    datatype: &str,
    dims: &[i64],
    sig: &Signature,
) -> Result<TensorCheck, ApiError> {
    let Some(decl) = sig.inputs.iter().find(|i| i.name == name) else {
        return Err(ApiError::bad_request(format!(
            "unknown input; the model's inputs are {:?}",
            sig.inputs.iter().map(|i| &i.name).collect::<Vec<_>>()
        )));
    };
    let wire = WireType::parse(datatype)?;
    if wire.dtype() != decl.dtype {
        return Err(ApiError::bad_request(format!(
            "datatype {datatype} given, the model expects {}",
            wire_name(decl.dtype).unwrap_or("a type the protocol lacks")
        )));
    }
    if dims.len() > MAX_RANK {
        return Err(ApiError::bad_request(format!(
            "shape has {} dimensions, more than {MAX_RANK}",
            dims.len()
        )));
    }
    let mut shape = Vec::with_capacity(dims.len());
    let mut elements: usize = 1;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| {
            ApiError::bad_request(format!("negative dimension {d} in shape {dims:?}"))
        })?;
        elements = elements.checked_mul(d).ok_or_else(|| {
            ApiError::bad_request(format!(
                "shape {dims:?} has more elements than this machine can count"
            ))
        })?;
        shape.push(d);
    }
    if elements > MAX_ELEMENTS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("shape {dims:?} exceeds {MAX_ELEMENTS} elements"),
        ));
    }
    if let Some(model_dims) = &decl.dims {
        let fits = model_dims.len() == shape.len()
            && model_dims
                .iter()
                .zip(&shape)
                .all(|(m, &n)| !matches!(m, Dim::Fixed(f) if *f != n));
        if !fits {
            return Err(ApiError::bad_request(format!(
                "shape {dims:?} does not fit the model's {}",
                show(model_dims)
            )));
        }
    }
    Ok(TensorCheck {
        wire,
        shape,
        elements,
    })
}

fn show(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => n.to_string(),
            Dim::Symbol(s) => s.clone(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// Little-endian elements of `wire` from exactly as many bytes as they need.
pub fn from_bytes(wire: WireType, b: &[u8]) -> Data {
    fn le<const N: usize, T>(b: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
        b.chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect()
    }
    /// Little-endian elements as one copy where the host is little-endian: an image is 600 KB,
    /// and converting it element by element cost more than shedding the request it belongs to.
    fn pod<const N: usize, T: bytemuck::Pod>(b: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
        if cfg!(target_endian = "little") {
            let n = b.len() / N;
            let mut v = vec![T::zeroed(); n];
            bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(&b[..n * N]);
            v
        } else {
            le(b, f)
        }
    }
    match wire {
        WireType::Bool => Data::Bool(b.iter().map(|&x| x != 0).collect()),
        WireType::U8 => Data::U8(b.to_vec()),
        WireType::U16 => Data::U16(pod(b, u16::from_le_bytes)),
        WireType::U32 => Data::U32(pod(b, u32::from_le_bytes)),
        WireType::U64 => Data::U64(pod(b, u64::from_le_bytes)),
        WireType::I8 => Data::I8(b.iter().map(|&x| x as i8).collect()),
        WireType::I16 => Data::I16(pod(b, i16::from_le_bytes)),
        WireType::I32 => Data::I32(pod(b, i32::from_le_bytes)),
        WireType::I64 => Data::I64(pod(b, i64::from_le_bytes)),
        WireType::F16 => Data::F16(le(b, |a| f16::from_bits(u16::from_le_bytes(a)))),
        WireType::BF16 => Data::BF16(le(b, |a| bf16::from_bits(u16::from_le_bytes(a)))),
        WireType::F32 => Data::F32(pod(b, f32::from_le_bytes)),
        WireType::F64 => Data::F64(pod(b, f64::from_le_bytes)),
    }
}

/// One JSON scalar.
#[derive(Clone, Copy)]
enum Scalar {
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::UInt(u) => write!(f, "{u}"),
            Scalar::Float(x) => write!(f, "{x}"),
        }
    }
}

/// The typed buffer JSON elements are appended to, each checked against the datatype.
struct Sink(Data);

impl Sink {
    fn new(wire: WireType, capacity: usize) -> Sink {
        let data = match wire {
            WireType::Bool => Data::Bool(Vec::with_capacity(capacity)),
            WireType::U8 => Data::U8(Vec::with_capacity(capacity)),
            WireType::U16 => Data::U16(Vec::with_capacity(capacity)),
            WireType::U32 => Data::U32(Vec::with_capacity(capacity)),
            WireType::U64 => Data::U64(Vec::with_capacity(capacity)),
            WireType::I8 => Data::I8(Vec::with_capacity(capacity)),
            WireType::I16 => Data::I16(Vec::with_capacity(capacity)),
            WireType::I32 => Data::I32(Vec::with_capacity(capacity)),
            WireType::I64 => Data::I64(Vec::with_capacity(capacity)),
            WireType::F16 => Data::F16(Vec::with_capacity(capacity)),
            WireType::BF16 => Data::BF16(Vec::with_capacity(capacity)),
            WireType::F32 => Data::F32(Vec::with_capacity(capacity)),
            WireType::F64 => Data::F64(Vec::with_capacity(capacity)),
        };
        Sink(data)
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// Appends `x`, or says why it is not an element of this datatype.
    fn push(&mut self, x: Scalar) -> Result<(), String> {
        fn int<T: TryFrom<i64> + TryFrom<u64>>(x: Scalar) -> Option<T> {
            match x {
                Scalar::Int(i) => T::try_from(i).ok(),
                Scalar::UInt(u) => T::try_from(u).ok(),
                _ => None,
            }
        }
        let float = match x {
            Scalar::Int(i) => Some(i as f64),
            Scalar::UInt(u) => Some(u as f64),
            Scalar::Float(f) => Some(f),
            Scalar::Bool(_) => None,
        };
        let misfit = || format!("element {x} does not fit the datatype");
        match &mut self.0 {
            Data::Bool(v) => match x {
                Scalar::Bool(b) => v.push(b),
                _ => return Err(misfit()),
            },
            Data::U8(v) => v.push(int(x).ok_or_else(misfit)?),
            Data::U16(v) => v.push(int(x).ok_or_else(misfit)?),
            Data::U32(v) => v.push(int(x).ok_or_else(misfit)?),
            Data::U64(v) => v.push(int(x).ok_or_else(misfit)?),
            Data::I8(v) => v.push(int(x).ok_or_else(misfit)?),
            Data::I16(v) => v.push(int(x).ok_or_else(misfit)?),
            Data::I32(v) => v.push(int(x).ok_or_else(misfit)?),
            Data::I64(v) => v.push(int(x).ok_or_else(misfit)?),
            // A number beyond FP32's range would silently become infinity.
            Data::F32(v) => v.push(
                float
                    .map(|f| f as f32)
                    .filter(|f| f.is_finite())
                    .ok_or_else(misfit)?,
            ),
            Data::F16(v) => v.push(
                float
                    .map(f16::from_f64)
                    .filter(|h| h.is_finite())
                    .ok_or_else(misfit)?,
            ),
            Data::BF16(v) => v.push(
                float
                    .map(bf16::from_f64)
                    .filter(|h| h.is_finite())
                    .ok_or_else(misfit)?,
            ),
            Data::F64(v) => v.push(float.ok_or_else(misfit)?),
            Data::Low(..) => return Err(misfit()),
        }
        Ok(())
    }
}

/// How the data of a tensor of rank 2 or more is laid out, known from its first element.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    Unknown,
    /// One list of every element, row-major.
    Flat,
    /// Lists nested exactly as the shape says.
    Nested,
}

struct Walk<'s> {
    sink: Sink,
    shape: &'s [usize],
    elements: usize,
    layout: Layout,
}

/// The JSON value at `depth` lists below the data itself.
struct Node<'w, 's> {
    walk: &'w mut Walk<'s>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Node<'_, '_> {
    fn scalar<E: de::Error>(self, x: Scalar) -> Result<(), E> {
        let walk = self.walk;
        let rank = walk.shape.len();
        let placed = match (self.depth, walk.layout) {
            (0, _) => rank == 0,
            (1, Layout::Unknown) => {
                walk.layout = Layout::Flat;
                true
            }
            (1, Layout::Flat) => true,
            (depth, Layout::Nested) => depth == rank,
            _ => false,
        };
        if !placed {
            return Err(E::custom(format!(
                "a number where the shape {:?} needs a list (ragged or wrongly nested data)",
                walk.shape
            )));
        }
        if walk.sink.len() >= walk.elements {
            return Err(E::custom(format!(
                "more elements than the shape's {}",
                walk.elements
            )));
        }
        walk.sink.push(x).map_err(E::custom)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number, a boolean or a list of them")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.scalar(Scalar::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.scalar(Scalar::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.scalar(Scalar::UInt(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.scalar(Scalar::Float(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Node { walk, depth } = self;
        let rank = walk.shape.len();
        if depth > 0 {
            let allowed = match walk.layout {
                Layout::Unknown => depth == 1 && rank >= 2,
                Layout::Nested => depth < rank,
                Layout::Flat => false,
            };
            if !allowed {
                return Err(de::Error::custom(format!(
                    "a list where the shape {:?} needs a number (nested deeper than the shape, or ragged)",
                    walk.shape
                )));
            }
            walk.layout = Layout::Nested;
        }
        let mut count = 0usize;
        while seq
            .next_element_seed(Node {
                walk: &mut *walk,
                depth: depth + 1,
            })?
            .is_some()
        {
            count += 1;
        }
        let want = match walk.layout {
            Layout::Nested => walk.shape[depth],
            _ => walk.elements,
        };
        if count != want {
            let what = if walk.layout == Layout::Nested {
                format!("axis {depth} of shape {:?} needs {want}", walk.shape)
            } else {
                format!("the shape needs {want}")
            };
            return Err(de::Error::custom(format!(
                "a list of {count} elements where {what}"
            )));
        }
        Ok(())
    }
}

/// Decodes flat or exactly nested JSON `data` straight into a typed buffer.
fn from_json(
    wire: WireType,
    raw: &RawValue,
    shape: &[usize],
    elements: usize,
) -> Result<Data, String> {
    let mut walk = Walk {
        sink: Sink::new(wire, elements),
        shape,
        elements,
        layout: Layout::Unknown,
    };
    let mut de = serde_json::Deserializer::from_str(raw.get());
    Node {
        walk: &mut walk,
        depth: 0,
    }
    .deserialize(&mut de)
    .map_err(|e| e.to_string())?;
    if walk.sink.len() != elements {
        return Err(format!(
            "{} elements where the shape needs {elements}",
            walk.sink.len()
        ));
    }
    Ok(walk.sink.0)
}
