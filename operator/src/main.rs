//! `cotenant-operator`: watches ModelTenants and GpuPools, and (as it grows) places tenants on GPU
//! agents, rescales them with DNNScaler and sizes the pools.

mod context;
mod http;
mod tenant_controller;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use std::net::SocketAddr;
use std::sync::Arc;

/// The cotenant operator: serves many DNN models on shared GPUs and holds each to its latency SLO.
#[derive(Parser, Debug)]
#[command(name = "cotenant-operator", version, about, long_about = None)]
struct Args {
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080", env = "COTENANT_LISTEN")]
    listen: SocketAddr,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "COTENANT_LOG_FORMAT")]
    log_format: LogFormat,
    /// Log filter, e.g. `info` or `cotenant_operator=debug,kube=info`.
    #[arg(long, default_value = "info", env = "COTENANT_LOG_LEVEL")]
    log_level: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("invalid --log-level {:?}", args.log_level))?;
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }

    let client = kube::Client::try_default()
        .await
        .context("no Kubernetes configuration: run in a pod or set KUBECONFIG")?;
    let context = Arc::new(context::Context::new(client));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, "serving /metrics, /healthz and /readyz");
    let server = tokio::spawn(http::serve(listener, context.clone()));

    tenant_controller::run(context, shutdown_signal()).await;
    server.abort();
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGTERM (the kubelet stopping the pod) or Ctrl-C.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops the operator");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = terminate => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    tracing::info!("shutting down");
}
