//! Input dimensions as real exporters write them. PyTorch, tf2onnx and paddle2onnx mark unknown
//! axes with `?`, empty names, `dim_value: -1` or nothing, and sometimes give several axes of one
//! input the same name. As in onnxruntime, only concrete dimensions constrain an input; every
//! such axis is free on its own. Hostile declarations are import errors naming input and axis.

mod common;

use common::proto::{D, int_attr, value_info, value_info_dims};
use cotenant_executor::proto::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, ValueInfoProto,
};
use cotenant_executor::{CpuBackend, Data, Model, RunError, Tensor};
use prost::Message;

fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: output.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

fn model(inputs: Vec<ValueInfoProto>, nodes: Vec<NodeProto>, inits: Vec<TensorProto>) -> Vec<u8> {
    let out = nodes.last().map(|n| n.output[0].clone()).unwrap();
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            node: nodes,
            initializer: inits,
            input: inputs,
            output: vec![value_info(&out, 1, &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn relu_of(dims: &[D]) -> Vec<u8> {
    model(
        vec![value_info_dims("x", 1, dims)],
        vec![node("Relu", &["x"], "y")],
        vec![],
    )
}

fn run(m: &Model, inputs: Vec<(&str, Tensor)>) -> Result<Vec<Tensor>, RunError> {
    let named = inputs
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect();
    Ok(m.plan
        .run(&CpuBackend::new(1), named)?
        .into_iter()
        .map(|(_, t)| t)
        .collect())
}

fn ramp(shape: &[usize]) -> Tensor {
    let n = shape.iter().product::<usize>();
    Tensor::f32(shape.to_vec(), (0..n).map(|i| i as f32 - 3.0).collect()).unwrap()
}

#[test]
fn unknown_axes_take_any_size_each() {
    let spellings: [(&str, [D; 4]); 5] = [
        ("?", [D::P("?"), D::V(3), D::P("?"), D::P("?")]),
        ("empty", [D::P(""), D::V(3), D::P(""), D::P("")]),
        ("-1", [D::V(-1), D::V(3), D::V(-1), D::V(-1)]),
        ("none", [D::None, D::V(3), D::None, D::None]),
        // One name for batch, height and width, as some exporters write it.
        ("one name", [D::P("N"), D::V(3), D::P("N"), D::P("N")]),
    ];
    for (what, dims) in spellings {
        let m = Model::from_bytes(&relu_of(&dims)).unwrap_or_else(|e| panic!("{what}: {e}"));
        for shape in [[1, 3, 4, 7], [2, 3, 5, 1], [3, 3, 2, 2]] {
            let y = run(&m, vec![("x", ramp(&shape))]).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(y[0].shape, shape, "{what}");
        }
        // The concrete axis still binds.
        let e = run(&m, vec![("x", ramp(&[1, 4, 2, 2]))]).unwrap_err();
        assert!(matches!(e, RunError::BadInput { .. }), "{what}: {e}");
    }
}

#[test]
fn height_and_width_named_alike_stay_free() {
    // [N, C, H, W] with H and W both named "size": a 4x6 image runs, and the symbols of the
    // input are its own, so shape folding assumes nothing about H and W.
    let m = Model::from_bytes(&relu_of(&[
        D::P("batch"),
        D::V(3),
        D::P("size"),
        D::P("size"),
    ]))
    .unwrap();
    let y = run(&m, vec![("x", ramp(&[2, 3, 4, 6]))]).unwrap();
    assert_eq!(y[0].shape, vec![2, 3, 4, 6]);
    assert_eq!(y[0].as_f32().unwrap()[..5], [0.0, 0.0, 0.0, 0.0, 1.0]);
}

#[test]
fn axes_named_alike_are_not_folded_as_equal() {
    // x: [?, ?, 4]; y = Shape(Reshape(x, [d1, d1, -1])) with d1 = Shape(x)[1]. Were the two `?`
    // one symbol, the -1 would fold to 4; it is 4 * d0 / d1.
    let gather = NodeProto {
        attribute: vec![int_attr("axis", 0)],
        ..node("Gather", &["s", "one"], "d1")
    };
    let concat = NodeProto {
        attribute: vec![int_attr("axis", 0)],
        ..node("Concat", &["d1", "d1", "minus1"], "target")
    };
    let i64s = |name: &str, v: &[i64]| TensorProto {
        name: name.into(),
        dims: vec![v.len() as i64],
        data_type: 7,
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let bytes = model(
        vec![value_info_dims("x", 1, &[D::P("?"), D::P("?"), D::V(4)])],
        vec![
            node("Shape", &["x"], "s"),
            gather,
            concat,
            node("Reshape", &["x", "target"], "r"),
            node("Shape", &["r"], "y"),
        ],
        vec![i64s("one", &[1]), i64s("minus1", &[-1])],
    );
    let m = Model::from_bytes(&bytes).unwrap();
    let y = run(&m, vec![("x", ramp(&[2, 1, 4]))]).unwrap();
    assert_eq!(y[0].data, Data::I64(vec![1, 1, 8]));
    let y = run(&m, vec![("x", ramp(&[3, 3, 4]))]).unwrap();
    assert_eq!(y[0].data, Data::I64(vec![3, 3, 4]));
}

#[test]
fn a_name_shared_by_two_inputs_binds_them() {
    let bytes = model(
        vec![
            value_info_dims("a", 1, &[D::P("batch"), D::V(2)]),
            value_info_dims("b", 1, &[D::P("batch"), D::V(2)]),
        ],
        vec![node("Add", &["a", "b"], "y")],
        vec![],
    );
    let m = Model::from_bytes(&bytes).unwrap();
    let y = run(&m, vec![("a", ramp(&[3, 2])), ("b", ramp(&[3, 2]))]).unwrap();
    assert_eq!(y[0].shape, vec![3, 2]);
    let e = run(&m, vec![("a", ramp(&[3, 2])), ("b", ramp(&[1, 2]))]).unwrap_err();
    assert!(
        matches!(&e, RunError::BadInput { name, .. } if name == "b"),
        "{e}"
    );
}

#[test]
fn hostile_declared_dimensions_are_import_errors() {
    let cases: [(&str, Vec<D>); 6] = [
        ("-2", vec![D::V(1), D::V(-2)]),
        ("i64::MIN", vec![D::V(i64::MIN), D::V(3)]),
        ("i64::MAX", vec![D::V(1), D::V(i64::MAX)]),
        ("2^31", vec![D::V(1 << 31)]),
        ("product over the limit", vec![D::V(1 << 16), D::V(1 << 16)]),
        (
            "product over the limit past a zero",
            vec![D::V(0), D::V(1 << 20), D::V(1 << 20)],
        ),
    ];
    for (what, dims) in cases {
        let e = Model::from_bytes(&relu_of(&dims))
            .err()
            .unwrap_or_else(|| panic!("{what}: imported"));
        let msg = e.to_string();
        assert!(
            msg.contains("input \"x\", axis") && msg.contains("dimension"),
            "{what}: {msg}"
        );
    }
    // Zero-sized and limit-sized declarations are valid.
    for dims in [vec![D::V(0), D::P("?")], vec![D::V(1 << 15), D::V(1 << 15)]] {
        Model::from_bytes(&relu_of(&dims)).unwrap();
    }
    let m = Model::from_bytes(&relu_of(&[D::V(0), D::P("?")])).unwrap();
    let y = run(&m, vec![("x", ramp(&[0, 5]))]).unwrap();
    assert_eq!(y[0].shape, vec![0, 5]);
}
