//! The ModelTenant controller: fetch the tenant and its pool, decide its state, write its status.
//! Placement, DNNScaler and routing plug into `decide` as they are built; today it checks the
//! pool reference and says plainly that the tenant awaits placement.

use crate::context::Context;
use cotenant_crds::conditions::set_condition;
use cotenant_crds::{GpuPool, ModelTenant, ModelTenantStatus, TenantPhase};
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

const CONTROLLER: &str = "modeltenant";
const FIELD_MANAGER: &str = "cotenant-operator";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ModelTenant {0} has no namespace")]
    NotNamespaced(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    context: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let tenants = Api::<ModelTenant>::all(context.client.clone());
    let pools = Api::<GpuPool>::all(context.client.clone());
    let controller = Controller::new(tenants, watcher::Config::default());
    let store = controller.store();
    let ready_store = store.clone();
    let ready_context = context.clone();
    // Re-asked every second: the store wakes only its latest waiter, which the controller's own
    // runner replaces.
    tokio::spawn(async move {
        loop {
            match tokio::time::timeout(Duration::from_secs(1), ready_store.wait_until_ready()).await
            {
                Ok(Ok(())) => return ready_context.set_ready(),
                Ok(Err(_)) => return,
                Err(_) => {}
            }
        }
    });
    controller
        // A pool appearing or disappearing changes the tenants that name it.
        .watches(pools, watcher::Config::default(), move |pool| {
            let name = pool.name_any();
            store
                .state()
                .into_iter()
                .filter(|tenant| tenant.spec.pool == name)
                .map(|tenant| ObjectRef::from_obj(&*tenant))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile failed");
            }
        })
        .await;
}

async fn reconcile(tenant: Arc<ModelTenant>, context: Arc<Context>) -> Result<Action, Error> {
    let name = tenant.name_any();
    let namespace = tenant
        .namespace()
        .ok_or_else(|| Error::NotNamespaced(name.clone()))?;
    let pool = Api::<GpuPool>::all(context.client.clone())
        .get_opt(&tenant.spec.pool)
        .await?;

    let status = decide(&tenant, pool.as_ref());
    if tenant.status.as_ref() != Some(&status) {
        tracing::info!(tenant = %format!("{namespace}/{name}"), phase = ?status.phase, "status changed");
        let patch = serde_json::json!({ "status": status });
        Api::<ModelTenant>::namespaced(context.client.clone(), &namespace)
            .patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    context.count(CONTROLLER, "ok");
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// The tenant's next status from what exists; pure, so it is tested without an API server.
fn decide(tenant: &ModelTenant, pool: Option<&GpuPool>) -> ModelTenantStatus {
    let generation = tenant.meta().generation;
    let mut status = tenant.status.clone().unwrap_or_default();
    let (reason, message) = match pool {
        None => (
            "PoolNotFound",
            format!(
                "GpuPool {:?} does not exist: create it or set spec.pool",
                tenant.spec.pool
            ),
        ),
        Some(_) => (
            "AwaitingPlacement",
            "accepted; this operator version does not yet place tenants on agents".to_string(),
        ),
    };
    set_condition(
        &mut status.conditions,
        "Ready",
        false,
        reason,
        &message,
        generation,
    );
    status.phase = Some(TenantPhase::Pending);
    status.observed_generation = generation;
    status
}

fn error_policy(tenant: Arc<ModelTenant>, error: &Error, context: Arc<Context>) -> Action {
    tracing::warn!(tenant = %tenant.name_any(), error = %error, "reconcile failed; retrying");
    context.count(CONTROLLER, "error");
    Action::requeue(Duration::from_secs(15))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cotenant_crds::{GpuPoolSpec, ModelTenantSpec};

    fn tenant() -> ModelTenant {
        let spec: ModelTenantSpec = serde_json::from_value(serde_json::json!({
            "model": {"uri": "file://m.onnx"},
            "slo": {"latencyMillis": 10},
            "pool": "gpus"
        }))
        .expect("spec");
        let mut tenant = ModelTenant::new("t", spec);
        tenant.metadata.generation = Some(3);
        tenant
    }

    #[test]
    fn a_missing_pool_is_named_in_the_ready_condition() {
        let status = decide(&tenant(), None);
        let ready = &status.conditions[0];
        assert_eq!(
            (ready.type_.as_str(), ready.status.as_str()),
            ("Ready", "False")
        );
        assert_eq!(ready.reason, "PoolNotFound");
        assert!(ready.message.contains("\"gpus\""));
        assert_eq!(status.observed_generation, Some(3));
    }

    #[test]
    fn deciding_twice_changes_nothing() {
        let pool_spec: GpuPoolSpec = serde_json::from_value(serde_json::json!({
            "agentNamespace": "a", "template": {"image": "i"}
        }))
        .expect("pool");
        let pool = GpuPool::new("gpus", pool_spec);
        let mut tenant = tenant();
        tenant.status = Some(decide(&tenant, Some(&pool)));
        assert_eq!(
            tenant
                .status
                .as_ref()
                .map(|s| s.conditions[0].reason.as_str()),
            Some("AwaitingPlacement")
        );
        assert_eq!(Some(decide(&tenant, Some(&pool))), tenant.status);
    }
}
