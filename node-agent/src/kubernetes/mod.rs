//! Kubernetes mode: the agent pod watches its own GpuAgent, serves the assigned tenants as
//! `<namespace>.<name>` over the Open Inference Protocol, answers the operator's `/report` after a
//! TokenReview, writes its status and renews its Lease. Losing the API server stops none of the serving.

pub mod auth;
mod identity;
mod lease;
mod reconcile;
mod secrets;
mod status;
mod watch;

use crate::registry::Registry;
use crate::serve::{self, AppState, ReportAuth};
use anyhow::Context;
use cotenant_crds::GpuAgent;
use cotenant_executor::Device;
use cotenant_executor::runtime::CoSchedule;
use kube::api::Api;
use reconcile::{Done, Reconciler};
use status::Snapshot;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{mpsc, watch as channel};

/// Options of `cotenant-agent kubernetes`.
pub struct Options {
    pub listen: String,
    pub grpc_listen: String,
    pub admin_listen: String,
    pub advertise_address: Option<String>,
    pub admin_advertise_address: Option<String>,
    pub threads: usize,
    /// How long the agent keeps serving after SIGTERM while not ready, so the operator takes it
    /// out of its tenants' EndpointSlices before it stops accepting.
    pub drain: std::time::Duration,
    pub report_audience: String,
    pub report_reader: Option<String>,
    /// The co-schedule every tenant joins (`--schedule`), if any.
    pub co: Option<Arc<CoSchedule>>,
    /// Where the tenants compute (`--device`), or why the GPU asked for cannot be used.
    pub device: Result<Device, String>,
    /// Host memory each tenant's model may hold (`--tenant-memory-limit`).
    pub tenant_memory_limit: u64,
    /// Bytes requests may hold, and their deadlines.
    pub budget: Arc<serve::budget::Budget>,
    pub limits: serve::Limits,
    pub connections: serve::ConnectionLimits,
    /// Where models may come from (`--model-root`, the model cache).
    pub sources: crate::load::Sources,
}

