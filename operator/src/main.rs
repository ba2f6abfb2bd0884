//! `cotenant-operator`: places tenants on GPU agents, rescales them with DNNScaler, sizes the
//! GPU pools and routes each tenant's Service to the agents that serve it.

mod apply;
mod context;
mod control;
mod credentials;
mod decide;
mod http;
mod leader;
mod manifests;
mod metrics;
mod ratelimit;
mod reason;
mod report;
mod world;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use kube::runtime::events::{Recorder, Reporter};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    /// Send spans (rounds, writes) to this OpenTelemetry collector over OTLP/HTTP, e.g.
    /// `http://otel-collector:4318`; without it, no spans leave the process.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Namespace the operator runs in: its leader Lease lives there.
    #[arg(long, env = "POD_NAMESPACE", default_value = "cotenant-system")]
    namespace: String,
    /// Namespaces agents may run in (comma-separated), where the operator holds a Role for
    /// pods and GpuAgents; a GpuPool naming another namespace is refused. Default: `--namespace`.
    #[arg(long, env = "COTENANT_AGENT_NAMESPACES", value_delimiter = ',')]
    agent_namespaces: Vec<String>,
    /// This replica's identity in leader election (the pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// The operator's ServiceAccount (in `--namespace`), the only reader agents allow on
    /// `/report`; the chart sets it.
    #[arg(
        long,
        env = "COTENANT_SERVICE_ACCOUNT",
        default_value = "cotenant-operator"
    )]
    service_account: String,
    /// File with the token the operator presents to agents' `/report` (a projected
    /// ServiceAccount token with the agents' audience; re-read every round).
    #[arg(long, env = "COTENANT_REPORT_TOKEN_FILE")]
    report_token_file: Option<PathBuf>,
    /// Audience of that token; agent pods are told to require it.
    #[arg(
        long,
        env = "COTENANT_REPORT_TOKEN_AUDIENCE",
        default_value = cotenant_crds::report::REPORT_AUDIENCE
    )]
    report_audience: String,
    /// Seconds an agent may fail its report while its pod runs before it is replaced.
    #[arg(long, env = "COTENANT_AGENT_DEAD_AFTER", default_value_t = 45.0)]
    agent_dead_after_seconds: f64,
    /// The operator's API calls a second on average (watches excluded); 0: no limit.
    #[arg(long, env = "COTENANT_API_QPS", default_value_t = 100.0)]
    api_qps: f64,
    /// The operator's API calls at once before `--api-qps` spaces them.
    #[arg(long, env = "COTENANT_API_BURST", default_value_t = 200)]
    api_burst: u32,
    /// Most objects the operator writes at once within a round, all within `--api-qps`.
    #[arg(long, env = "COTENANT_CONCURRENT_WRITES", default_value_t = 16)]
    concurrent_writes: usize,
    /// Most agents' reports scraped at once; each has a 2 s timeout.
    #[arg(long, env = "COTENANT_SCRAPE_CONCURRENCY", default_value_t = 64)]
    scrape_concurrency: usize,
    /// Seconds a tenant keeps a replica it no longer needs before letting it go.
    #[arg(
        long,
        env = "COTENANT_REPLICA_SCALE_DOWN_DELAY",
        default_value_t = 60.0
    )]
    replica_scale_down_seconds: f64,
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
    // One TLS provider for the whole binary: ring, as kube uses (the span exporter too).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let _telemetry = cotenant_telemetry::init(cotenant_telemetry::Settings {
        service: "cotenant-operator",
        filter,
        json: matches!(args.log_format, LogFormat::Json),
        ansi: std::io::IsTerminal::is_terminal(&std::io::stdout()),
        otlp_endpoint: args.otlp_endpoint.as_deref(),
    })?;

    let config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration: run in a pod or set KUBECONFIG")?;
    let client =
        kube::Client::try_from(config.clone()).context("cannot build a Kubernetes client")?;
    // Writes get their own client that gives up on a silent API server: a write must end
    // before a successor can lead (see `leader`).
    let mut write_config = config;
    write_config.read_timeout = Some(leader::WRITE_GRACE);
    write_config.reset_reader_on_write = true;
    let write_client =
        kube::Client::try_from(write_config).context("cannot build a Kubernetes client")?;
    let context = Arc::new(context::Context::new());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, "serving /metrics, /healthz and /readyz");
    let server = tokio::spawn(http::serve(listener, context.clone()));

    let identity = args.identity.clone().unwrap_or_else(|| {
        format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "operator".into()),
            std::process::id()
        )
    });
    let agent_namespaces: BTreeSet<String> = if args.agent_namespaces.is_empty() {
        BTreeSet::from([args.namespace.clone()])
    } else {
        args.agent_namespaces
            .iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect()
    };
    tracing::info!(?agent_namespaces, "agents may run in these namespaces");
    let world = world::World::watch(&client, &agent_namespaces);
    let fence = Arc::new(leader::Fence::default());
    let writer = apply::Writer {
        client: write_client.clone(),
        fence: fence.clone(),
        recorder: Recorder::new(
            write_client.clone(),
            Reporter {
                controller: "cotenant-operator".into(),
                instance: Some(identity.clone()),
            },
        ),
        report_audience: args.report_audience.clone(),
        written_routes: Default::default(),
        limit: ratelimit::RateLimit::new(args.api_qps, args.api_burst),
        concurrent_writes: args.concurrent_writes,
        status_written: Default::default(),
        // What the budget writes in about one round.
        paced_per_round: if args.api_qps > 0.0 {
            ((args.api_qps * control::ROUND.as_secs_f64()) as usize).max(16)
        } else {
            usize::MAX
        },
        report_reader: format!(
            "system:serviceaccount:{}:{}",
            args.namespace, args.service_account
        ),
    };
    let scraper = report::Scraper::new(
        args.report_token_file.clone(),
        Duration::from_secs(2),
        args.scrape_concurrency,
    )?;
    let leadership = Arc::new(leader::Leadership::new(
        write_client,
        &args.namespace,
        identity,
    ));
    let mut controller = control::Controller::new(
        context.clone(),
        world,
        writer,
        scraper,
        agent_namespaces,
        decide::Tuning {
            dead_after_s: args.agent_dead_after_seconds,
            replica_scale_down_s: args.replica_scale_down_seconds,
        },
    );

    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    tokio::select! {
        _ = controller.world.synced() => {}
        _ = &mut shutdown => { server.abort(); return Ok(()); }
    }
    context.set_ready();
    tracing::info!(identity = %leadership.identity, "watches synced; seeking leadership");
    let (elector, mut terms) = leader::spawn(leadership.clone(), fence.clone());
    // The term this replica last acted in: a new term starts from the API, not from memory.
    let mut acting_in: Option<u64> = None;
    loop {
        let term = fence.current_term();
        if term != acting_in {
            match term {
                Some(_) => tracing::info!("became the leader"),
                None => tracing::warn!("no longer the leader; standing by"),
            }
            controller.reset();
            acting_in = term;
        }
        context.set_leader(term.is_some());
        if term.is_some() {
            controller.round().await;
        }
        let changed = controller.world.changed.clone();
        tokio::select! {
            _ = &mut shutdown => break,
            _ = changed.notified() => {
                // Let a burst of changes settle into one round.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ = terms.changed() => {}
            _ = tokio::time::sleep(control::ROUND) => {}
        }
    }
    elector.abort();
    leadership.release(&fence).await;
    context.set_leader(false);
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
