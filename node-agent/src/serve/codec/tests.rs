use super::*;
use crate::registry::TensorMeta;
use crate::serve::budget::Budget;
use axum::http::StatusCode;
use cotenant_executor::graph::{Dim, GraphInput};
use cotenant_executor::tensor::{bf16, f16};
use cotenant_executor::{Data, Tensor};

fn input(name: &str, dtype: DType, dims: Option<Vec<Dim>>) -> GraphInput {
    GraphInput {
        value: 0,
        name: name.to_string(),
        dtype,
        dims,
    }
}

fn output(name: &str) -> TensorMeta {
    TensorMeta {
        name: name.to_string(),
        datatype: "FP32".to_string(),
        shape: vec![-1],
    }
}

/// A model with one input `x` (FP32, any shape unless `dims`) and one output `y`.
struct Model {
    inputs: Vec<GraphInput>,
    outputs: Vec<TensorMeta>,
}

impl Model {
    fn one(dtype: DType, dims: Option<Vec<Dim>>) -> Model {
        Model {
            inputs: vec![input("x", dtype, dims)],
            outputs: vec![output("y")],
        }
    }

    fn sig(&self) -> Signature<'_> {
        Signature {
            inputs: &self.inputs,
            outputs: &self.outputs,
        }
    }
}

/// Reserves nothing: for tests of everything but the budget.
fn unlimited(_: u64) -> Result<(), ApiError> {
    Ok(())
}

/// Decodes a JSON-only body.
fn json(model: &Model, body: &str) -> Result<InferRequest, ApiError> {
    decode_request(body.as_bytes(), None, &model.sig(), unlimited)
}

/// Decodes a JSON header followed by `tail`.
fn binary(model: &Model, header: &str, tail: &[u8]) -> Result<InferRequest, ApiError> {
    let mut body = header.as_bytes().to_vec();
    body.extend_from_slice(tail);
    decode_request(&body, Some(header.len()), &model.sig(), unlimited)
}

fn f32_data(r: &InferRequest) -> &[f32] {
    r.inputs[0].1.as_f32().expect("f32")
}

