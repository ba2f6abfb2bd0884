//! Tensors in and out of the Open Inference Protocol (KServe v2) REST encoding: JSON tensors
//! (flat or nested row-major data) and the binary tensor extension (`binary_data_size`, with the
//! JSON header length in `Inference-Header-Content-Length`). Every size a client declares is
//! checked before anything is allocated from it.

use super::error::ApiError;
use cotenant_executor::{DType, Data, Tensor};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Elements one tensor may have (256 Mi): a bound on what a request can make us allocate.
pub const MAX_ELEMENTS: usize = 1 << 28;

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

#[derive(Deserialize)]
struct RequestJson {
    id: Option<String>,
    #[serde(default)]
    parameters: Map<String, Value>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Vec<OutputJson>,
}

#[derive(Deserialize)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    data: Option<Value>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Map<String, Value>,
}

/// The wire datatypes this agent reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireType {
    Bool,
    U8,
    I8,
    I32,
    I64,
    F16,
    F32,
    F64,
}

impl WireType {
    pub fn parse(s: &str) -> Result<WireType, ApiError> {
        Ok(match s {
            "BOOL" => WireType::Bool,
            "UINT8" => WireType::U8,
            "INT8" => WireType::I8,
            "INT32" => WireType::I32,
            "INT64" => WireType::I64,
            "FP16" => WireType::F16,
            "FP32" => WireType::F32,
            "FP64" => WireType::F64,
            "BYTES" | "BF16" | "UINT16" | "UINT32" | "UINT64" | "INT16" => {
                return Err(ApiError::bad_request(format!(
                    "datatype {s} is not supported by this server"
                )));
            }
            other => return Err(ApiError::bad_request(format!("unknown datatype {other:?}"))),
        })
    }

    fn size(self) -> usize {
        match self {
            WireType::Bool | WireType::U8 | WireType::I8 => 1,
            WireType::F16 => 2,
            WireType::I32 | WireType::F32 => 4,
            WireType::I64 | WireType::F64 => 8,
        }
    }
}

/// The wire name of an executor dtype.
pub fn wire_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "FP32",
        DType::F64 => "FP64",
        DType::I64 => "INT64",
        DType::I32 => "INT32",
        DType::I8 => "INT8",
        DType::U8 => "UINT8",
        DType::Bool => "BOOL",
    }
}

/// Splits a body into its JSON header and the binary tail.
pub fn split_body<'a>(
    body: &'a [u8],
    header_len: Option<&str>,
) -> Result<(&'a [u8], &'a [u8]), ApiError> {
    let Some(len) = header_len else {
        return Ok((body, &[]));
    };
    let len: usize = len.trim().parse().map_err(|_| {
        ApiError::bad_request(format!(
            "Inference-Header-Content-Length {len:?} is not a number"
        ))
    })?;
    if len > body.len() {
        return Err(ApiError::bad_request(format!(
            "Inference-Header-Content-Length {len} exceeds the body of {} bytes",
            body.len()
        )));
    }
    Ok(body.split_at(len))
}

/// Decodes a request; `expected` gives each model input's dtype (FP16 converts to FP32 inputs).
pub fn decode_request(
    header: &[u8],
    binary: &[u8],
    expected: impl Fn(&str) -> Option<DType>,
) -> Result<InferRequest, ApiError> {
    let json: RequestJson = serde_json::from_slice(header)
        .map_err(|e| ApiError::bad_request(format!("malformed request JSON: {e}")))?;
    let mut offset = 0usize;
    let mut inputs = Vec::with_capacity(json.inputs.len());
    for input in json.inputs {
        let name = input.name.clone();
        let tensor = decode_input(input, binary, &mut offset, &expected)
            .map_err(|e| ApiError::new(e.status, format!("input {name:?}: {}", e.message)))?;
        inputs.push((name, tensor));
    }
    if offset != binary.len() {
        return Err(ApiError::bad_request(format!(
            "{} bytes of binary data follow the JSON but the inputs declare {offset}",
            binary.len()
        )));
    }
    let all_binary = flag(&json.parameters, "binary_data_output");
    let outputs = json
        .outputs
        .into_iter()
        .map(|o| {
            let binary = flag(&o.parameters, "binary_data");
            (o.name, binary)
        })
        .collect();
    Ok(InferRequest {
        id: json.id,
        inputs,
        outputs,
        all_binary,
    })
}

