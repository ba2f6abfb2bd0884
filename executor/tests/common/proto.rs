//! ONNX protobuf pieces the hand-built test models share.

use cotenant_executor::proto::{
    AttributeProto, DimValue, Dimension, TensorShapeProto, TypeProto, TypeProtoTensor,
    ValueInfoProto, attribute_type,
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

/// A graph output of element type `elem` whose shape is left for the runtime to work out.
pub fn unshaped(name: &str, elem: i32) -> ValueInfoProto {
    let mut vi = value_info(name, elem, &[]);
    if let Some(tt) = vi.r#type.as_mut().and_then(|t| t.tensor_type.as_mut()) {
        tt.shape = None;
    }
    vi
}

/// An INT attribute.
pub fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i: v,
        ..Default::default()
    }
}

/// An INTS attribute.
pub fn ints_attr(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}

/// A FLOAT attribute.
pub fn float_attr(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::FLOAT,
        f: v,
        ..Default::default()
    }
}

/// A STRING attribute.
pub fn string_attr(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::STRING,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// One declared dimension of [`value_info_dims`].
pub enum D {
    /// `dim_value`, negative ones included.
    V(i64),
    /// `dim_param`, empty ones included.
    P(&'static str),
    /// Neither.
    None,
}

/// A graph input or output of element type `elem` with exactly the dimensions `dims`.
pub fn value_info_dims(name: &str, elem: i32, dims: &[D]) -> ValueInfoProto {
    let mut vi = value_info(name, elem, &[]);
    if let Some(shape) = vi
        .r#type
        .as_mut()
        .and_then(|t| t.tensor_type.as_mut())
        .and_then(|t| t.shape.as_mut())
    {
        shape.dim = dims
            .iter()
            .map(|d| Dimension {
                value: match d {
                    D::V(v) => Some(DimValue::DimValue(*v)),
                    D::P(p) => Some(DimValue::DimParam(p.to_string())),
                    D::None => None,
                },
                denotation: String::new(),
            })
            .collect();
    }
    vi
}
