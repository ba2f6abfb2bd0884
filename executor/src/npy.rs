//! A small reader and writer for NumPy `.npy` files (format 1.0–3.0, little-endian, C order):
//! f32, f64, f16, i64, i32, i16, i8, u64, u32, u16, u8 and bool (bfloat16 and the low-bit types
//! of `tensor::lowbit` have no NumPy dtype).

use crate::tensor::{DType, Tensor, checked_numel};
use crate::tensor_proto::{from_le_bytes, to_le_bytes};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum NpyError {
    #[error("not a .npy file: {0}")]
    Format(String),
    #[error(
        "unsupported .npy dtype {0:?} (supported: <f4 <f8 <f2 <i8 <i4 <i2 |i1 <u8 <u4 <u2 |u1 |b1)"
    )]
    DType(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// The NumPy dtype of `d`; bfloat16 and the low-bit types have none (NumPy itself knows
/// them only through ml_dtypes).
fn descr(d: DType) -> Result<&'static str, NpyError> {
    Ok(match d {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::BF16 => return Err(NpyError::DType("bfloat16".into())),
        DType::I64 => "<i8",
        DType::I32 => "<i4",
        DType::I16 => "<i2",
        DType::I8 => "|i1",
        DType::U64 => "<u8",
        DType::U32 => "<u4",
        DType::U16 => "<u2",
        DType::U8 => "|u1",
        DType::Bool => "|b1",
        DType::Low(l) => return Err(NpyError::DType(format!("{l:?}"))),
    })
}

pub fn to_bytes(t: &Tensor) -> Result<Vec<u8>, NpyError> {
    let shape = match t.shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", t.shape[0]),
        _ => format!(
            "({})",
            t.shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(t.dtype())?
    );
    // Pad so that the data starts on a 64-byte boundary, header ends with a newline.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(to_le_bytes(&t.data));
    Ok(out)
}

pub fn from_bytes(b: &[u8]) -> Result<Tensor, NpyError> {
    let bad = |m: &str| NpyError::Format(m.to_string());
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err(bad("missing magic"));
    }
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(NpyError::Format(format!("version {v}"))),
    };
    let header = b
        .get(start..start + hlen)
        .ok_or_else(|| bad("truncated header"))?;
    let header = std::str::from_utf8(header).map_err(|_| bad("header is not text"))?;
    let field = |key: &str| -> Option<&str> {
        let i = header.find(&format!("'{key}'"))? + key.len() + 2;
        let rest = header[i..].trim_start().strip_prefix(':')?.trim_start();
        Some(rest)
    };
    let d = field("descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| bad("no descr"))?;
    let dtype = match d {
        "<f4" => DType::F32,
        "<f8" => DType::F64,
        "<f2" => DType::F16,
        "<i8" => DType::I64,
        "<i4" => DType::I32,
        "<i2" => DType::I16,
        "<u8" => DType::U64,
        "<u4" => DType::U32,
        "<u2" => DType::U16,
        "|i1" | "<i1" => DType::I8,
        "|u1" | "<u1" => DType::U8,
        "|b1" | "<b1" => DType::Bool,
        other => return Err(NpyError::DType(other.to_string())),
    };
    if field("fortran_order").is_some_and(|r| r.starts_with("True")) {
        return Err(bad("Fortran order is not supported"));
    }
    let sh = field("shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| bad("no shape"))?;
    let shape = sh
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| bad("bad shape")))
        .collect::<Result<Vec<_>, _>>()?;
    let n = checked_numel(&shape).map_err(|e| NpyError::Format(e.to_string()))?;
    let data = &b[start + hlen..];
    if data.len() != n * dtype.size() {
        return Err(NpyError::Format(format!(
            "data has {} bytes, shape {shape:?} needs {}",
            data.len(),
            n * dtype.size()
        )));
    }
    Tensor::new(shape, from_le_bytes(dtype, data)).map_err(|e| NpyError::Format(e.to_string()))
}

pub fn read(path: &std::path::Path) -> Result<Tensor, NpyError> {
    from_bytes(&std::fs::read(path)?)
}

pub fn write(path: &std::path::Path, t: &Tensor) -> Result<(), NpyError> {
    Ok(std::fs::write(path, to_bytes(t)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Data;

    #[test]
    fn round_trips_every_dtype() {
        for data in [
            Data::F32(vec![1.5, -2.0]),
            Data::F64(vec![1.0, 2.0]),
            Data::F16(vec![
                crate::tensor::f16::from_f32(0.5),
                crate::tensor::f16::MAX,
            ]),
            Data::I64(vec![-1, 7]),
            Data::I32(vec![3, 4]),
            Data::I16(vec![i16::MIN, 5]),
            Data::I8(vec![-128, 1]),
            Data::U64(vec![u64::MAX, 0]),
            Data::U32(vec![u32::MAX, 9]),
            Data::U16(vec![u16::MAX, 2]),
            Data::U8(vec![0, 255]),
            Data::Bool(vec![true, false]),
        ] {
            let t = Tensor::new(vec![2, 1], data).unwrap();
            assert_eq!(from_bytes(&to_bytes(&t).unwrap()).unwrap(), t);
        }
        let s = Tensor::scalar_f32(3.0);
        assert_eq!(from_bytes(&to_bytes(&s).unwrap()).unwrap(), s);
        assert!(from_bytes(b"garbage").is_err());
        let b = Tensor::new(vec![1], Data::BF16(vec![crate::tensor::bf16::ONE])).unwrap();
        assert!(matches!(to_bytes(&b), Err(NpyError::DType(_))));
    }
}
