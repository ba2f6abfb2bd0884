//! The agent's liveness: a `coordination.k8s.io` Lease named after its pod (and its GpuAgent), in
//! its namespace, renewed every [`RENEW`] for [`DURATION_SECONDS`], the way a kubelet renews its
//! node's Lease. One small update per period replaces rewriting the whole GpuAgent status; the
//! operator watches the Leases and counts an agent whose Lease has expired as unreachable. The
//! Lease is owned by the GpuAgent, so it goes with it.

use cotenant_crds::GpuAgent;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::watch;

/// How often the agent renews its Lease.
pub const RENEW: Duration = Duration::from_secs(10);
/// How long a renewal holds: four periods, so one or two lost renewals expire nothing.
pub const DURATION_SECONDS: i32 = 40;
/// Longest one renewal may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Renews Lease `name` until `stop` turns true. `owner` carries the UID of the agent's GpuAgent
/// once it has been read. Failures are logged and retried next period; serving carries on.
pub async fn renew_loop(
    api: Api<Lease>,
    name: String,
    owner: watch::Receiver<Option<String>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut held: Option<Lease> = None;
    let mut failing = false;
    loop {
        let uid = owner.borrow().clone();
        let renewed = tokio::time::timeout(TIMEOUT, renew(&api, &name, uid, &mut held)).await;
        match renewed {
            Ok(Ok(())) if failing => {
                tracing::info!(lease = %name, "lease renewed again");
                failing = false;
            }
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %name, error = %e, "cannot renew the agent's lease; serving continues");
                failing = true;
            }
            Err(_) => {
                tracing::warn!(lease = %name, "renewing the agent's lease timed out; serving continues");
                held = None;
                failing = true;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RENEW) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// One renewal: an update of the Lease last written (one request per period), or a read and
/// then an update or create when there is none or it changed under us.
async fn renew(
    api: &Api<Lease>,
    name: &str,
    owner_uid: Option<String>,
    held: &mut Option<Lease>,
) -> kube::Result<()> {
    let now = MicroTime(Timestamp::now());
    let mut lease = match held.take() {
        Some(lease) => lease,
        None => match api.get_opt(name).await? {
            Some(lease) => lease,
            None => {
                let lease = new_lease(name, owner_uid, now);
                *held = Some(api.create(&PostParams::default(), &lease).await?);
                return Ok(());
            }
        },
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(name.to_string());
    spec.lease_duration_seconds = Some(DURATION_SECONDS);
    spec.renew_time = Some(now);
    if lease.metadata.owner_references.is_none()
        && let Some(uid) = owner_uid
    {
        lease.metadata.owner_references = Some(vec![owner(name, uid)]);
    }
    // A conflict or a deleted Lease clears `held`, so the next period reads it afresh.
    *held = Some(api.replace(name, &PostParams::default(), &lease).await?);
    Ok(())
}

fn new_lease(name: &str, owner_uid: Option<String>, now: MicroTime) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                "cotenant-agent".to_string(),
            )])),
            owner_references: owner_uid.map(|uid| vec![owner(name, uid)]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_string()),
            lease_duration_seconds: Some(DURATION_SECONDS),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..LeaseSpec::default()
        }),
    }
}

/// The agent's GpuAgent as the Lease's owner (not blocking its deletion).
fn owner(name: &str, uid: String) -> OwnerReference {
    OwnerReference {
        api_version: GpuAgent::api_version(&()).into_owned(),
        kind: GpuAgent::kind(&()).into_owned(),
        name: name.to_string(),
        uid,
        controller: Some(false),
        block_owner_deletion: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_lease_names_the_agent_and_its_gpuagent() {
        let now = MicroTime(Timestamp::UNIX_EPOCH);
        let lease = new_lease("pool-agent-abcde", Some("uid-1".into()), now);
        let spec = lease.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("pool-agent-abcde"));
        assert_eq!(spec.lease_duration_seconds, Some(DURATION_SECONDS));
        let owners = lease.metadata.owner_references.expect("owner");
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].uid.as_str()),
            ("GpuAgent", "uid-1")
        );
        assert!(DURATION_SECONDS as u64 >= 3 * RENEW.as_secs());
    }
}
