//! Tensors in and out of the gRPC ModelInfer messages. An input's data comes either from its
//! typed `contents` or from the `raw_input_contents` entry at its position (little-endian, as
//! Triton sends them); every input is checked against the model before any is decoded, and the
//! decoded bytes are reserved first. Outputs always go back as `raw_output_contents`, as Triton
//! answers.

use super::pb::model_infer_request::InferInputTensor;
use super::pb::model_infer_response::InferOutputTensor;
use super::pb::{InferTensorContents, ModelInferRequest};
use crate::serve::codec::{self, Signature, TensorCheck, WireType};
use crate::serve::error::ApiError;
use cotenant_executor::{Data, Tensor};
use std::collections::BTreeSet;

/// The inputs of a request, decoded, and the outputs asked for (all when empty).
pub struct Decoded {
    pub inputs: Vec<(String, Tensor)>,
    pub outputs: Vec<String>,
}

enum Source<'a> {
    Raw(&'a [u8]),
    Contents(&'a InferTensorContents),
}

/// Decodes `request` for a model of signature `sig`, calling `reserve` with the decoded bytes
/// once every input has been checked.
pub fn decode(
    request: &ModelInferRequest,
    sig: &Signature,
    reserve: impl FnOnce(u64) -> Result<(), ApiError>,
) -> Result<Decoded, ApiError> {
    let raw = &request.raw_input_contents;
    if !raw.is_empty() && raw.len() != request.inputs.len() {
        return Err(ApiError::bad_request(format!(
            "raw_input_contents has {} entries for {} inputs; give one per input or none",
            raw.len(),
            request.inputs.len()
        )));
    }
    let mut seen = BTreeSet::new();
    let mut checked = Vec::with_capacity(request.inputs.len());
    for (i, input) in request.inputs.iter().enumerate() {
        if !seen.insert(input.name.as_str()) {
            return Err(ApiError::bad_request(format!(
                "input {:?} is given twice",
                input.name
            )));
        }
        let named = |e: ApiError| ApiError {
            message: format!("input {:?}: {}", input.name, e.message),
            ..e
        };
        let check =
            codec::check_tensor(&input.name, &input.datatype, &input.shape, sig).map_err(named)?;
        let source = source(input, raw.get(i).map(|r| &r[..]), &check).map_err(named)?;
        checked.push((input, check, source));
    }
    if let Some(missing) = sig.inputs.iter().find(|i| !seen.contains(i.name.as_str())) {
        return Err(ApiError::bad_request(format!(
            "input {:?} was not given",
            missing.name
        )));
    }
    let mut outputs: Vec<String> = Vec::with_capacity(request.outputs.len());
    for o in &request.outputs {
        if !sig.outputs.iter().any(|m| m.name == o.name) {
            return Err(ApiError::bad_request(format!(
                "unknown output {:?}; the model's outputs are {:?}",
                o.name,
                sig.outputs.iter().map(|m| &m.name).collect::<Vec<_>>()
            )));
        }
        if outputs.contains(&o.name) {
            return Err(ApiError::bad_request(format!(
                "output {:?} is asked for twice",
                o.name
            )));
        }
        outputs.push(o.name.clone());
    }

    let bytes: u64 = checked
        .iter()
        .map(|(_, c, _)| (c.elements * codec::dtype_size(c.wire.dtype())) as u64)
        .sum();
    reserve(bytes)?;
    let mut inputs = Vec::with_capacity(checked.len());
    for (input, check, source) in checked {
        let data = match source {
            Source::Raw(bytes) => codec::from_bytes(check.wire, bytes),
            Source::Contents(c) => from_contents(check.wire, c).map_err(|e| {
                ApiError::bad_request(format!("input {:?}: {}", input.name, e.message))
            })?,
        };
        let tensor = Tensor::new(check.shape, data)
            .map_err(|e| ApiError::bad_request(format!("input {:?}: {e}", input.name)))?;
        inputs.push((input.name.clone(), tensor));
    }
    Ok(Decoded { inputs, outputs })
}

/// Where an input's data is, checked to hold exactly its elements.
fn source<'a>(
    input: &'a InferInputTensor,
    raw: Option<&'a [u8]>,
    check: &TensorCheck,
) -> Result<Source<'a>, ApiError> {
    match (raw, &input.contents) {
        (Some(_), Some(c)) if contents_len(check.wire, c).is_some_and(|n| n > 0) => Err(
            ApiError::bad_request("has both contents and raw_input_contents"),
        ),
        (Some(bytes), _) => {
            let want = check.elements * check.wire.size();
            if bytes.len() != want {
                return Err(ApiError::bad_request(format!(
                    "raw_input_contents holds {} bytes, shape {:?} of {} needs {want}",
                    bytes.len(),
                    input.shape,
                    input.datatype
                )));
            }
            Ok(Source::Raw(bytes))
        }
        (None, Some(c)) => {
            let Some(given) = contents_len(check.wire, c) else {
                return Err(ApiError::bad_request(format!(
                    "{} data has no typed contents field; send it in raw_input_contents",
                    input.datatype
                )));
            };
            if given != check.elements {
                return Err(ApiError::bad_request(format!(
                    "contents hold {given} elements, shape {:?} needs {}",
                    input.shape, check.elements
                )));
            }
            Ok(Source::Contents(c))
        }
        (None, None) => Err(ApiError::bad_request(
            "has neither contents nor raw_input_contents",
        )),
    }
}