#[test]
fn json_nested_and_flat_decode_alike() {
    let model = Model::one(DType::F32, None);
    let nested = json(
        &model,
        r#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4]]}]}"#,
    )
    .expect("nested");
    let flat = json(
        &model,
        r#"{"id":"a","inputs":[{"data":[1,2,3,4],"name":"x","shape":[2,2],"datatype":"FP32"}]}"#,
    )
    .expect("flat, data before datatype");
    assert_eq!(nested.inputs[0].1, flat.inputs[0].1);
    assert_eq!(f32_data(&flat), &[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(flat.id.as_deref(), Some("a"));
    let deep = json(
        &model,
        r#"{"inputs":[{"name":"x","shape":[2,1,2],"datatype":"FP32","data":[[[1,2]],[[3,4]]]}]}"#,
    )
    .expect("nested three deep");
    assert_eq!(f32_data(&deep), &[1.0, 2.0, 3.0, 4.0]);
    let scalar = json(
        &model,
        r#"{"inputs":[{"name":"x","shape":[],"datatype":"FP32","data":2.5}]}"#,
    )
    .expect("a rank-0 tensor");
    assert_eq!(f32_data(&scalar), &[2.5]);
}

#[test]
fn every_datatype_decodes_from_json_and_binary() {
    let cases: &[(DType, &str, &str, Data, Vec<u8>)] = &[
        (
            DType::Bool,
            "BOOL",
            "[true,false]",
            Data::Bool(vec![true, false]),
            vec![1, 0],
        ),
        (
            DType::U8,
            "UINT8",
            "[0,255]",
            Data::U8(vec![0, 255]),
            vec![0, 255],
        ),
        (
            DType::I8,
            "INT8",
            "[-128,127]",
            Data::I8(vec![-128, 127]),
            vec![0x80, 0x7f],
        ),
        (
            DType::I32,
            "INT32",
            "[-1,7]",
            Data::I32(vec![-1, 7]),
            [(-1i32).to_le_bytes(), 7i32.to_le_bytes()].concat(),
        ),
        (
            DType::I64,
            "INT64",
            "[-7,1099511627776]",
            Data::I64(vec![-7, 1 << 40]),
            [(-7i64).to_le_bytes(), (1i64 << 40).to_le_bytes()].concat(),
        ),
        (
            DType::I16,
            "INT16",
            "[-32768,300]",
            Data::I16(vec![i16::MIN, 300]),
            [i16::MIN.to_le_bytes(), 300i16.to_le_bytes()].concat(),
        ),
        (
            DType::U16,
            "UINT16",
            "[65535,2]",
            Data::U16(vec![u16::MAX, 2]),
            [u16::MAX.to_le_bytes(), 2u16.to_le_bytes()].concat(),
        ),
        (
            DType::U32,
            "UINT32",
            "[4294967295,0]",
            Data::U32(vec![u32::MAX, 0]),
            [u32::MAX.to_le_bytes(), 0u32.to_le_bytes()].concat(),
        ),
        (
            DType::U64,
            "UINT64",
            "[18446744073709551615,1]",
            Data::U64(vec![u64::MAX, 1]),
            [u64::MAX.to_le_bytes(), 1u64.to_le_bytes()].concat(),
        ),
        (
            DType::F64,
            "FP64",
            "[0.5,-3]",
            Data::F64(vec![0.5, -3.0]),
            [0.5f64.to_le_bytes(), (-3f64).to_le_bytes()].concat(),
        ),
        (
            DType::F16,
            "FP16",
            "[1,-2]",
            Data::F16(vec![f16::from_f32(1.0), f16::from_f32(-2.0)]),
            vec![0x00, 0x3c, 0x00, 0xc0],
        ),
        (
            DType::BF16,
            "BF16",
            "[1,-2]",
            Data::BF16(vec![bf16::from_f32(1.0), bf16::from_f32(-2.0)]),
            vec![0x80, 0x3f, 0x00, 0xc0],
        ),
    ];
    for (dtype, wire, data, want, bytes) in cases {
        let model = Model::one(*dtype, None);
        let r = json(
            &model,
            &format!(
                r#"{{"inputs":[{{"name":"x","shape":[2],"datatype":"{wire}","data":{data}}}]}}"#
            ),
        )
        .unwrap_or_else(|e| panic!("{wire} JSON: {}", e.message));
        assert_eq!(&r.inputs[0].1.data, want, "{wire} JSON");
        let header = format!(
            r#"{{"inputs":[{{"name":"x","shape":[2],"datatype":"{wire}","parameters":{{"binary_data_size":{}}}}}]}}"#,
            bytes.len()
        );
        let r = binary(&model, &header, bytes).unwrap_or_else(|e| panic!("{wire}: {}", e.message));
        assert_eq!(&r.inputs[0].1.data, want, "{wire} binary");
    }
    // Integers outside their datatype's range are refused, never wrapped.
    for (dtype, wire, data) in [
        (DType::I16, "INT16", "[32768]"),
        (DType::U16, "UINT16", "[-1]"),
        (DType::U32, "UINT32", "[4294967296]"),
        (DType::U64, "UINT64", "[-1]"),
    ] {
        let body = format!(
            r#"{{"inputs":[{{"name":"x","shape":[1],"datatype":"{wire}","data":{data}}}]}}"#
        );
        let e = json(&Model::one(dtype, None), &body).expect_err(wire);
        assert!(e.message.contains("does not fit"), "{wire}: {}", e.message);
    }
    // An FP16 number beyond its range, and the wrong float type for the model, are refused.
    let half = Model::one(DType::F16, None);
    let big = r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP16","data":[70000]}]}"#;
    assert!(json(&half, big).is_err());
    let wrong = r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#;
    let e = json(&half, wrong).expect_err("FP32 for an FP16 input");
    assert!(e.message.contains("expects FP16"), "{}", e.message);
}

#[test]
fn binary_tensors_decode_at_any_offset() {
    let model = Model {
        inputs: vec![
            input("a", DType::I8, None),
            input("b", DType::F32, None),
            input("c", DType::I64, None),
        ],
        outputs: vec![output("y")],
    };
    // An INT8 input of 3 bytes first, so the FP32 and INT64 data start unaligned.
    let header = r#"{"inputs":[
        {"name":"a","shape":[3],"datatype":"INT8","parameters":{"binary_data_size":3}},
        {"name":"b","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}},
        {"name":"c","shape":[2],"datatype":"INT64","parameters":{"binary_data_size":16}}],
        "outputs":[{"name":"y","parameters":{"binary_data":true}}]}"#;
    let mut tail = vec![1u8, 0xff, 3];
    for v in [1.5f32, -0.25] {
        tail.extend(v.to_le_bytes());
    }
    for v in [-7i64, 1 << 40] {
        tail.extend(v.to_le_bytes());
    }
    let r = binary(&model, header, &tail).expect("binary");
    assert_eq!(r.inputs[1].1.as_f32().expect("f32"), &[1.5, -0.25]);
    assert_eq!(r.inputs[2].1.data, Data::I64(vec![-7, 1 << 40]));
    assert_eq!(r.outputs, vec![("y".to_string(), true)]);
}

/// Every way a request can be wrong gets 400 (or 413 for a shape past the element limit) and a
/// reason, before any of its data is decoded.
#[test]
fn hostile_requests_get_a_4xx_naming_the_problem() {
    let model = Model::one(
        DType::F32,
        Some(vec![Dim::Symbol("n".into()), Dim::Fixed(2)]),
    );
    let x = |shape: &str, dtype: &str, data: &str| {
        format!(
            r#"{{"inputs":[{{"name":"x","shape":{shape},"datatype":"{dtype}","data":{data}}}]}}"#
        )
    };
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let cases: Vec<(String, &str)> = vec![
        ("{".into(), "malformed"),
        ("".into(), "malformed"),
        ("[]".into(), "malformed"),
        (r#"{"inputs":{}}"#.into(), "malformed"),
        (x("[-1,2]", "FP32", "[]"), "negative"),
        (x("[1,2]", "FP32", "[1]"), "needs 2"),
        (x("[1,2]", "FP32", "[1,2,3]"), "more elements"),
        (x("[1,2]", "FP32", r#"[1,"a"]"#), "a number, a boolean"),
        (x("[1,2]", "FP32", "[1,null]"), "a number, a boolean"),
        (x("[1,2]", "FP32", "[1,true]"), "does not fit"),
        (x("[1,2]", "FP32", "[1,1e39]"), "does not fit"),
        (x("[1,2]", "FP32", r#"{"a":1}"#), "a number, a boolean"),
        (x("[1,2]", "BYTES", r#"["a","b"]"#), "not supported"),
        (x("[1,2]", "FLOAT", "[1,2]"), "unknown datatype"),
        (x("[1,2]", "INT64", "[1,2]"), "the model expects FP32"),
        (x("[1,3]", "FP32", "[1,2,3]"), "does not fit the model's [n, 2]"),
        (x("[1,2,1]", "FP32", "[1,2]"), "does not fit the model's [n, 2]"),
        // Ragged, wrongly nested, or nested deeper than the shape.
        (x("[2,2]", "FP32", "[[1,2],[3]]"), "axis 1"),
        (x("[2,2]", "FP32", "[[1,2],3,4]"), "ragged"),
        (x("[2,2]", "FP32", "[1,2,[3,4]]"), "nested deeper"),
        (x("[2,2]", "FP32", "[[[1],[2]],[[3],[4]]]"), "nested deeper"),
        (x("[2,2]", "FP32", "[[1,2,3,4]]"), "axis 1"),
        (x("[2,2]", "FP32", "[[1,2]]"), "axis 0"),
        (x("[2,2]", "FP32", &deep), "data"),
        // A shape that asks for far more than the data can hold, or that overflows.
        (x("[100000000,2]", "FP32", "[1,2]"), "cannot hold"),
        (x("[4294967296,4294967296,2]", "FP32", "[]"), "count"),
        // Names: twice, unknown, missing; outputs unknown or twice.
        (
            r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]},{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}]}"#.into(),
            "given twice",
        ),
        (
            r#"{"inputs":[{"name":"z","shape":[1,2],"datatype":"FP32","data":[1,2]}]}"#.into(),
            "unknown input",
        ),
        (r#"{"inputs":[]}"#.into(), "was not given"),
        (
            r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}],"outputs":[{"name":"nope"}]}"#.into(),
            "unknown output",
        ),
        (
            r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}],"outputs":[{"name":"y"},{"name":"y"}]}"#.into(),
            "asked for twice",
        ),
        // Duplicate keys, data and binary at once, neither, bounds on lists.
        (
            r#"{"inputs":[{"name":"x","name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}]}"#.into(),
            "duplicate field",
        ),
        (
            r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2],"parameters":{"binary_data_size":8}}]}"#.into(),
            "both",
        ),
        (r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32"}]}"#.into(), "neither"),
        (x(&format!("[{}]", vec!["1"; 40].join(",")), "FP32", "[1]"), "at most 32"),
        (
            r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2],"parameters":{"binary_data_size":-1}}]}"#.into(),
            "malformed",
        ),
    ];
    for (body, says) in &cases {
        let e = json(&model, body).expect_err(says);
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{says}: {}", e.message);
        assert!(e.message.contains(says), "{says}: {}", e.message);
    }
    let huge = x("[1048576,1048576,1048576]", "FP32", "[]");
    let e = json(&Model::one(DType::F32, None), &huge).expect_err("huge");
    assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
    let bad_utf8 =
        b"{\"inputs\":[{\"name\":\"\xff\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}";
    let e = decode_request(bad_utf8, None, &model.sig(), unlimited).expect_err("utf-8");
    assert!(e.message.contains("malformed"), "{}", e.message);
}

