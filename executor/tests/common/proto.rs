//! ONNX protobuf pieces the hand-built test models share.

use cotenant_executor::proto::{
    DimValue, Dimension, TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto,
};

/// A graph input or output of element type `elem`; a negative dimension is the symbolic batch.
pub fn value_info(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(if d < 0 {
                                DimValue::DimParam("batch".into())
                            } else {
                                DimValue::DimValue(d)
                            }),
                            denotation: String::new(),
                        })
                        .collect(),
                }),
            }),
            denotation: String::new(),
        }),
        doc_string: String::new(),
    }
}