/// Elements in the contents field that carries `wire`, as Triton assigns them (8- to 32-bit
/// signed integers in `int_contents`, unsigned in `uint_contents`, 64-bit ones in
/// `int64_contents` and `uint64_contents`); `None` for FP16 and BF16,
/// which have no typed field.
fn contents_len(wire: WireType, c: &InferTensorContents) -> Option<usize> {
    Some(match wire {
        WireType::Bool => c.bool_contents.len(),
        WireType::U8 | WireType::U16 | WireType::U32 => c.uint_contents.len(),
        WireType::U64 => c.uint64_contents.len(),
        WireType::I8 | WireType::I16 | WireType::I32 => c.int_contents.len(),
        WireType::I64 => c.int64_contents.len(),
        WireType::F32 => c.fp32_contents.len(),
        WireType::F64 => c.fp64_contents.len(),
        WireType::F16 | WireType::BF16 => return None,
    })
}

/// The typed contents of `wire`; an integer outside its datatype's range is refused.
fn from_contents(wire: WireType, c: &InferTensorContents) -> Result<Data, ApiError> {
    fn narrow<S: Copy + std::fmt::Display, T: TryFrom<S>>(v: &[S]) -> Result<Vec<T>, ApiError> {
        v.iter()
            .map(|&x| {
                T::try_from(x).map_err(|_| {
                    ApiError::bad_request(format!(
                        "contents value {x} is out of its datatype's range"
                    ))
                })
            })
            .collect()
    }
    Ok(match wire {
        WireType::Bool => Data::Bool(c.bool_contents.clone()),
        WireType::U8 => Data::U8(narrow(&c.uint_contents)?),
        WireType::U16 => Data::U16(narrow(&c.uint_contents)?),
        WireType::U32 => Data::U32(c.uint_contents.clone()),
        WireType::U64 => Data::U64(c.uint64_contents.clone()),
        WireType::I8 => Data::I8(narrow(&c.int_contents)?),
        WireType::I16 => Data::I16(narrow(&c.int_contents)?),
        WireType::I32 => Data::I32(c.int_contents.clone()),
        WireType::I64 => Data::I64(c.int64_contents.clone()),
        WireType::F32 => Data::F32(c.fp32_contents.clone()),
        WireType::F64 => Data::F64(c.fp64_contents.clone()),
        WireType::F16 | WireType::BF16 => {
            return Err(ApiError::bad_request(
                "FP16 and BF16 data have no typed contents field; send them in raw_input_contents",
            ));
        }
    })
}

/// The outputs asked for (all, in the model's order, when none were named), as tensors without
/// data and their raw little-endian bytes.
pub fn encode(
    mut results: Vec<(String, Tensor)>,
    asked: &[String],
) -> (Vec<InferOutputTensor>, Vec<Vec<u8>>) {
    if !asked.is_empty() {
        results = asked
            .iter()
            .filter_map(|name| {
                let i = results.iter().position(|(n, _)| n == name)?;
                Some(results.swap_remove(i))
            })
            .collect();
    }
    let mut tensors = Vec::with_capacity(results.len());
    let mut raw = Vec::with_capacity(results.len());
    for (name, tensor) in results {
        let mut bytes = Vec::new();
        codec::append_bytes(&mut bytes, &tensor.data);
        tensors.push(InferOutputTensor {
            name,
            datatype: codec::output_wire_name(tensor.data.dtype()).to_string(),
            shape: tensor.shape.iter().map(|&d| d as i64).collect(),
            ..Default::default()
        });
        raw.push(bytes);
    }
    (tensors, raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16- to 64-bit integers come from the fields Triton puts them in, and a value outside
    /// the datatype's range is refused rather than wrapped.
    #[test]
    fn wide_and_unsigned_integers_come_from_triton_s_fields() {
        let c = InferTensorContents {
            int_contents: vec![-300, 7],
            uint_contents: vec![65_535, 4_000_000_000],
            uint64_contents: vec![u64::MAX],
            ..Default::default()
        };
        assert_eq!(contents_len(WireType::I16, &c), Some(2));
        assert_eq!(contents_len(WireType::U64, &c), Some(1));
        assert_eq!(
            from_contents(WireType::I16, &c).unwrap(),
            Data::I16(vec![-300, 7])
        );
        assert_eq!(
            from_contents(WireType::U32, &c).unwrap(),
            Data::U32(vec![65_535, 4_000_000_000])
        );
        assert_eq!(
            from_contents(WireType::U64, &c).unwrap(),
            Data::U64(vec![u64::MAX])
        );
        let e = from_contents(WireType::U16, &c).expect_err("4e9 is no UINT16");
        assert!(
            e.message.contains("out of its datatype's range"),
            "{}",
            e.message
        );
    }
}