/// Serves until SIGTERM or Ctrl-C; then drains: reports itself not ready (its readiness probe and
/// its GpuAgent status) while serving on for `drain`, so the operator and kube-proxy stop sending
/// it requests first; then stops accepting, finishes the accepted requests and exits.
pub async fn run(options: Options) -> anyhow::Result<()> {
    crate::load::install_crypto_provider();
    // No default: trusting a ServiceAccount name from any namespace would let anyone who can
    // create that account in their own namespace read every tenant's report.
    let reader = options
        .report_reader
        .filter(|r| !r.trim().is_empty())
        .context(
            "COTENANT_REPORT_READER (--report-reader) is not set: the agent accepts /report \
             only from one exact user, e.g. system:serviceaccount:cotenant-system:cotenant-operator, \
             which the operator sets on the agent pods it creates",
        )?;
    let listener = crate::bind(&options.listen).await?;
    let grpc_listener = crate::bind(&options.grpc_listen).await?;
    let admin_listener = crate::bind(&options.admin_listen).await?;
    let identity = identity::from_env(
        |key| std::env::var(key).ok(),
        identity::Bound {
            listen: listener.local_addr()?,
            grpc: grpc_listener.local_addr()?,
            admin: admin_listener.local_addr()?,
        },
        options.advertise_address,
        options.admin_advertise_address,
    )
    .map_err(anyhow::Error::msg)?;
    let client = kube::Client::try_default()
        .await
        .context("cannot build a Kubernetes client (in-cluster config or KUBECONFIG)")?;
    tracing::info!(
        gpuagent = %format!("{}/{}", identity.namespace, identity.name),
        address = %identity.address,
        grpc_address = %identity.grpc_address,
        admin_address = %identity.admin_address,
        audience = %options.report_audience,
        reader = ?reader,
        "starting in Kubernetes mode"
    );
    let registry = Arc::new(Registry::default());
    let app = Arc::new(AppState {
        registry: registry.clone(),
        report_auth: ReportAuth::TokenReview(Arc::new(auth::Reviewer::new(
            client.clone(),
            options.report_audience,
            reader,
        ))),
        initialised: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        budget: options.budget,
        limits: options.limits,
    });
    let sources = options.sources.with_secrets(Arc::new(secrets::Reader {
        api: Api::namespaced(client.clone(), &identity.namespace),
        namespace: identity.namespace.clone(),
    }));
    let leases = Api::namespaced(client.clone(), &identity.namespace);
    let agents: Api<GpuAgent> = Api::namespaced(client, &identity.namespace);
    // A pod given a GPU that cannot use it fails loudly: not Ready with the reason in its status
    // (the operator turns it into an Event on the pool), then a non-zero exit, never serving on
    // the CPU in the GPU's place.
    let device = match options.device {
        Ok(d) => d,
        Err(why) => {
            tracing::error!(reason = %why, "the GPU this agent was started for cannot be used");
            let s = status::device_unavailable(&identity, &why);
            if let Err(e) = status::write_once(agents, &identity, &s).await {
                tracing::warn!(error = %e, "cannot write the GpuAgent status");
            }
            anyhow::bail!("{why}");
        }
    };
    crate::nvml::start_for(&device);

    let (draining_tx, draining_rx) = channel::channel(false);
    let (stop_tx, stop_rx) = channel::channel(false);
    let (desired_tx, desired_rx) = channel::channel(None);
    let (snapshot_tx, snapshot_rx) = channel::channel(Snapshot::default());
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let (uid_tx, uid_rx) = channel::channel(None);
    tokio::spawn(watch::watch_own(
        agents.clone(),
        identity.name.clone(),
        desired_tx,
        uid_tx,
    ));
    tokio::spawn(lease::renew_loop(
        leases,
        identity.name.clone(),
        uid_rx,
        stop_rx.clone(),
    ));
    let reconciler = Reconciler::new(
        registry,
        options.threads,
        options.co.clone(),
        device.clone(),
        options.tenant_memory_limit,
        Arc::new(sources),
        done_tx,
    );
    let reconciling = tokio::spawn(reconcile_loop(
        reconciler,
        desired_rx,
        done_rx,
        snapshot_tx,
        app.clone(),
        stop_rx.clone(),
    ));
    let writing = tokio::spawn(status::write_loop(
        agents,
        identity.clone(),
        status::device(&device, options.threads),
        snapshot_rx,
        draining_rx,
    ));

    let (signalled, drain) = (app.clone(), options.drain);
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        signalled.draining.store(true, Ordering::Release);
        let _ = draining_tx.send(true);
        tracing::info!(
            seconds = drain.as_secs_f64(),
            "draining: not ready, serving until the endpoints drop this agent"
        );
        tokio::time::sleep(drain).await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut stop: channel::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let inference = serve::serve(
        listener,
        serve::inference_router(app.clone()),
        options.connections,
        serve::Protocol::Http1,
        stopped(stop_rx.clone()),
    );
    let grpc = serve::serve(
        grpc_listener,
        serve::grpc_router(app.clone()),
        options.connections,
        serve::Protocol::Http2,
        stopped(stop_rx.clone()),
    );
    let admin = serve::serve(
        admin_listener,
        serve::admin_router(app),
        options.connections,
        serve::Protocol::Http1,
        stopped(stop_rx.clone()),
    );
    tokio::join!(inference, grpc, admin);

    // Every accepted request has its answer; finish what the tenants still hold and exit.
    let tenants = reconciling.await.unwrap_or_default();
    // The writer's last word (Ready False) is bounded by its own timeout.
    let _ = writing.await;
    tokio::task::spawn_blocking(move || {
        for tenant in tenants {
            tenant.shutdown();
        }
    })
    .await
    .context("draining the tenants failed")?;
    tracing::info!("stopped");
    Ok(())
}

/// Applies assignment changes and finished jobs, publishing a snapshot after each, until `stop`;
/// returns the replicas still serving.
async fn reconcile_loop(
    mut reconciler: Reconciler,
    mut desired: channel::Receiver<Option<reconcile::Desired>>,
    mut done: mpsc::UnboundedReceiver<Done>,
    snapshots: channel::Sender<Snapshot>,
    app: Arc<AppState>,
    mut stop: channel::Receiver<bool>,
) -> Vec<Arc<cotenant_executor::runtime::Tenant>> {
    loop {
        tokio::select! {
            Ok(()) = desired.changed() => {
                let next = desired.borrow_and_update().clone();
                if let Some(next) = next {
                    reconciler.apply(next);
                }
            }
            Some(finished) = done.recv() => reconciler.on_done(finished),
            _ = stop.wait_for(|s| *s) => break,
        }
        if reconciler.initialised {
            app.initialised.store(true, Ordering::Release);
        }
        snapshots.send_replace(Snapshot {
            initialised: reconciler.initialised,
            generation: reconciler.generation,
            tenants: reconciler.tenants(),
            settled: reconciler.settled(),
            weight_bytes: reconciler.weight_bytes(),
        });
    }
    reconciler.take_all()
}
