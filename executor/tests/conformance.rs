//! The ONNX backend test data shipped in the onnx 1.22 wheel (node tests, pytorch-converted,
//! pytorch-operator, light models) run through the executor. Writes `CONFORMANCE.md` and fails
//! when a case whose operators are all supported fails and is not on the allow-list below.

mod common;

use cotenant_executor::ops::SUPPORTED_OPS;
use cotenant_executor::proto::{ModelProto, TensorProto};
use cotenant_executor::tensor::{Data, Tensor};
use cotenant_executor::tensor_proto::decode_tensor;
use cotenant_executor::{CpuBackend, Model};
use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Known failures of cases whose operators are all supported, with the reason. A `*` at the
/// end matches any suffix.
const ALLOWED_FAILURES: &[(&str, &str)] = &[
    // element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)
    (
        "test_add_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_add_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_add_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_add_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_attention_4d_fp16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_attention_4d_gqa_with_past_and_present_fp16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_BFLOAT16_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_DOUBLE_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_DOUBLE",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_FLOAT4E2M1",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_FLOAT8E4M3FN",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_FLOAT8E4M3FNUZ",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_FLOAT8E5M2",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_FLOAT8E5M2FNUZ",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_INT2",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_INT4",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_UINT2",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT16_to_UINT4",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT4E2M1_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT4E2M1_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT8E4M3FNUZ_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT8E4M3FNUZ_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT8E4M3FN_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT8E4M3FN_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT8E5M2FNUZ_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT8E5M2FNUZ_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT8E5M2_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT8E5M2_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_BFLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_FLOAT4E2M1",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_FLOAT8E4M3FN",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_FLOAT8E4M3FNUZ",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_FLOAT8E5M2",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_FLOAT8E5M2FNUZ",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_INT2",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_INT4",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_UINT2",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_FLOAT_to_UINT4",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_INT2_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_INT2_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_INT2_to_INT8",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_INT4_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_INT4_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_INT4_to_INT8",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_UINT2_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_UINT2_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_UINT2_to_UINT8",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_UINT4_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_UINT4_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_UINT4_to_UINT8",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_e8m0_FLOAT16_to_FLOAT8E8M0",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_e8m0_FLOAT8E8M0_to_FLOAT",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_e8m0_FLOAT8E8M0_to_FLOAT16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_e8m0_FLOAT_to_FLOAT8E8M0",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FN",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FN",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_BFLOAT16_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_DOUBLE_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_DOUBLE_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_FLOAT4E2M1_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_FLOAT8E4M3FN_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_FLOAT8E5M2_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_INT2_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_INT4_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_UINT2_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT16_to_UINT4_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT4E2M1_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT4E2M1_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT8E4M3FNUZ_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT8E4M3FN_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT8E4M3FN_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT8E5M2FNUZ_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT8E5M2_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT8E5M2_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_BFLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_FLOAT4E2M1_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_FLOAT8E4M3FNUZ_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_FLOAT8E4M3FN_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_FLOAT8E5M2FNUZ_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_FLOAT8E5M2_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_INT2_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_INT4_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_UINT2_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_FLOAT_to_UINT4_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_INT2_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_INT2_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_INT2_to_INT8_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_INT4_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_INT4_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_INT4_to_INT8_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_UINT2_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_UINT2_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_UINT2_to_UINT8_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_UINT4_to_FLOAT16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_UINT4_to_FLOAT_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_UINT4_to_UINT8_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_div_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_div_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_div_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_div_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_equal_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_equal_string",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_equal_string_broadcast",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_equal_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_equal_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_equal_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_flexattention_fp16_expanded_ver26",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_equal_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_equal_int16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_equal_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_equal_uint16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_equal_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_equal_uint32_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_equal_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_equal_uint64_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_greater_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_equal_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_equal_int16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_equal_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_equal_uint16_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_equal_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_equal_uint32_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_equal_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_equal_uint64_expanded",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_less_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_max_float16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_max_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_max_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_max_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_max_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_min_float16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_min_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_min_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_min_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_min_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_mod_mixed_sign_float16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_mod_mixed_sign_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_mod_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_mod_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_mod_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_mul_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_mul_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_mul_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_mul_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_pow_types_float32_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_pow_types_float32_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_range_bfloat16_type_positive_delta",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_range_float16_type_positive_delta",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_sub_int16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_sub_uint16",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_sub_uint32",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_sub_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    (
        "test_top_k_uint64",
        "element type not supported (float16, bfloat16, string, uint16/32/64, int16, float8)",
    ),
    // 3-D pooling and convolution are not implemented
    (
        "test_AvgPool3d",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_AvgPool3d_stride",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_AvgPool3d_stride1_pad0_gpu_input",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_Conv3d",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_Conv3d_dilated",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_Conv3d_dilated_strided",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_Conv3d_groups",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_Conv3d_no_bias",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_Conv3d_stride",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_Conv3d_stride_padding",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_MaxPool3d",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_MaxPool3d_stride",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_MaxPool3d_stride_padding",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_averagepool_3d_default",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_averagepool_3d_dilations_small",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_convtranspose_3d",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_maxpool_3d_default",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_maxpool_3d_dilations",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_maxpool_3d_dilations_use_ref_impl",
        "3-D pooling and convolution are not implemented",
    ),
    (
        "test_maxpool_3d_dilations_use_ref_impl_large",
        "3-D pooling and convolution are not implemented",
    ),
    // training mode (batch statistics, random dropout) is not supported for inference
    (
        "test_batchnorm_epsilon_training_mode",
        "training mode (batch statistics, random dropout) is not supported for inference",
    ),
    (
        "test_batchnorm_example_training_mode",
        "training mode (batch statistics, random dropout) is not supported for inference",
    ),
    (
        "test_training_dropout",
        "training mode (batch statistics, random dropout) is not supported for inference",
    ),
    (
        "test_training_dropout_default",
        "training mode (batch statistics, random dropout) is not supported for inference",
    ),
    (
        "test_training_dropout_default_mask",
        "training mode (batch statistics, random dropout) is not supported for inference",
    ),
    (
        "test_training_dropout_mask",
        "training mode (batch statistics, random dropout) is not supported for inference",
    ),
    // MatMul in float64 is not implemented
    (
        "test_flexattention_double_expanded_ver26",
        "MatMul in float64 is not implemented",
    ),
    // optional and sequence types are not supported
    (
        "test_identity_opt",
        "optional and sequence types are not supported",
    ),
    (
        "test_identity_sequence",
        "optional and sequence types are not supported",
    ),
    // MaxPool on uint8 is not implemented
    (
        "test_maxpool_2d_uint8",
        "MaxPool on uint8 is not implemented",
    ),
    // MaxPool's Indices output / storage_order is not implemented
    (
        "test_maxpool_with_argmax_2d_precomputed_pads",
        "MaxPool's Indices output / storage_order is not implemented",
    ),
    (
        "test_maxpool_with_argmax_2d_precomputed_strides",
        "MaxPool's Indices output / storage_order is not implemented",
    ),
    // ReduceMax/ReduceMin of bool are not implemented
    (
        "test_reduce_max_bool_inputs",
        "ReduceMax/ReduceMin of bool are not implemented",
    ),
    (
        "test_reduce_min_bool_inputs",
        "ReduceMax/ReduceMin of bool are not implemented",
    ),
    // cubic Resize is not implemented
    (
        "test_resize_downsample_scales_cubic",
        "cubic Resize is not implemented",
    ),
    (
        "test_resize_downsample_scales_cubic_A_n0p5_exclude_outside",
        "cubic Resize is not implemented",
    ),
    (
        "test_resize_downsample_scales_cubic_align_corners",
        "cubic Resize is not implemented",
    ),
    (
        "test_resize_downsample_scales_cubic_antialias",
        "cubic Resize is not implemented",
    ),
    (
        "test_resize_downsample_sizes_cubic",
        "cubic Resize is not implemented",
    ),
    (
        "test_resize_downsample_sizes_cubic_antialias",
        "cubic Resize is not implemented",
    ),
    (
        "test_resize_upsample_scales_cubic",
        "cubic Resize is not implemented",
    ),
    (
        "test_resize_upsample_scales_cubic_A_n0p5_exclude_outside",
        "cubic Resize is not implemented",
    ),
    (
        "test_resize_upsample_scales_cubic_align_corners",
        "cubic Resize is not implemented",
    ),
    (
        "test_resize_upsample_scales_cubic_asymmetric",
        "cubic Resize is not implemented",
    ),
    (
        "test_resize_upsample_sizes_cubic",
        "cubic Resize is not implemented",
    ),
    // Resize antialias is not implemented
    (
        "test_resize_downsample_scales_linear_antialias",
        "Resize antialias is not implemented",
    ),
    (
        "test_resize_downsample_sizes_linear_antialias",
        "Resize antialias is not implemented",
    ),
    // Resize keep_aspect_ratio_policy other than stretch is not implemented
    (
        "test_resize_downsample_sizes_nearest_not_larger",
        "Resize keep_aspect_ratio_policy other than stretch is not implemented",
    ),
    (
        "test_resize_downsample_sizes_nearest_not_smaller",
        "Resize keep_aspect_ratio_policy other than stretch is not implemented",
    ),
    (
        "test_resize_upsample_sizes_nearest_not_larger",
        "Resize keep_aspect_ratio_policy other than stretch is not implemented",
    ),
    (
        "test_resize_upsample_sizes_nearest_not_smaller",
        "Resize keep_aspect_ratio_policy other than stretch is not implemented",
    ),
    // Resize tf_crop_and_resize (roi) is not implemented
    (
        "test_resize_tf_crop_and_resize",
        "Resize tf_crop_and_resize (roi) is not implemented",
    ),
    (
        "test_resize_tf_crop_and_resize_axes_2_3",
        "Resize tf_crop_and_resize (roi) is not implemented",
    ),
    (
        "test_resize_tf_crop_and_resize_axes_3_2",
        "Resize tf_crop_and_resize (roi) is not implemented",
    ),
    (
        "test_resize_tf_crop_and_resize_extrapolation_value",
        "Resize tf_crop_and_resize (roi) is not implemented",
    ),
];