#[test]
fn binary_framing_lies_get_400() {
    let model = Model::one(DType::F32, None);
    let header = |size: i64| {
        format!(
            r#"{{"inputs":[{{"name":"x","shape":[2],"datatype":"FP32","parameters":{{"binary_data_size":{size}}}}}]}}"#
        )
    };
    let eight = [0u8; 8];
    for (header, tail, says) in [
        (header(8), &eight[..4], "truncated"),
        (header(4), &eight[..4], "does not match"),
        (header(8), &[0u8; 12][..], "follow the JSON"),
    ] {
        let e = binary(&model, &header, tail).expect_err(says);
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{says}");
        assert!(e.message.contains(says), "{says}: {}", e.message);
    }
    // No binary input, yet bytes after the JSON.
    let e = binary(
        &model,
        r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#,
        &[1, 2],
    )
    .expect_err("extra");
    assert!(e.message.contains("follow the JSON"), "{}", e.message);
    // The header length past the body, or not a number.
    let e = decode_request(b"{}", Some(9), &model.sig(), unlimited).expect_err("past");
    assert!(e.message.contains("exceeds the body"), "{}", e.message);
    for bad in ["-1", "x", "", "1e3", "99999999999999999999999"] {
        let e = header_length(Some(bad.as_bytes()), None).expect_err(bad);
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(
        header_length(Some(b" 12 "), Some(20)).expect("ok"),
        Some(12)
    );
    let e = header_length(Some(b"21"), Some(20)).expect_err("past the declared body");
    assert!(e.message.contains("exceeds the body"), "{}", e.message);
}

#[test]
fn decoded_tensors_are_reserved_before_they_are_allocated() {
    let model = Model::one(DType::I64, None);
    let body = r#"{"inputs":[{"name":"x","shape":[4],"datatype":"INT64","data":[1,2,3,4]}]}"#;
    let budget = Budget::new(1 << 20, 1 << 20);
    let mut held = budget.open("t");
    decode_request(body.as_bytes(), None, &model.sig(), |n| held.grow(n)).expect("decodes");
    assert_eq!(held.bytes(), 32, "four INT64 elements");
    // A budget too small for the decoded tensors refuses before decoding.
    let tiny = Budget::new(1 << 20, 1 << 20);
    let mut full = tiny.open("t");
    full.grow((1 << 20) - 16).expect("fill the budget");
    let mut held = tiny.open("t");
    let e =
        decode_request(body.as_bytes(), None, &model.sig(), |n| held.grow(n)).expect_err("full");
    assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn outputs_encode_as_json_or_binary() {
    let t = Tensor::f32(vec![2], vec![1.5, f32::NAN]).expect("t");
    let z = Tensor {
        shape: vec![2],
        data: Data::I64(vec![-2, 1 << 40]),
    };
    let outputs = vec![("y".to_string(), t), ("z".to_string(), z)];
    let (body, header_len) =
        encode_response("m", Some("req-1"), &outputs, &[], false).expect("encode");
    assert_eq!(header_len, None);
    let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(json["id"], "req-1");
    assert_eq!(json["model_name"], "m");
    assert_eq!(json["outputs"][0]["data"], serde_json::json!([1.5, null]));
    assert_eq!(
        json["outputs"][1]["data"],
        serde_json::json!([-2, 1u64 << 40])
    );

    let requested = vec![("z".to_string(), true)];
    let (body, header_len) =
        encode_response("m", None, &outputs, &requested, false).expect("encode");
    let header_len = header_len.expect("binary follows");
    let json: serde_json::Value = serde_json::from_slice(&body[..header_len]).expect("JSON");
    assert_eq!(json["outputs"].as_array().map(Vec::len), Some(1), "only z");
    assert_eq!(json["outputs"][0]["parameters"]["binary_data_size"], 16);
    assert!(json["outputs"][0].get("data").is_none());
    let want: Vec<u8> = [-2i64, 1 << 40]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    assert_eq!(&body[header_len..], &want[..]);
}
