//! `cotenant-agent`: the process that owns one GPU (or the CPU) and serves its tenants.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod credentials;
mod device;
mod dnnscaler;
mod kubernetes;
mod load;
mod nvml;
mod registry;
mod schedule;
mod serve;
mod standalone;
mod tools;

/// Large buffers on cache lines, for the kernels' 64-byte loads (see `line_alloc`).
#[global_allocator]
static ALLOC: cotenant_kernels::line_alloc::LineAligned = cotenant_kernels::line_alloc::LineAligned;

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
        /// Address to serve the Open Inference Protocol over gRPC on (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:8001")]
        grpc_listen: String,
        /// CPU threads shared by all tenants (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// File holding the bearer token `/report` requires; without it `/report` answers 401.
        #[arg(long)]
        report_token_file: Option<PathBuf>,
        /// How the tenants share the device: `multi-stream` (every instance issues freely),
        /// `sequential` (one operator at a time across tenants) or `gacer` (operators resized
        /// and ordered by a plan searched for the tenants loaded).
        #[arg(long, default_value = "multi-stream", value_parser = schedule::parse)]
        schedule: schedule::ScheduleKind,
        #[command(flatten)]
        device: device::DeviceArgs,
        /// Host memory one tenant's model may hold: its weights plus the activations of the
        /// largest batch it may run (bytes, or with a suffix: 512Mi, 4Gi). A model that needs
        /// more is refused at load with the numbers; a request that would take it further
        /// fails alone (400).
        #[arg(long, env = "COTENANT_TENANT_MEMORY_LIMIT", default_value = load::DEFAULT_TENANT_MEMORY_LIMIT, value_parser = load::parse_memory)]
        tenant_memory_limit: u64,
        /// What moves the knobs: `dnnscaler`, or a peer to compare with: `aimd` (Clipper's
        /// additive increase, ×0.9 decrease) or `static:<batch>x<instances>`.
        #[arg(long, default_value = "dnnscaler", value_parser = dnnscaler::parse_knob_policy)]
        knob_policy: cotenant_policy::Strategy,
        #[command(flatten)]
        requests: serve::RequestArgs,
        #[command(flatten)]
        sources: SourceArgs,
        /// Log as JSON lines instead of text.
        #[arg(long)]
        log_json: bool,
        /// Send spans (loads, requests) to this OpenTelemetry collector over OTLP/HTTP, e.g.
        /// `http://otel-collector:4318`; without it, no spans leave the process.
        #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
        otlp_endpoint: Option<String>,
    },
    /// Run inside Kubernetes as an agent pod: watch this pod's GpuAgent and serve its assignments.
    ///
    /// Identity from the downward API: POD_NAME (also the GpuAgent's name), POD_NAMESPACE,
    /// NODE_NAME and POD_IP.
    Kubernetes {
        /// Address to serve the Open Inference Protocol (HTTP) on.
        #[arg(long, default_value = "0.0.0.0:8000")]
        listen: String,
        /// Address to serve the Open Inference Protocol over gRPC on.
        #[arg(long, default_value = "0.0.0.0:8001")]
        grpc_listen: String,
        /// Address to serve `/metrics` and `/report` on.
        #[arg(long, default_value = "0.0.0.0:8002")]
        admin_listen: String,
        /// `host:port` written as the status address (default: `$POD_IP:<listen port>`).
        #[arg(long)]
        advertise_address: Option<String>,
        /// `host:port` written as the status admin address (default: `$POD_IP:<admin port>`).
        #[arg(long)]
        admin_advertise_address: Option<String>,
        /// CPU threads shared by all tenants (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// Seconds the agent keeps serving after SIGTERM while it reports itself not ready, so
        /// its tenants' endpoints drop it before it stops accepting (the operator gives its pods
        /// a termination grace period of this plus 20 s).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=300))]
        drain_seconds: u64,
        /// How the tenants share the device: `multi-stream` (every instance issues freely),
        /// `sequential` (one operator at a time across tenants) or `gacer` (operators resized
        /// and ordered by a plan searched for the tenants loaded).
        #[arg(long, default_value = "multi-stream", value_parser = schedule::parse)]
        schedule: schedule::ScheduleKind,
        #[command(flatten)]
        device: device::DeviceArgs,
        /// Host memory one tenant's model may hold: its weights plus the activations of the
        /// largest batch it may run (bytes, or with a suffix: 512Mi, 4Gi). A model that needs
        /// more is refused at load with the numbers; a request that would take it further
        /// fails alone (400).
        #[arg(long, env = "COTENANT_TENANT_MEMORY_LIMIT", default_value = load::DEFAULT_TENANT_MEMORY_LIMIT, value_parser = load::parse_memory)]
        tenant_memory_limit: u64,
        /// Audience a `/report` token must be issued for.
        #[arg(
            long,
            env = "COTENANT_REPORT_AUDIENCE",
            default_value = cotenant_crds::report::REPORT_AUDIENCE
        )]
        report_audience: String,
        /// The only user allowed to read `/report`, exactly, e.g.
        /// `system:serviceaccount:cotenant-system:cotenant-operator`. Required: the operator sets
        /// it on the agent pods it creates.
        #[arg(long, env = "COTENANT_REPORT_READER")]
        report_reader: Option<String>,
        /// A directory whose files `file://` models may name (a model volume's mount point);
        /// repeat it, or separate several with `:`. Without any, `file://` models are refused.
        #[arg(
            long = "model-root",
            env = "COTENANT_MODEL_ROOTS",
            value_delimiter = ':'
        )]
        model_roots: Vec<PathBuf>,
        #[command(flatten)]
        requests: serve::RequestArgs,
        #[command(flatten)]
        sources: SourceArgs,
        /// Log as JSON lines instead of text.
        #[arg(long)]
        log_json: bool,
        /// Send spans (loads, requests) to this OpenTelemetry collector over OTLP/HTTP, e.g.
        /// `http://otel-collector:4318`; without it, no spans leave the process.
        #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
        otlp_endpoint: Option<String>,
    },
    /// Write a model-zoo architecture as an ONNX file with seeded weights, or list the zoo.
    Zoo(tools::zoo::ZooArgs),
    /// Run a model once on .npy inputs and write each output as DIR/<name>.npy.
    Run(tools::run::RunArgs),
    /// Measure a model's throughput and latency percentiles on this machine (CPU or GPU).
    Bench(tools::bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A cap the kernels cannot read would be ignored: refuse it before anything runs.
    cotenant_kernels::isa::cap_from_env().map_err(anyhow::Error::msg)?;
    match cli.command {
        Command::Standalone {
            tenants,
            listen,
            grpc_listen,
            threads,
            report_token_file,
            schedule,
            device,
            tenant_memory_limit,
            knob_policy,
            requests,
            sources,
            log_json,
            otlp_endpoint,
        } => {
            let _telemetry = init_logs(log_json, otlp_endpoint.as_deref())?;
            let report_token = match report_token_file {
                Some(path) => Some(
                    std::fs::read_to_string(&path)
                        .with_context(|| {
                            format!("cannot read --report-token-file {}", path.display())
                        })?
                        .trim()
                        .to_string(),
                ),
                None => None,
            };
            let threads = threads.unwrap_or_else(tools::default_threads);
            let device = device.choose()?;
            let options = standalone::Options {
                tenants,
                listen,
                grpc_listen,
                threads,
                report_token,
                knob_policy,
                budget: requests.budget(),
                limits: requests.limits(),
                connections: requests.connections(),
                sources: load::Sources::standalone(&sources.downloads()?)
                    .map_err(anyhow::Error::msg)?,
                co: schedule::start(schedule, threads, &device),
                device,
                tenant_memory_limit,
            };
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("cannot start the async runtime")?
                .block_on(standalone::run(options))
        }
        Command::Kubernetes {
            listen,
            grpc_listen,
            admin_listen,
            advertise_address,
            admin_advertise_address,
            threads,
            drain_seconds,
            schedule,
            device,
            tenant_memory_limit,
            report_audience,
            report_reader,
            model_roots,
            requests,
            sources,
            log_json,
            otlp_endpoint,
        } => {
            let _telemetry = init_logs(log_json, otlp_endpoint.as_deref())?;
            let threads = threads.unwrap_or_else(tools::default_threads);
            // A GPU that cannot be used is reported in the GpuAgent status before the agent exits.
            let device = device.choose_or_why()?;
            let sources = load::Sources::kubernetes(&model_roots, &sources.downloads()?)
                .map_err(anyhow::Error::msg)?;
            let options = kubernetes::Options {
                listen,
                grpc_listen,
                admin_listen,
                advertise_address,
                admin_advertise_address,
                threads,
                drain: std::time::Duration::from_secs(drain_seconds),
                report_audience,
                report_reader,
                budget: requests.budget(),
                limits: requests.limits(),
                connections: requests.connections(),
                sources,
                co: device
                    .as_ref()
                    .ok()
                    .and_then(|d| schedule::start(schedule, threads, d)),
                device,
                tenant_memory_limit,
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            let result = runtime.block_on(kubernetes::run(options));
            // A download or profile still running belongs to nobody now: do not wait for it.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            result
        }
        Command::Zoo(args) => tools::zoo::main(args),
        Command::Run(args) => tools::run::main(args),
        Command::Bench(args) => tools::bench::main(args),
    }
}

/// Where models are fetched to and how many at once.
#[derive(clap::Args, Debug, Clone)]
struct SourceArgs {
    /// Directory under which the model cache lives when --model-cache-dir is not given.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    download_dir: PathBuf,
    /// The model cache: every downloaded model (http(s)://, s3://, gs://, az://) of every
    /// tenant, kept once checked against its sha256 and shared by the tenants that name the
    /// same model at the same place with the same credentials [default: DOWNLOAD_DIR/cotenant-models].
    #[arg(long)]
    model_cache_dir: Option<PathBuf>,
    /// Bytes the model cache may hold (e.g. 16Gi); the least recently used models go first.
    #[arg(long, default_value = load::DEFAULT_MODEL_CACHE_MAX_BYTES, value_parser = load::parse_memory)]
    model_cache_max_bytes: u64,
    /// Seconds of silence in a model download before it fails.
    #[arg(long, default_value_t = load::DEFAULT_READ_TIMEOUT.as_secs_f64())]
    download_read_timeout: f64,
    /// Models fetched and loading at once; the others wait.
    #[arg(long, default_value_t = load::DEFAULT_CONCURRENT_LOADS as u64, value_parser = clap::value_parser!(u64).range(1..=64))]
    max_concurrent_loads: u64,
}

impl SourceArgs {
    fn downloads(&self) -> anyhow::Result<load::Downloads> {
        let timeout = self.download_read_timeout;
        if !(timeout.is_finite() && timeout > 0.0 && timeout <= 3600.0) {
            anyhow::bail!("--download-read-timeout {timeout}: use seconds in (0, 3600]");
        }
        Ok(load::Downloads {
            cache_dir: self
                .model_cache_dir
                .clone()
                .unwrap_or_else(|| self.download_dir.join("cotenant-models")),
            cache_max_bytes: self.model_cache_max_bytes,
            read_timeout: std::time::Duration::from_secs_f64(timeout),
            concurrent_loads: self.max_concurrent_loads as usize,
        })
    }
}

/// Logs to stdout (and spans to a collector, with `otlp_endpoint`) until the guard is dropped.
fn init_logs(json: bool, otlp_endpoint: Option<&str>) -> anyhow::Result<cotenant_telemetry::Guard> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("COTENANT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    load::install_crypto_provider();
    cotenant_telemetry::init(cotenant_telemetry::Settings {
        service: "cotenant-agent",
        filter,
        json,
        // Colours only on a terminal: a pod's or a test's log file gets plain text.
        ansi: std::io::IsTerminal::is_terminal(&std::io::stdout()),
        otlp_endpoint,
    })
}

/// Resolves on SIGTERM (the kubelet stopping the pod) or Ctrl-C.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = terminate => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    tracing::info!("shutting down: finishing accepted requests");
}

/// A listener on `addr`, or an error naming it.
async fn bind(addr: &str) -> anyhow::Result<tokio::net::TcpListener> {
    use anyhow::Context;
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}
