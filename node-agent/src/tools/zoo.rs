//! `cotenant-agent zoo`: writes a model-zoo architecture as an ONNX file, or lists the zoo.

use anyhow::{Context, bail};
use clap::Args;
use cotenant_executor::zoo::{self, BertOptions, ZooOptions};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ZooArgs {
    /// Model to write: resnet18, resnet50, vgg16, mobilenet_v2, squeezenet, bert.
    pub name: Option<String>,
    /// Where to write the ONNX file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// List the zoo with parameters and FLOPs per sample.
    #[arg(long)]
    pub list: bool,
    /// BERT: encoder layers.
    #[arg(long, default_value_t = 12)]
    pub layers: usize,
    /// BERT: hidden size.
    #[arg(long, default_value_t = 768)]
    pub hidden: usize,
    /// BERT: attention heads.
    #[arg(long, default_value_t = 12)]
    pub heads: usize,
    /// BERT: sequence length.
    #[arg(long, default_value_t = 128)]
    pub seq: usize,
    /// BERT: vocabulary size.
    #[arg(long, default_value_t = 30522)]
    pub vocab: usize,
}

pub fn main(a: ZooArgs) -> anyhow::Result<()> {
    if a.list {
        println!(
            "{:<14} {:>14} {:>16}  input",
            "model", "params", "GFLOPs/sample"
        );
        for i in zoo::list() {
            println!(
                "{:<14} {:>14} {:>16.2}  {}",
                i.name,
                i.params,
                i.flops as f64 / 1e9,
                i.input
            );
        }
        return Ok(());
    }
    let (Some(name), Some(out)) = (a.name, a.out) else {
        bail!("usage: cotenant-agent zoo <name> --out model.onnx [--seed N] | zoo --list")
    };
    let opts = ZooOptions {
        seed: a.seed,
        bert: BertOptions {
            layers: a.layers,
            hidden: a.hidden,
            heads: a.heads,
            seq: a.seq,
            vocab: a.vocab,
        },
    };
    let info =
        zoo::write(&name, &opts, &out).with_context(|| format!("writing zoo model {name}"))?;
    eprintln!(
        "wrote {} ({} params, {:.2} GFLOPs/sample) to {}",
        info.name,
        info.params,
        info.flops as f64 / 1e9,
        out.display()
    );
    Ok(())
}
