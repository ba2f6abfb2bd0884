//! `cotenant-agent`: the process that owns one GPU (or the CPU) and serves its tenants.

use anyhow::bail;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod tools;

/// The cotenant agent: runs many inference models on one GPU and holds each to its latency SLO.
#[derive(Parser, Debug)]
#[command(name = "cotenant-agent", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the ModelTenant YAML files in a directory over the Open Inference Protocol, without Kubernetes.
    Standalone {
        /// Directory of ModelTenant YAML files.
        #[arg(long, default_value = "examples")]
        tenants: PathBuf,
        /// Address to serve the Open Inference Protocol (HTTP) on.
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: String,
    },
    /// Run inside Kubernetes as an agent pod: watch this pod's GpuAgent and serve its assignments.
    Kubernetes,
    /// Write a model-zoo architecture as an ONNX file with seeded weights, or list the zoo.
    Zoo(tools::zoo::ZooArgs),
    /// Run a model once on .npy inputs and write each output as DIR/<name>.npy.
    Run(tools::run::RunArgs),
    /// Measure a model's throughput and latency percentiles on this machine's CPU.
    Bench(tools::bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Standalone { tenants, listen } => bail!(
            "standalone serving is not built yet (issue: node agent); would serve {} on {listen}",
            tenants.display()
        ),
        Command::Kubernetes => bail!("Kubernetes mode is not built yet (issue: node agent)"),
        Command::Zoo(args) => tools::zoo::main(args),
        Command::Run(args) => tools::run::main(args),
        Command::Bench(args) => tools::bench::main(args),
    }
}