fn flag(parameters: &Map<String, Value>, key: &str) -> bool {
    parameters
        .get(key)
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn decode_input(
    input: InputJson,
    binary: &[u8],
    offset: &mut usize,
    expected: &impl Fn(&str) -> Option<DType>,
) -> Result<Tensor, ApiError> {
    let wire = WireType::parse(&input.datatype)?;
    let mut shape = Vec::with_capacity(input.shape.len());
    let mut elements: usize = 1;
    for &d in &input.shape {
        let d = usize::try_from(d).map_err(|_| {
            ApiError::bad_request(format!("negative dimension {d} in shape {:?}", input.shape))
        })?;
        elements = elements
            .checked_mul(d)
            .filter(|n| *n <= MAX_ELEMENTS)
            .ok_or_else(|| {
                ApiError::new(
                    axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                    format!("shape {:?} exceeds {MAX_ELEMENTS} elements", input.shape),
                )
            })?;
        shape.push(d);
    }
    // FP16 is widened to FP32, the only float the executor computes in.
    if wire == WireType::F16
        && let Some(other) = expected(&input.name).filter(|d| *d != DType::F32)
    {
        return Err(ApiError::bad_request(format!(
            "datatype FP16 given, the model expects {}",
            wire_name(other)
        )));
    }
    let data =
        match input.parameters.get("binary_data_size") {
            Some(size) => {
                let size = size
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request("binary_data_size must be a non-negative integer")
                    })?;
                if input.data.is_some() {
                    return Err(ApiError::bad_request("has both data and binary_data_size"));
                }
                let want = elements * wire.size();
                if size != want {
                    return Err(ApiError::bad_request(format!(
                        "binary_data_size {size} does not match shape {:?} of {} ({want} bytes)",
                        input.shape, input.datatype
                    )));
                }
                let end = offset.checked_add(size).filter(|e| *e <= binary.len()).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "binary data truncated: needs {size} bytes at offset {offset}, body has {}",
                    binary.len()
                ))
            })?;
                let bytes = &binary[*offset..end];
                *offset = end;
                from_bytes(wire, bytes)
            }
            None => {
                let value = input.data.ok_or_else(|| {
                    ApiError::bad_request("has neither data nor binary_data_size")
                })?;
                from_json(wire, &value, elements)?
            }
        };
    Tensor::new(shape, data).map_err(|e| ApiError::bad_request(e.to_string()))
}

fn from_bytes(wire: WireType, b: &[u8]) -> Data {
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
        WireType::I8 => Data::I8(b.iter().map(|&x| x as i8).collect()),
        WireType::I32 => Data::I32(pod(b, i32::from_le_bytes)),
        WireType::I64 => Data::I64(pod(b, i64::from_le_bytes)),
        WireType::F16 => Data::F32(le(b, |a| f16_to_f32(u16::from_le_bytes(a)))),
        WireType::F32 => Data::F32(pod(b, f32::from_le_bytes)),
        WireType::F64 => Data::F64(pod(b, f64::from_le_bytes)),
    }
}

/// Flattens nested JSON arrays, checking every element's type, and the element count.
fn from_json(wire: WireType, value: &Value, elements: usize) -> Result<Data, ApiError> {
    let mut flat: Vec<&Value> = Vec::with_capacity(elements.min(1 << 20));
    flatten(value, &mut flat, elements, 0)?;
    if flat.len() != elements {
        return Err(ApiError::bad_request(format!(
            "data has {} elements, the shape needs {elements}",
            flat.len()
        )));
    }
    let bad = |v: &Value| ApiError::bad_request(format!("element {v} is not a valid {wire:?}"));
    fn ints<T: TryFrom<i64>>(
        flat: &[&Value],
        bad: &dyn Fn(&Value) -> ApiError,
    ) -> Result<Vec<T>, ApiError> {
        flat.iter()
            .map(|v| {
                v.as_i64()
                    .and_then(|i| T::try_from(i).ok())
                    .ok_or_else(|| bad(v))
            })
            .collect()
    }
    Ok(match wire {
        WireType::Bool => Data::Bool(
            flat.iter()
                .map(|v| v.as_bool().ok_or_else(|| bad(v)))
                .collect::<Result<_, _>>()?,
        ),
        WireType::U8 => Data::U8(ints(&flat, &bad)?),
        WireType::I8 => Data::I8(ints(&flat, &bad)?),
        WireType::I32 => Data::I32(ints(&flat, &bad)?),
        WireType::I64 => Data::I64(ints(&flat, &bad)?),
        WireType::F16 | WireType::F32 => Data::F32(
            flat.iter()
                .map(|v| v.as_f64().map(|f| f as f32).ok_or_else(|| bad(v)))
                .collect::<Result<_, _>>()?,
        ),
        WireType::F64 => Data::F64(
            flat.iter()
                .map(|v| v.as_f64().ok_or_else(|| bad(v)))
                .collect::<Result<_, _>>()?,
        ),
    })
}

