//! Hostile and wrong inputs: truncated, bit-flipped and random model bytes never panic or
//! allocate what a header claims; wrong input names, shapes and types at run time are errors.

use cotenant_executor::proto::{ModelProto, TensorProto};
use cotenant_executor::zoo::{self, BertOptions, ZooOptions};
use cotenant_executor::{CpuBackend, Data, ImportError, Model, RunError, Tensor};
use proptest::prelude::*;
use prost::Message;
use std::sync::OnceLock;

/// A tiny but complete model (BERT-style: Gather, MatMul, LayerNorm, Softmax, Reshape, ...).
fn tiny_bert() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let o = ZooOptions {
            seed: 1,
            bert: BertOptions {
                layers: 1,
                hidden: 8,
                heads: 2,
                seq: 4,
                vocab: 10,
            },
        };
        zoo::build("bert", &o).unwrap().encode_to_vec()
    })
}

/// Imports and, when that succeeds, runs once: either may fail, neither may panic.
fn import_and_run(bytes: &[u8]) {
    if let Ok(m) = Model::from_bytes(bytes) {
        let _ = m.plan.peak_activation_bytes(1);
        let _ = m.plan.run(&CpuBackend::new(1), m.plan.example_inputs(2));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        import_and_run(&bytes);
    }

    #[test]
    fn truncated_models_never_panic(cut in 0usize..100_000) {
        let b = tiny_bert();
        import_and_run(&b[..cut % b.len()]);
    }

    #[test]
    fn bit_flipped_models_never_panic(flips in proptest::collection::vec((any::<usize>(), 0u8..8), 1..8)) {
        let mut b = tiny_bert().to_vec();
        for (pos, bit) in flips {
            let n = b.len();
            b[pos % n] ^= 1 << bit;
        }
        import_and_run(&b);
    }
}

#[test]
fn the_tiny_model_itself_runs() {
    let m = Model::from_bytes(tiny_bert()).unwrap();
    let out = m
        .plan
        .run(&CpuBackend::new(1), m.plan.example_inputs(3))
        .unwrap();
    assert_eq!(out[0].1.shape, vec![3, 4, 8]);
}

#[test]
fn huge_declared_tensor_is_refused_without_allocating() {
    let mut m = ModelProto::decode(tiny_bert()).unwrap();
    let g = m.graph.as_mut().unwrap();
    // 2^40 floats declared, no data: must be an error, not a 4 TiB allocation.
    g.initializer.push(TensorProto {
        dims: vec![1 << 20, 1 << 20],
        data_type: 1,
        name: "huge".into(),
        ..Default::default()
    });
    match Model::from_bytes(&m.encode_to_vec()) {
        Err(ImportError::BadTensor { name, .. }) => assert_eq!(name, "huge"),
        other => panic!("expected a BadTensor error, got {:?}", other.err()),
    }
    let mut m = ModelProto::decode(tiny_bert()).unwrap();
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        dims: vec![-3],
        data_type: 1,
        name: "neg".into(),
        ..Default::default()
    });
    assert!(Model::from_bytes(&m.encode_to_vec()).is_err());
}

#[test]
fn unsupported_operator_names_node_op_and_opset() {
    let mut m = ModelProto::decode(tiny_bert()).unwrap();
    m.graph.as_mut().unwrap().node[0].op_type = "Frobnicate".into();
    let err = Model::from_bytes(&m.encode_to_vec())
        .err()
        .expect("must fail");
    let msg = err.to_string();
    assert!(matches!(err, ImportError::UnsupportedOp { .. }), "{msg}");
    assert!(
        msg.contains("Frobnicate") && msg.contains("opset 17"),
        "{msg}"
    );
}

#[test]
fn wrong_inputs_at_run_time_are_errors() {
    let m = Model::from_bytes(tiny_bert()).unwrap();
    let be = CpuBackend::new(1);
    let ids = |shape: Vec<usize>| {
        Tensor::new(shape.clone(), Data::I64(vec![1; shape.iter().product()])).unwrap()
    };
    assert!(matches!(
        m.plan.run(&be, vec![("nope".into(), ids(vec![1, 4]))]),
        Err(RunError::UnknownInput { .. })
    ));
    assert!(matches!(
        m.plan.run(&be, vec![]),
        Err(RunError::MissingInput(_))
    ));
    assert!(matches!(
        m.plan.run(&be, vec![("input_ids".into(), ids(vec![1, 5]))]),
        Err(RunError::BadInput { .. })
    ));
    assert!(matches!(
        m.plan.run(&be, vec![("input_ids".into(), ids(vec![4]))]),
        Err(RunError::BadInput { .. })
    ));
    let floats = Tensor::f32(vec![1, 4], vec![0.0; 4]).unwrap();
    assert!(matches!(
        m.plan.run(&be, vec![("input_ids".into(), floats)]),
        Err(RunError::BadInput { .. })
    ));
    // Token ids outside the vocabulary fail inside Gather, naming the node.
    let bad = Tensor::new(vec![1, 4], Data::I64(vec![0, 1, 99, 2])).unwrap();
    assert!(matches!(
        m.plan.run(&be, vec![("input_ids".into(), bad)]),
        Err(RunError::Node { .. })
    ));
}