fn allowed(case: &str) -> Option<&'static str> {
    ALLOWED_FAILURES
        .iter()
        .find(|(p, _)| match p.strip_suffix('*') {
            Some(pre) => case.starts_with(pre),
            None => *p == case,
        })
        .map(|(_, r)| *r)
}

fn read_pb(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let tp = TensorProto::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
    decode_tensor(&tp, None).map_err(|e| e.to_string())
}

fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.shape != want.shape {
        return Err(format!("shape {:?}, expected {:?}", got.shape, want.shape));
    }
    if got.dtype() != want.dtype() {
        return Err(format!(
            "type {:?}, expected {:?}",
            got.dtype(),
            want.dtype()
        ));
    }
    match (&got.data, &want.data) {
        (Data::F32(_), _) | (Data::F64(_), _) => {
            let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                if !common::close(*a, *b, rtol, atol) {
                    return Err(format!("element {i}: {a} vs {b}"));
                }
            }
            Ok(())
        }
        _ if got.data == want.data => Ok(()),
        _ => Err("values differ".into()),
    }
}

struct Case {
    suite: &'static str,
    name: String,
    ops: Vec<String>,
    supported: bool,
    result: Result<(), String>,
}

fn run_case(
    model_path: &Path,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
    rtol: f64,
    atol: f64,
) -> Result<(), String> {
    let model = Model::load(model_path).map_err(|e| format!("import: {e}"))?;
    let names = model.plan.input_names();
    if names.len() != inputs.len() {
        return Err(format!(
            "model has {} inputs, test gives {}",
            names.len(),
            inputs.len()
        ));
    }
    let backend = CpuBackend::new(2);
    let got = model
        .plan
        .run(&backend, names.into_iter().zip(inputs).collect())
        .map_err(|e| format!("run: {e}"))?;
    if got.len() < outputs.len() {
        return Err(format!("{} outputs, expected {}", got.len(), outputs.len()));
    }
    for (k, ((_, g), w)) in got.iter().zip(&outputs).enumerate() {
        compare(g, w, rtol, atol).map_err(|e| format!("output {k}: {e}"))?;
    }
    Ok(())
}

