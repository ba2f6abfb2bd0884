//! Tensors in and out of the Open Inference Protocol (KServe v2) REST encoding: JSON tensors
//! (flat or nested row-major data) and the binary tensor extension (`binary_data_size`, with the
//! JSON header length in `Inference-Header-Content-Length`). A request is checked against the
//! model's signature before any tensor is decoded, and decoded straight into typed buffers.

mod decode;
mod encode;

pub use decode::{
    InferRequest, Signature, TensorCheck, check_tensor, decode_request, from_bytes, header_length,
};
pub use encode::{append_bytes, encode_response};

use super::error::ApiError;
use cotenant_executor::DType;

/// Elements one tensor may have (256 Mi): a bound on what a request can make us allocate.
pub const MAX_ELEMENTS: usize = 1 << 28;

/// The wire datatypes this agent reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireType {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

impl WireType {
    pub fn parse(s: &str) -> Result<WireType, ApiError> {
        Ok(match s {
            "BOOL" => WireType::Bool,
            "UINT8" => WireType::U8,
            "UINT16" => WireType::U16,
            "UINT32" => WireType::U32,
            "UINT64" => WireType::U64,
            "INT8" => WireType::I8,
            "INT16" => WireType::I16,
            "INT32" => WireType::I32,
            "INT64" => WireType::I64,
            "FP16" => WireType::F16,
            "BF16" => WireType::BF16,
            "FP32" => WireType::F32,
            "FP64" => WireType::F64,
            "BYTES" => {
                return Err(ApiError::bad_request(format!(
                    "datatype {s} is not supported by this server"
                )));
            }
            other => return Err(ApiError::bad_request(format!("unknown datatype {other:?}"))),
        })
    }

    /// Bytes of one element on the wire.
    pub fn size(self) -> usize {
        dtype_size(self.dtype())
    }

    /// The executor dtype it decodes to: each datatype to its own, so a tensor is sent in the
    /// type the model declares (as Triton requires).
    pub fn dtype(self) -> DType {
        match self {
            WireType::Bool => DType::Bool,
            WireType::U8 => DType::U8,
            WireType::U16 => DType::U16,
            WireType::U32 => DType::U32,
            WireType::U64 => DType::U64,
            WireType::I8 => DType::I8,
            WireType::I16 => DType::I16,
            WireType::I32 => DType::I32,
            WireType::I64 => DType::I64,
            WireType::F16 => DType::F16,
            WireType::BF16 => DType::BF16,
            WireType::F32 => DType::F32,
            WireType::F64 => DType::F64,
        }
    }
}

/// Bytes of one element of an executor dtype in memory.
pub fn dtype_size(dtype: DType) -> usize {
    match dtype {
        // float8, float4, int4 and int2 hold one code per byte in memory.
        DType::Bool | DType::U8 | DType::I8 | DType::Low(_) => 1,
        DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
        DType::I32 | DType::U32 | DType::F32 => 4,
        DType::I64 | DType::U64 | DType::F64 => 8,
    }
}

/// The wire name of an executor dtype; `None` for float8, float4, int4 and int2, which the
/// inference protocol has no datatype for (loading refuses models with such inputs or outputs).
pub fn wire_name(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "FP32",
        DType::F64 => "FP64",
        DType::F16 => "FP16",
        DType::BF16 => "BF16",
        DType::I64 => "INT64",
        DType::I32 => "INT32",
        DType::I16 => "INT16",
        DType::I8 => "INT8",
        DType::U64 => "UINT64",
        DType::U32 => "UINT32",
        DType::U16 => "UINT16",
        DType::U8 => "UINT8",
        DType::Bool => "BOOL",
        DType::Low(_) => return None,
    })
}

/// [`wire_name`] of an output the model produces: loading refused every model whose outputs
/// have no datatype, so the fallback (its codes as bytes) is never sent.
pub fn output_wire_name(dtype: DType) -> &'static str {
    wire_name(dtype).unwrap_or("UINT8")
}

#[cfg(test)]
mod tests;
