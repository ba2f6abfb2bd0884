//! TensorProto ↔ [`Tensor`]: decoding initializers and attribute tensors from whichever field holds
//! their data (typed fields, raw little-endian bytes, or external data next to the model), and
//! encoding tensors as raw data. Shared by the importer and attribute parsing.

use crate::error::ImportError;
use crate::proto::TensorProto;
use crate::tensor::{DType, Data, Tensor, bf16, checked_numel, f16, lowbit};
use std::path::Path;

fn bad_tensor(t: &TensorProto, reason: impl Into<String>) -> ImportError {
    ImportError::BadTensor {
        name: t.name.clone(),
        reason: reason.into(),
    }
}

/// Decodes a TensorProto from whichever field holds its data.
pub fn decode_tensor(t: &TensorProto, base_dir: Option<&Path>) -> Result<Tensor, ImportError> {
    let dtype = DType::from_onnx(t.data_type)
        .ok_or_else(|| bad_tensor(t, format!("unsupported element type {}", t.data_type)))?;
    let shape = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad_tensor(t, format!("negative dimension {d}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let n = checked_numel(&shape).map_err(|e| bad_tensor(t, e.to_string()))?;
    let bytes = raw_len(dtype, n);
    let external;
    let raw: Option<&[u8]> = if t.data_location == 1 {
        external = read_external(t, base_dir, bytes)?;
        Some(&external)
    } else if !t.raw_data.is_empty()
        || (n == 0 && t.raw_data.is_empty() && typed_len(t, dtype) == 0)
    {
        Some(&t.raw_data)
    } else {
        None
    };
    let data = match raw {
        Some(raw) => {
            if raw.len() != bytes {
                return Err(bad_tensor(
                    t,
                    format!(
                        "raw data has {} bytes, shape {shape:?} needs {bytes}",
                        raw.len(),
                    ),
                ));
            }
            match dtype {
                DType::Low(l) => Data::Low(l, lowbit::unpack(l, raw, n)),
                _ => from_le_bytes(dtype, raw),
            }
        }
        None => {
            // Packed types hold several elements per int32_data entry.
            let want = match dtype {
                DType::Low(l) => l.packed_len(n),
                _ => n,
            };
            if typed_len(t, dtype) != want {
                return Err(bad_tensor(
                    t,
                    format!(
                        "holds {} values, shape {shape:?} needs {want}",
                        typed_len(t, dtype)
                    ),
                ));
            }
            match dtype {
                DType::F32 => Data::F32(t.float_data.clone()),
                DType::F64 => Data::F64(t.double_data.clone()),
                // Half precision travels as its bit pattern in int32_data.
                DType::F16 => Data::F16(
                    t.int32_data
                        .iter()
                        .map(|&v| f16::from_bits(v as u16))
                        .collect(),
                ),
                DType::BF16 => Data::BF16(
                    t.int32_data
                        .iter()
                        .map(|&v| bf16::from_bits(v as u16))
                        .collect(),
                ),
                DType::I64 => Data::I64(t.int64_data.clone()),
                DType::I32 => Data::I32(t.int32_data.clone()),
                DType::I16 => Data::I16(t.int32_data.iter().map(|&v| v as i16).collect()),
                DType::I8 => Data::I8(t.int32_data.iter().map(|&v| v as i8).collect()),
                DType::U64 => Data::U64(t.uint64_data.clone()),
                DType::U32 => Data::U32(t.uint64_data.iter().map(|&v| v as u32).collect()),
                DType::U16 => Data::U16(t.int32_data.iter().map(|&v| v as u16).collect()),
                DType::U8 => Data::U8(t.int32_data.iter().map(|&v| v as u8).collect()),
                DType::Bool => Data::Bool(t.int32_data.iter().map(|&v| v != 0).collect()),
                // Bit patterns (packed for 4- and 2-bit types), one byte per int32_data entry.
                DType::Low(l) => {
                    let bytes = t
                        .int32_data
                        .iter()
                        .map(|&v| u8::try_from(v))
                        .collect::<Result<Vec<u8>, _>>()
                        .map_err(|_| {
                            bad_tensor(t, format!("{l:?} int32_data entry outside 0..=255"))
                        })?;
                    Data::Low(l, lowbit::unpack(l, &bytes, n))
                }
            }
        }
    };
    Ok(Tensor { shape, data })
}

/// Bytes that `n` elements of `dtype` take as raw data (packed for 4- and 2-bit types).
pub fn raw_len(dtype: DType, n: usize) -> usize {
    match dtype {
        DType::Low(l) => l.packed_len(n),
        _ => n * dtype.size(),
    }
}

fn typed_len(t: &TensorProto, dtype: DType) -> usize {
    match dtype {
        DType::F32 => t.float_data.len(),
        DType::F64 => t.double_data.len(),
        DType::I64 => t.int64_data.len(),
        DType::U64 | DType::U32 => t.uint64_data.len(),
        _ => t.int32_data.len(),
    }
}

pub(crate) fn from_le_bytes(dtype: DType, raw: &[u8]) -> Data {
    fn conv<T, const N: usize>(raw: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
        raw.chunks_exact(N)
            .map(|c| f(c.try_into().unwrap_or([0; N])))
            .collect()
    }
    match dtype {
        DType::F32 => Data::F32(conv(raw, f32::from_le_bytes)),
        DType::F64 => Data::F64(conv(raw, f64::from_le_bytes)),
        DType::F16 => Data::F16(conv(raw, f16::from_le_bytes)),
        DType::BF16 => Data::BF16(conv(raw, bf16::from_le_bytes)),
        DType::I64 => Data::I64(conv(raw, i64::from_le_bytes)),
        DType::I32 => Data::I32(conv(raw, i32::from_le_bytes)),
        DType::I16 => Data::I16(conv(raw, i16::from_le_bytes)),
        DType::U64 => Data::U64(conv(raw, u64::from_le_bytes)),
        DType::U32 => Data::U32(conv(raw, u32::from_le_bytes)),
        DType::U16 => Data::U16(conv(raw, u16::from_le_bytes)),
        DType::I8 => Data::I8(raw.iter().map(|&b| b as i8).collect()),
        DType::U8 => Data::U8(raw.to_vec()),
        DType::Bool => Data::Bool(raw.iter().map(|&b| b != 0).collect()),
        // Every element the bytes hold (a packed tensor's padding included).
        DType::Low(l) => Data::Low(l, lowbit::unpack(l, raw, raw.len() * (8 / l.bits()))),
    }
}

pub(crate) fn to_le_bytes(data: &Data) -> Vec<u8> {
    match data {
        Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::U64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::U16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I8(v) => v.iter().map(|&x| x as u8).collect(),
        Data::U8(v) => v.clone(),
        Data::Bool(v) => v.iter().map(|&x| x as u8).collect(),
        Data::Low(l, v) => lowbit::pack(*l, v),
    }
}

/// Reads `len` bytes of an external-data tensor from a file next to the model.
fn read_external(
    t: &TensorProto,
    base_dir: Option<&Path>,
    len: usize,
) -> Result<Vec<u8>, ImportError> {
    use std::io::{Read, Seek, SeekFrom};
    let get = |k: &str| {
        t.external_data
            .iter()
            .find(|e| e.key == k)
            .map(|e| e.value.as_str())
    };
    let location =
        get("location").ok_or_else(|| bad_tensor(t, "external data without a location"))?;
    let num = |k: &str| -> Result<Option<u64>, ImportError> {
        get(k)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| bad_tensor(t, format!("external data {k} {v:?} is not a number")))
            })
            .transpose()
    };
    let offset = num("offset")?.unwrap_or(0);
    if let Some(l) = num("length")?
        && l != len as u64
    {
        return Err(bad_tensor(
            t,
            format!("external data length {l} does not match the shape ({len} bytes)"),
        ));
    }
    let rel = Path::new(location);
    // The model must not make us read files outside its own folder.
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(bad_tensor(
            t,
            format!("external data location {location:?} leaves the model's folder"),
        ));
    }
    let base = base_dir
        .ok_or_else(|| bad_tensor(t, "external data, but the model was not loaded from a file"))?;
    let path = base.join(rel);
    let io = |source| ImportError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::File::open(&path).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    if offset.saturating_add(len as u64) > size {
        return Err(bad_tensor(
            t,
            format!(
                "external data {location:?} is {size} bytes, needs {} at offset {offset}",
                len
            ),
        ));
    }
    f.seek(SeekFrom::Start(offset)).map_err(io)?;
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).map_err(io)?;
    Ok(buf)
}