fn ops_of(path: &Path) -> Vec<String> {
    let Ok(bytes) = std::fs::read(path) else {
        return vec![];
    };
    let Ok(m) = ModelProto::decode(bytes.as_slice()) else {
        return vec![];
    };
    let mut ops: Vec<String> = m
        .graph
        .map(|g| {
            g.node
                .iter()
                .map(|n| {
                    if n.domain.is_empty() || n.domain == "ai.onnx" {
                        n.op_type.clone()
                    } else {
                        format!("{}.{}", n.domain, n.op_type)
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    ops.sort();
    ops.dedup();
    ops
}

fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for i in 0.. {
        let p = dir.join(format!("{prefix}_{i}.pb"));
        if !p.exists() {
            break;
        }
        v.push(p);
    }
    v
}

fn guarded(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("PANIC: {msg}"))
    })
}

#[test]
#[ignore = "needs COTENANT_PYTHON: run cargo xtask test"]
fn onnx_backend_test_data() {
    let site = common::py("import onnx, os; print(os.path.dirname(onnx.__file__))");
    let data = Path::new(&site).join("backend/test/data");
    let filter = std::env::var("CONFORMANCE_FILTER").unwrap_or_default();
    let mut cases: Vec<Case> = Vec::new();
    for suite in ["node", "pytorch-converted", "pytorch-operator"] {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(data.join(suite))
            .expect("suite dir")
            .flatten()
            .map(|e| e.path())
            .collect();
        dirs.sort();
        for dir in dirs {
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !name.contains(&filter) {
                continue;
            }
            let model = dir.join("model.onnx");
            let ops = ops_of(&model);
            let supported =
                !ops.is_empty() && ops.iter().all(|o| SUPPORTED_OPS.contains(&o.as_str()));
            let set = dir.join("test_data_set_0");
            let result = guarded(|| {
                let inputs = numbered(&set, "input")
                    .iter()
                    .map(|p| read_pb(p))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("input: {e}"))?;
                let outputs = numbered(&set, "output")
                    .iter()
                    .map(|p| read_pb(p))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("expected output: {e}"))?;
                run_case(&model, inputs, outputs, 1e-3, 1e-5)
            });
            cases.push(Case {
                suite,
                name,
                ops,
                supported,
                result,
            });
        }
    }
    let mut light: Vec<PathBuf> = std::fs::read_dir(data.join("light"))
        .expect("light dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    light.sort();
    for model in light {
        let name = model
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !name.contains(&filter) {
            continue;
        }
        let ops = ops_of(&model);
        let supported = ops.iter().all(|o| SUPPORTED_OPS.contains(&o.as_str()));
        let result = guarded(|| {
            // The runner feeds light models arange(n)/n in the declared shape (see onnx's backend runner).
            let m =
                ModelProto::decode(std::fs::read(&model).map_err(|e| e.to_string())?.as_slice())
                    .map_err(|e| e.to_string())?;
            let g = m.graph.ok_or("no graph")?;
            let inits: Vec<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
            let mut inputs = Vec::new();
            for vi in g.input.iter().filter(|i| !inits.contains(&i.name.as_str())) {
                let shape: Vec<usize> = vi
                    .r#type
                    .as_ref()
                    .and_then(|t| t.tensor_type.as_ref())
                    .and_then(|t| t.shape.as_ref())
                    .map(|s| {
                        s.dim
                            .iter()
                            .map(|d| match d.value {
                                Some(cotenant_executor::proto::DimValue::DimValue(v)) => {
                                    v.max(1) as usize
                                }
                                _ => 1,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let n: usize = shape.iter().product();
                inputs.push(
                    Tensor::f32(
                        shape,
                        (0..n).map(|i| (i as f64 / n as f64) as f32).collect(),
                    )
                    .map_err(|e| e.to_string())?,
                );
            }
            let out = model.with_file_name(format!("{name}_output_0.pb"));
            run_case(&model, inputs, vec![read_pb(&out)?], 1e-3, 1e-5)
        });
        cases.push(Case {
            suite: "light",
            name,
            ops,
            supported,
            result,
        });
    }
    // The report.
    let mut md = String::from(
        "# ONNX backend conformance\n\nGenerated by `executor/tests/conformance.rs` (run by `cargo xtask test`) from the test data in the onnx 1.22.0 wheel. `supported` = every operator of the case is one the executor implements; only those cases count.\n\n",
    );
    let mut by_suite: BTreeMap<&str, (usize, usize, usize, usize)> = BTreeMap::new();
    for c in &cases {
        let e = by_suite.entry(c.suite).or_default();
        if c.supported {
            e.0 += 1;
            if c.result.is_ok() {
                e.1 += 1;
            } else if allowed(&c.name).is_some() {
                e.2 += 1;
            }
        } else {
            e.3 += 1;
        }
    }
    md.push_str("| suite | supported cases | pass | allow-listed failures | unsupported (skipped) |\n|---|---|---|---|---|\n");
    for (s, (n, p, a, u)) in &by_suite {
        md.push_str(&format!("| {s} | {n} | {p} | {a} | {u} |\n"));
    }
    md.push_str("\n## Supported cases\n\n| suite | case | result |\n|---|---|---|\n");
    let mut unexpected = Vec::new();
    for c in cases.iter().filter(|c| c.supported) {
        let r = match (&c.result, allowed(&c.name)) {
            (Ok(()), _) => "pass".to_string(),
            (Err(e), Some(why)) => format!("allowed failure: {why} ({})", e.replace('|', "/")),
            (Err(e), None) => {
                unexpected.push(format!("{}/{}: {e}", c.suite, c.name));
                format!("**FAIL**: {}", e.replace('|', "/"))
            }
        };
        md.push_str(&format!("| {} | {} | {} |\n", c.suite, c.name, r));
    }
    md.push_str("\n## Cases skipped for unsupported operators\n\n");
    let mut missing: BTreeMap<String, usize> = BTreeMap::new();
    for c in cases.iter().filter(|c| !c.supported) {
        for o in c
            .ops
            .iter()
            .filter(|o| !SUPPORTED_OPS.contains(&o.as_str()))
        {
            *missing.entry(o.clone()).or_default() += 1;
        }
    }
    md.push_str(
        &missing
            .iter()
            .map(|(o, n)| format!("{o} ({n})"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    md.push('\n');
    if filter.is_empty() {
        std::fs::write(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("CONFORMANCE.md"),
            md,
        )
        .expect("write CONFORMANCE.md");
    }
    assert!(
        unexpected.is_empty(),
        "{} supported cases failed:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
}
