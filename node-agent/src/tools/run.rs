//! `cotenant-agent run`: runs a model once on .npy inputs and writes every output as .npy.

use anyhow::Context;
use clap::Args;
use cotenant_executor::{CpuBackend, npy};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The ONNX model.
    #[arg(long)]
    pub model: PathBuf,
    /// An input as NAME=path.npy (repeat for several inputs).
    #[arg(long = "input", value_name = "NAME=PATH")]
    pub inputs: Vec<String>,
    /// Folder for the outputs, one `<name>.npy` each.
    #[arg(long)]
    pub output_dir: PathBuf,
    /// Threads to use (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// File name for an output: anything but letters, digits, `.`, `_`, `-` becomes `_`.
pub fn file_name(output: &str) -> String {
    let s: String = output
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    // Never let a name like ".." escape the folder.
    if s.chars().all(|c| c == '.') {
        format!("_{s}")
    } else {
        s
    }
}

pub fn main(a: RunArgs) -> anyhow::Result<()> {
    let model = super::load_model(&a.model, cotenant_executor::Target::Cpu)?;
    let inputs = super::read_inputs(&a.inputs)?;
    let backend = CpuBackend::new(a.threads.unwrap_or_else(super::default_threads));
    let outputs = model
        .plan
        .run(&backend, inputs)
        .context("running the model")?;
    std::fs::create_dir_all(&a.output_dir)
        .with_context(|| format!("creating {}", a.output_dir.display()))?;
    for (name, t) in outputs {
        let path = a.output_dir.join(format!("{}.npy", file_name(&name)));
        npy::write(&path, &t).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn output_names_become_safe_file_names() {
        assert_eq!(super::file_name("logits:0/a b"), "logits_0_a_b");
        assert_eq!(super::file_name(".."), "_..");
        assert_eq!(super::file_name("out-1.x_y"), "out-1.x_y");
    }
}
