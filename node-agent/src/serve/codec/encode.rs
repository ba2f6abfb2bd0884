//! Encoding an inference response: the JSON header is written straight from the output tensors
//! (non-finite floats as `null`), binary outputs appended as raw little-endian bytes.

use super::output_wire_name;
use cotenant_executor::{Data, Tensor};
use serde::Serialize;
use serde::ser::Serializer;

#[derive(Serialize)]
struct Response<'a> {
    model_name: &'a str,
    model_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    outputs: Vec<Output<'a>>,
}

#[derive(Serialize)]
struct Output<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<BinarySize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<JsonData<'a>>,
}

#[derive(Serialize)]
struct BinarySize {
    binary_data_size: usize,
}

/// A tensor's elements as a JSON list.
struct JsonData<'a>(&'a Data);

impl Serialize for JsonData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Data::F32(v) => s.collect_seq(v.iter().map(|x| x.is_finite().then_some(*x))),
            Data::F64(v) => s.collect_seq(v.iter().map(|x| x.is_finite().then_some(*x))),
            Data::F16(v) => s.collect_seq(v.iter().map(|x| x.is_finite().then(|| x.to_f32()))),
            Data::BF16(v) => s.collect_seq(v.iter().map(|x| x.is_finite().then(|| x.to_f32()))),
            Data::I64(v) => s.collect_seq(v),
            Data::I32(v) => s.collect_seq(v),
            Data::I16(v) => s.collect_seq(v),
            Data::I8(v) => s.collect_seq(v),
            Data::U64(v) => s.collect_seq(v),
            Data::U32(v) => s.collect_seq(v),
            Data::U16(v) => s.collect_seq(v),
            Data::U8(v) => s.collect_seq(v),
            Data::Bool(v) => s.collect_seq(v),
            Data::Low(_, v) => s.collect_seq(v),
        }
    }
}

/// The response body for `outputs` of `model`: those `requested` (all when empty), each as JSON
/// or binary. Returns the body and, when binary data follows the JSON, the JSON's length (the
/// `Inference-Header-Content-Length`).
pub fn encode_response(
    model: &str,
    id: Option<&str>,
    outputs: &[(String, Tensor)],
    requested: &[(String, bool)],
    all_binary: bool,
) -> Result<(Vec<u8>, Option<usize>), serde_json::Error> {
    let mut json = Vec::new();
    let mut binary: Vec<&Tensor> = Vec::new();
    for (name, tensor) in outputs {
        let as_binary = if requested.is_empty() {
            all_binary
        } else {
            match requested.iter().find(|(n, _)| n == name) {
                Some((_, b)) => *b || all_binary,
                None => continue,
            }
        };
        let size = as_binary.then(|| tensor.data.len() * element_bytes(&tensor.data));
        json.push(Output {
            name,
            datatype: output_wire_name(tensor.dtype()),
            shape: &tensor.shape,
            parameters: size.map(|binary_data_size| BinarySize { binary_data_size }),
            data: (!as_binary).then_some(JsonData(&tensor.data)),
        });
        if as_binary {
            binary.push(tensor);
        }
    }
    let mut body = serde_json::to_vec(&Response {
        model_name: model,
        model_version: "1",
        id,
        outputs: json,
    })?;
    if binary.is_empty() {
        return Ok((body, None));
    }
    let header_len = body.len();
    for tensor in binary {
        append_bytes(&mut body, &tensor.data);
    }
    Ok((body, Some(header_len)))
}

fn element_bytes(data: &Data) -> usize {
    super::dtype_size(data.dtype())
}

/// Appends the raw little-endian bytes of `data`: one copy where the host is little-endian
/// (BERT's hidden states are 384 KiB per sequence).
pub fn append_bytes(out: &mut Vec<u8>, data: &Data) {
    fn le<const N: usize, T: bytemuck::Pod>(out: &mut Vec<u8>, v: &[T], f: fn(&T) -> [u8; N]) {
        if cfg!(target_endian = "little") {
            out.extend_from_slice(bytemuck::cast_slice(v));
        } else {
            out.extend(v.iter().flat_map(f));
        }
    }
    match data {
        Data::F32(v) => le(out, v, |x| x.to_le_bytes()),
        Data::F64(v) => le(out, v, |x| x.to_le_bytes()),
        Data::F16(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
        Data::BF16(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
        Data::I64(v) => le(out, v, |x| x.to_le_bytes()),
        Data::I32(v) => le(out, v, |x| x.to_le_bytes()),
        Data::I16(v) => le(out, v, |x| x.to_le_bytes()),
        Data::U64(v) => le(out, v, |x| x.to_le_bytes()),
        Data::U32(v) => le(out, v, |x| x.to_le_bytes()),
        Data::U16(v) => le(out, v, |x| x.to_le_bytes()),
        Data::I8(v) => out.extend(v.iter().map(|x| *x as u8)),
        Data::U8(v) => out.extend_from_slice(v),
        Data::Bool(v) => out.extend(v.iter().map(|x| u8::from(*x))),
        Data::Low(_, v) => out.extend_from_slice(v),
    }
}
