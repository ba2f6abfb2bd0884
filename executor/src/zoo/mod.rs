//! The model zoo: writes standard architectures as ONNX files with seeded random weights, a
//! symbolic `batch` dimension, and reports parameters and FLOPs per sample.

mod bert;
pub(crate) mod builder;
mod cnn;

pub use bert::BertOptions;
pub use builder::Rng;

use crate::proto::ModelProto;
use crate::tensor::DType;
use builder::{Builder, value_info};
use cnn::Feat;
use prost::Message;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ZooError {
    #[error(
        "unknown zoo model {0:?}; known: resnet18, resnet50, vgg16, mobilenet_v2, squeezenet, bert"
    )]
    Unknown(String),
    #[error("bad options: {0}")]
    Options(String),
    #[error("writing {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

pub const NAMES: &[&str] = &[
    "resnet18",
    "resnet50",
    "vgg16",
    "mobilenet_v2",
    "squeezenet",
    "bert",
];

#[derive(Clone, Debug, Default)]
pub struct ZooOptions {
    pub seed: u64,
    pub bert: BertOptions,
}

/// What `list()` reports per model.
#[derive(Clone, Debug, PartialEq)]
pub struct ZooInfo {
    pub name: &'static str,
    pub params: u64,
    /// Floating-point operations per sample (2 per multiply-accumulate of Conv/Gemm/MatMul).
    pub flops: u64,
    pub input: String,
}

fn build_inner(name: &str, o: &ZooOptions, dry: bool) -> Result<(ModelProto, Builder), ZooError> {
    let mut b = Builder::new(o.seed, dry);
    let image = Feat {
        name: "input".into(),
        c: 3,
        h: 224,
        w: 224,
    };
    let (out, inputs, outputs, opset) = match name {
        "bert" => {
            let bo = &o.bert;
            if bo.heads == 0 || !bo.hidden.is_multiple_of(bo.heads) || bo.layers == 0 || bo.seq == 0
            {
                return Err(ZooError::Options(format!(
                    "hidden {} must be a positive multiple of heads {}; layers and seq positive",
                    bo.hidden, bo.heads
                )));
            }
            let out = bert::bert(&mut b, bo);
            (
                out,
                vec![value_info("input_ids", DType::I64, &[None, Some(bo.seq)])],
                vec![value_info(
                    "last_hidden_state",
                    DType::F32,
                    &[None, Some(bo.seq), Some(bo.hidden)],
                )],
                17,
            )
        }
        _ => {
            let out = match name {
                "resnet18" => cnn::resnet(&mut b, &image, 18),
                "resnet50" => cnn::resnet(&mut b, &image, 50),
                "vgg16" => cnn::vgg16(&mut b, &image),
                "mobilenet_v2" => cnn::mobilenet_v2(&mut b, &image),
                "squeezenet" => cnn::squeezenet(&mut b, &image),
                other => return Err(ZooError::Unknown(other.into())),
            };
            (
                out,
                vec![value_info(
                    "input",
                    DType::F32,
                    &[None, Some(3), Some(224), Some(224)],
                )],
                vec![value_info("output", DType::F32, &[None, Some(1000)])],
                13,
            )
        }
    };
    let out_name = outputs[0].name.clone();
    b.node_rename_last(&out, &out_name);
    let params = b.params;
    let macs = b.macs;
    let mut model =
        std::mem::replace(&mut b, Builder::new(0, true)).finish(name, opset, inputs, outputs);
    model.doc_string = format!("cotenant zoo {name}, seed {}", o.seed);
    b.params = params;
    b.macs = macs;
    Ok((model, b))
}

/// Builds a zoo model with seeded weights.
pub fn build(name: &str, o: &ZooOptions) -> Result<ModelProto, ZooError> {
    build_inner(name, o, false).map(|(m, _)| m)
}

/// Builds and serialises a zoo model to `path`.
pub fn write(name: &str, o: &ZooOptions, path: &std::path::Path) -> Result<ZooInfo, ZooError> {
    let (m, b) = build_inner(name, o, false)?;
    std::fs::write(path, m.encode_to_vec()).map_err(|source| ZooError::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(info(name, &b))
}

fn info(name: &str, b: &Builder) -> ZooInfo {
    let name = NAMES.iter().find(|n| **n == name).copied().unwrap_or("?");
    let input = if name == "bert" {
        "input_ids: int64 [batch, seq]".into()
    } else {
        "input: float32 [batch, 3, 224, 224]".into()
    };
    ZooInfo {
        name,
        params: b.params,
        flops: 2 * b.macs,
        input,
    }
}

/// Every zoo model with its parameter count and FLOPs per sample (default options).
pub fn list() -> Vec<ZooInfo> {
    NAMES
        .iter()
        .filter_map(|n| {
            build_inner(n, &ZooOptions::default(), true)
                .ok()
                .map(|(_, b)| info(n, &b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_reports_known_sizes() {
        let l = list();
        let get = |n: &str| l.iter().find(|i| i.name == n).cloned().unwrap();
        // Published sizes: ResNet-50 25.6M params / ~4.1 GMACs, VGG-16 138M, MobileNetV2 3.5M, BERT-base ~110M.
        assert!((25_000_000..26_000_000).contains(&get("resnet50").params));
        assert!((3_900_000_000..4_200_000_000).contains(&(get("resnet50").flops / 2)));
        assert!((138_000_000..139_000_000).contains(&get("vgg16").params));
        assert!((3_400_000..3_600_000).contains(&get("mobilenet_v2").params));
        assert!((108_000_000..112_000_000).contains(&get("bert").params));
        assert!((11_000_000..12_000_000).contains(&get("resnet18").params));
    }

    #[test]
    fn small_models_import_and_run_at_two_batch_sizes() {
        let o = ZooOptions {
            seed: 3,
            bert: BertOptions {
                layers: 2,
                hidden: 64,
                heads: 4,
                seq: 16,
                vocab: 100,
            },
        };
        for name in ["bert", "squeezenet"] {
            let bytes = build(name, &o).unwrap().encode_to_vec();
            let m = crate::Model::from_bytes(&bytes).unwrap();
            let be = crate::CpuBackend::new(2);
            for batch in [1, 3] {
                let inputs = if name == "bert" {
                    vec![(
                        "input_ids".to_string(),
                        crate::Tensor::i64(
                            vec![batch, 16],
                            (0..batch as i64 * 16).map(|i| i % 100).collect(),
                        )
                        .unwrap(),
                    )]
                } else {
                    m.plan.example_inputs(batch)
                };
                let out = m.plan.run(&be, inputs).unwrap();
                assert_eq!(out[0].1.shape[0], batch);
                assert!(out[0].1.as_f32().unwrap().iter().all(|v| v.is_finite()));
            }
            assert!(m.plan.weight_bytes() > 0);
            assert!(
                m.plan.peak_activation_bytes(4).unwrap() > m.plan.peak_activation_bytes(1).unwrap()
            );
        }
    }
}