/// Encodes a tensor as a TensorProto with raw data (used by the zoo writer and the tests).
pub fn encode_tensor(name: &str, t: &Tensor) -> TensorProto {
    TensorProto {
        dims: t.shape.iter().map(|&d| d as i64).collect(),
        data_type: t.dtype().onnx(),
        name: name.to_string(),
        raw_data: to_le_bytes(&t.data).into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_and_raw_initializers_decode_alike() {
        let typed = TensorProto {
            dims: vec![2],
            data_type: 1,
            float_data: vec![1.5, -2.0],
            ..Default::default()
        };
        let raw = encode_tensor("r", &Tensor::f32(vec![2], vec![1.5, -2.0]).unwrap());
        assert_eq!(
            decode_tensor(&typed, None).unwrap(),
            decode_tensor(&raw, None).unwrap()
        );
        let short = TensorProto {
            dims: vec![3],
            data_type: 1,
            float_data: vec![1.0],
            ..Default::default()
        };
        assert!(decode_tensor(&short, None).is_err());
    }

    #[test]
    fn packed_types_decode_from_either_field_and_refuse_wrong_lengths() {
        use crate::tensor::Low;
        let proto = |raw: Vec<u8>, typed: Vec<i32>| TensorProto {
            dims: vec![3],
            data_type: 22,
            raw_data: raw.into(),
            int32_data: typed,
            ..Default::default()
        };
        // int4 [-1, 7, -8]: two to a byte, the first in the low bits.
        let t = decode_tensor(&proto(vec![0x7f, 0x08], vec![]), None).unwrap();
        assert_eq!(t.data, Data::Low(Low::I4, vec![0xf, 0x7, 0x8]));
        assert_eq!(t.to_i64_vec().unwrap(), vec![-1, 7, -8]);
        assert_eq!(decode_tensor(&encode_tensor("r", &t), None).unwrap(), t);
        assert_eq!(
            decode_tensor(&proto(vec![], vec![0x7f, 0x08]), None).unwrap(),
            t
        );
        for raw in [vec![0x7f], vec![0x7f, 0x08, 0x00]] {
            let e = decode_tensor(&proto(raw, vec![]), None).unwrap_err();
            assert!(e.to_string().contains("needs 2"), "{e}");
        }
        assert!(decode_tensor(&proto(vec![], vec![0x7f]), None).is_err());
        let e = decode_tensor(&proto(vec![], vec![0x7f, 0x108]), None).unwrap_err();
        assert!(e.to_string().contains("outside 0..=255"), "{e}");
        // float8: one byte each.
        let f8 = TensorProto {
            dims: vec![2],
            data_type: 17,
            raw_data: vec![0x38, 0xfe].into(),
            ..Default::default()
        };
        assert_eq!(
            decode_tensor(&f8, None).unwrap().to_f64_vec(),
            vec![1.0, -448.0]
        );
    }

    #[test]
    fn sixteen_bit_and_unsigned_integers_decode_from_their_typed_fields() {
        let typed = |data_type, int32_data: Vec<i32>, uint64_data: Vec<u64>| TensorProto {
            dims: vec![2],
            data_type,
            int32_data,
            uint64_data,
            ..Default::default()
        };
        let cases = [
            (typed(5, vec![-3, 300], vec![]), Data::I16(vec![-3, 300])),
            (typed(4, vec![65535, 1], vec![]), Data::U16(vec![65535, 1])),
            (
                typed(12, vec![], vec![4_000_000_000, 1]),
                Data::U32(vec![4_000_000_000, 1]),
            ),
            (
                typed(13, vec![], vec![u64::MAX, 0]),
                Data::U64(vec![u64::MAX, 0]),
            ),
        ];
        for (proto, data) in cases {
            let t = decode_tensor(&proto, None).unwrap();
            assert_eq!(t.data, data);
            assert_eq!(decode_tensor(&encode_tensor("r", &t), None).unwrap(), t);
        }
    }
}