fn flatten<'a>(
    value: &'a Value,
    out: &mut Vec<&'a Value>,
    limit: usize,
    depth: usize,
) -> Result<(), ApiError> {
    // Deep nesting is rejected rather than recursed into without bound.
    if depth > 32 {
        return Err(ApiError::bad_request(
            "data is nested more than 32 levels deep",
        ));
    }
    match value {
        Value::Array(items) => {
            for item in items {
                flatten(item, out, limit, depth + 1)?;
                if out.len() > limit {
                    return Err(ApiError::bad_request(format!(
                        "data has more elements than the shape's {limit}"
                    )));
                }
            }
            Ok(())
        }
        scalar => {
            out.push(scalar);
            Ok(())
        }
    }
}

/// IEEE 754 half to single precision.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: normalise.
            let shift = f.leading_zeros() - 21;
            sign | ((127 - 15 - shift + 1) << 23) | ((f << shift) & 0x3ff) << 13
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 127 - 15) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

/// One output in the response: JSON data, or its raw little-endian bytes for the binary tail.
pub fn encode_output(name: &str, tensor: &Tensor, binary: bool) -> (Value, Option<Vec<u8>>) {
    let mut out = serde_json::json!({
        "name": name,
        "datatype": wire_name(tensor.dtype()),
        "shape": tensor.shape,
    });
    if binary {
        let bytes = to_bytes(&tensor.data);
        out["parameters"] = serde_json::json!({ "binary_data_size": bytes.len() });
        return (out, Some(bytes));
    }
    out["data"] = match &tensor.data {
        Data::F32(v) => serde_json::json!(
            v.iter()
                .map(|x| if x.is_finite() {
                    Value::from(*x)
                } else {
                    Value::Null
                })
                .collect::<Vec<_>>()
        ),
        Data::F64(v) => serde_json::json!(
            v.iter()
                .map(|x| if x.is_finite() {
                    Value::from(*x)
                } else {
                    Value::Null
                })
                .collect::<Vec<_>>()
        ),
        Data::I64(v) => serde_json::json!(v),
        Data::I32(v) => serde_json::json!(v),
        Data::I8(v) => serde_json::json!(v),
        Data::U8(v) => serde_json::json!(v),
        Data::Bool(v) => serde_json::json!(v),
    };
    (out, None)
}

fn to_bytes(data: &Data) -> Vec<u8> {
    /// One copy where the host is little-endian, as for inputs (BERT's hidden states are
    /// 384 KiB per sequence).
    fn le<const N: usize, T: bytemuck::Pod>(v: &[T], f: fn(&T) -> [u8; N]) -> Vec<u8> {
        if cfg!(target_endian = "little") {
            bytemuck::cast_slice(v).to_vec()
        } else {
            v.iter().flat_map(f).collect()
        }
    }
    match data {
        Data::F32(v) => le(v, |x| x.to_le_bytes()),
        Data::F64(v) => le(v, |x| x.to_le_bytes()),
        Data::I64(v) => le(v, |x| x.to_le_bytes()),
        Data::I32(v) => le(v, |x| x.to_le_bytes()),
        Data::I8(v) => v.iter().map(|x| *x as u8).collect(),
        Data::U8(v) => v.clone(),
        Data::Bool(v) => v.iter().map(|x| u8::from(*x)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_model(_: &str) -> Option<DType> {
        Some(DType::F32)
    }

    #[test]
    fn json_nested_and_flat_decode_alike() {
        let nested =
            br#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4]]}]}"#;
        let flat = br#"{"id":"a","inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2,3,4]}]}"#;
        let a = decode_request(nested, &[], f32_model).expect("nested");
        let b = decode_request(flat, &[], f32_model).expect("flat");
        assert_eq!(a.inputs[0].1, b.inputs[0].1);
        assert_eq!(b.id.as_deref(), Some("a"));
    }

    #[test]
    fn binary_inputs_and_fp16() {
        let header = br#"{"inputs":[{"name":"x","shape":[2],"datatype":"FP16","parameters":{"binary_data_size":4}}],"outputs":[{"name":"y","parameters":{"binary_data":true}}]}"#;
        // 1.0 and -2.0 in half precision.
        let tail = [0x00, 0x3c, 0x00, 0xc0];
        let r = decode_request(header, &tail, f32_model).expect("binary");
        assert_eq!(r.inputs[0].1.as_f32().expect("f32"), &[1.0, -2.0]);
        assert_eq!(r.outputs, vec![("y".to_string(), true)]);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert!(f16_to_f32(0x7c00).is_infinite());
    }

    #[test]
    fn binary_tensors_decode_at_any_offset() {
        // An INT8 input of 3 bytes first, so the FP32 and INT64 data start unaligned.
        let header = br#"{"inputs":[
            {"name":"a","shape":[3],"datatype":"INT8","parameters":{"binary_data_size":3}},
            {"name":"b","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}},
            {"name":"c","shape":[2],"datatype":"INT64","parameters":{"binary_data_size":16}}]}"#;
        let mut tail = vec![1u8, 0xff, 3];
        for v in [1.5f32, -0.25] {
            tail.extend(v.to_le_bytes());
        }
        for v in [-7i64, 1 << 40] {
            tail.extend(v.to_le_bytes());
        }
        let r = decode_request(header, &tail, |_| None).expect("binary");
        assert_eq!(r.inputs[1].1.as_f32().expect("f32"), &[1.5, -0.25]);
        assert_eq!(r.inputs[2].1.data, Data::I64(vec![-7, 1 << 40]));
    }

    #[test]
    fn bad_requests_are_400_with_a_reason() {
        let cases: &[(&[u8], &[u8], &str)] = &[
            (b"{", b"", "malformed"),
            (br#"{"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[]}]}"#, b"", "negative"),
            (br#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]}"#, b"", "2 elements"),
            (br#"{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","data":[1,"a"]}]}"#, b"", "not a valid"),
            (br#"{"inputs":[{"name":"x","shape":[1],"datatype":"BYTES","data":["a"]}]}"#, b"", "not supported"),
            (br#"{"inputs":[{"name":"x","shape":[1],"datatype":"FLOAT","data":[1]}]}"#, b"", "unknown datatype"),
            (br#"{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}}]}"#, &[0, 0, 0, 0], "truncated"),
            (br#"{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":4}}]}"#, &[0, 0, 0, 0], "does not match"),
            (br#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[300]}]}"#, b"", "not a valid"),
            (br#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32"}]}"#, b"", "neither"),
        ];
        for (header, tail, want) in cases {
            let e = decode_request(header, tail, f32_model).expect_err(want);
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{want}");
            assert!(e.message.contains(want), "{want}: {}", e.message);
        }
        let huge = br#"{"inputs":[{"name":"x","shape":[100000,100000,100000],"datatype":"FP32","data":[]}]}"#;
        let e = decode_request(huge, &[], f32_model).expect_err("huge");
        assert_eq!(e.status, axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        let extra = decode_request(br#"{"inputs":[]}"#, &[1, 2], f32_model).expect_err("extra");
        assert!(extra.message.contains("follow the JSON"));
        let (ok, _) = split_body(b"{}xx", Some("2")).expect("split");
        assert_eq!(ok, b"{}");
        assert!(split_body(b"{}", Some("9")).is_err());
        assert!(split_body(b"{}", Some("x")).is_err());
    }

    #[test]
    fn outputs_encode_as_json_or_binary() {
        let t = Tensor::f32(vec![2], vec![1.5, f32::NAN]).expect("t");
        let (json, bytes) = encode_output("y", &t, false);
        assert_eq!(json["data"], serde_json::json!([1.5, null]));
        assert!(bytes.is_none());
        let (json, bytes) = encode_output("y", &t, true);
        assert_eq!(json["parameters"]["binary_data_size"], 8);
        let want: Vec<u8> = [1.5f32, f32::NAN]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(bytes, Some(want));
        let t = Tensor {
            shape: vec![2],
            data: Data::I64(vec![-2, 1 << 40]),
        };
        let (_, bytes) = encode_output("z", &t, true);
        let want: Vec<u8> = [-2i64, 1 << 40]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(bytes, Some(want));
    }
}
