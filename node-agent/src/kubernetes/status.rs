//! Writing the GpuAgent's status: where the agent serves, its device, every tenant's state and the
//! Ready condition. A write goes out when something changed, at most one a second, and never
//! otherwise (liveness is the agent's Lease, `super::lease`); failures are logged and retried
//! with backoff while serving carries on.

use super::identity::Identity;
use cotenant_crds::conditions::set_condition;
use cotenant_crds::{Condition, Device, DeviceKind, GpuAgent, GpuAgentStatus, LoadedTenant};
use kube::api::{Api, Patch, PatchParams};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The field manager of the agent's status writes.
pub const FIELD_MANAGER: &str = "cotenant-agent";
/// Fewest seconds between two writes.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Longest wait before retrying a failed write (so a GpuAgent created after the agent started
/// gets its status soon).
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// What the reconciler knows, published after every change.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Whether the GpuAgent has been read.
    pub initialised: bool,
    pub generation: Option<i64>,
    pub tenants: Vec<LoadedTenant>,
    /// Every assignment Ready or Failed.
    pub settled: bool,
    pub weight_bytes: u64,
}

/// The agent's device as its status reports it: the GPU, or the host's CPU.
pub fn device(device: &cotenant_executor::Device, threads: usize) -> Device {
    match device {
        cotenant_executor::Device::Gpu(gpu) => Device {
            kind: if gpu.is_simulated() {
                DeviceKind::Sim
            } else {
                DeviceKind::Cuda
            },
            name: gpu.name.clone(),
            memory_total_bytes: gpu.total_bytes,
            memory_used_bytes: 0,
        },
        cotenant_executor::Device::Cpu => Device {
            kind: DeviceKind::Cpu,
            name: format!("CPU ({threads} threads)"),
            memory_total_bytes: mem_total().unwrap_or(0),
            memory_used_bytes: 0,
        },
    }
}

/// MemTotal of /proc/meminfo in bytes.
fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&text)
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The status for `snapshot`; `conditions` carries the Ready condition
/// across writes so its transition time moves only when it flips.
pub fn status(
    identity: &Identity,
    device: &Device,
    snapshot: &Snapshot,
    conditions: &mut Vec<Condition>,
) -> GpuAgentStatus {
    let (ready, reason, message) = if !snapshot.initialised {
        (
            false,
            "NoGpuAgent",
            "the agent has not read its GpuAgent yet".to_string(),
        )
    } else if !snapshot.settled {
        let busy = snapshot
            .tenants
            .iter()
            .filter(|t| {
                matches!(
                    t.state,
                    cotenant_crds::ReplicaState::Loading | cotenant_crds::ReplicaState::Profiling
                )
            })
            .count();
        (
            false,
            "Loading",
            format!("{busy} tenant(s) loading or profiling"),
        )
    } else {
        let failed = snapshot
            .tenants
            .iter()
            .filter(|t| t.state == cotenant_crds::ReplicaState::Failed)
            .count();
        (
            true,
            "Settled",
            format!(
                "serving; {failed} of {} tenant(s) failed",
                snapshot.tenants.len()
            ),
        )
    };
    set_condition(
        conditions,
        "Ready",
        ready,
        reason,
        &message,
        snapshot.generation,
    );
    GpuAgentStatus {
        address: Some(identity.address.clone()),
        grpc_address: Some(identity.grpc_address.clone()),
        admin_address: Some(identity.admin_address.clone()),
        node: identity.node.clone(),
        device: Some(Device {
            memory_used_bytes: snapshot.weight_bytes,
            ..device.clone()
        }),
        tenants: snapshot.tenants.clone(),
        conditions: conditions.clone(),
        observed_generation: snapshot.generation,
    }
}

/// The merge patch that sets `status`, with `tenants` always present so an empty list clears
/// the previous one.
fn patch_body(status: &GpuAgentStatus) -> serde_json::Value {
    let mut body = serde_json::to_value(status).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(map) = body.as_object_mut() {
        map.entry("tenants")
            .or_insert_with(|| serde_json::json!([]));
    }
    serde_json::json!({ "status": body })
}

/// Writes the status of GpuAgent `identity.name` until `stop` turns true, then once more with
/// Ready False (ShuttingDown) so the operator stops counting on this agent.
pub async fn write_loop(
    api: Api<GpuAgent>,
    identity: Identity,
    device: Device,
    mut snapshots: watch::Receiver<Snapshot>,
    mut stop: watch::Receiver<bool>,
) {
    let writer = Writer {
        api,
        params: PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..Default::default()
        },
        name: identity.name.clone(),
    };
    let mut conditions: Vec<Condition> = Vec::new();
    let mut last: Option<(GpuAgentStatus, Instant)> = None;
    let mut backoff = Duration::ZERO;
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        let next = status(&identity, &device, &snapshot, &mut conditions);
        let wait = match &last {
            Some((written, _)) if *written == next => None,
            Some((_, at)) => Some(MIN_INTERVAL.saturating_sub(at.elapsed())),
            None => Some(Duration::ZERO),
        };
        if wait.is_some_and(|w| w.is_zero()) {
            match writer.write(&next, WRITE_TIMEOUT).await {
                Ok(()) => {
                    if backoff > Duration::ZERO {
                        tracing::info!("status written again");
                    }
                    backoff = Duration::ZERO;
                    last = Some((next, Instant::now()));
                }
                Err(e) => {
                    backoff = (backoff * 2).clamp(Duration::from_secs(1), MAX_BACKOFF);
                    tracing::warn!(error = %e, retry_in = ?backoff, "cannot write the GpuAgent status; serving continues");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.wait_for(|s| *s) => break,
                    }
                }
            }
            continue;
        }
        tokio::select! {
            changed = snapshots.changed() => {
                if changed.is_err() {
                    // The reconciler is gone: the agent is stopping.
                    break;
                }
            }
            _ = sleep_or_forever(wait) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    let snapshot = snapshots.borrow().clone();
    let mut last = status(&identity, &device, &snapshot, &mut conditions);
    set_condition(
        &mut last.conditions,
        "Ready",
        false,
        "ShuttingDown",
        "the agent is stopping: finishing accepted requests",
        snapshot.generation,
    );
    if let Err(e) = writer.write(&last, FINAL_WRITE_TIMEOUT).await {
        tracing::warn!(error = %e, "cannot write the final status");
    }
}

async fn sleep_or_forever(wait: Option<Duration>) {
    match wait {
        Some(w) => tokio::time::sleep(w).await,
        None => std::future::pending().await,
    }
}

/// The Ready condition's reason when the GPU the agent was started for cannot be used.
pub const DEVICE_UNAVAILABLE: &str = "DeviceUnavailable";

/// The status of an agent whose GPU cannot be used: not Ready, and why (the agent then exits
/// rather than serve on the CPU a pod asked a GPU for).
pub fn device_unavailable(identity: &Identity, why: &str) -> GpuAgentStatus {
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        "Ready",
        false,
        DEVICE_UNAVAILABLE,
        why,
        None,
    );
    GpuAgentStatus {
        address: Some(identity.address.clone()),
        grpc_address: Some(identity.grpc_address.clone()),
        admin_address: Some(identity.admin_address.clone()),
        node: identity.node.clone(),
        device: None,
        tenants: Vec::new(),
        conditions,
        observed_generation: None,
    }
}

/// Writes `status` once (the retries are the pod's restarts).
pub async fn write_once(
    api: Api<GpuAgent>,
    identity: &Identity,
    status: &GpuAgentStatus,
) -> Result<(), String> {
    let writer = Writer {
        api,
        params: PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..Default::default()
        },
        name: identity.name.clone(),
    };
    writer.write(status, WRITE_TIMEOUT).await
}

/// Longest a status write may take before it counts as failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest the last write on shutdown may hold up the exit.
const FINAL_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

struct Writer {
    api: Api<GpuAgent>,
    params: PatchParams,
    name: String,
}

impl Writer {
    /// Merge-patches the status subresource with `status`.
    async fn write(&self, status: &GpuAgentStatus, timeout: Duration) -> Result<(), String> {
        let body = Patch::Merge(patch_body(status));
        match tokio::time::timeout(
            timeout,
            self.api.patch_status(&self.name, &self.params, &body),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {timeout:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_in_bytes() {
        let meminfo = "MemTotal:       16337248 kB\nMemFree:         1234 kB\n";
        assert_eq!(parse_mem_total(meminfo), Some(16337248 * 1024));
        assert_eq!(parse_mem_total("nothing"), None);
    }

    #[test]
    fn an_unusable_gpu_is_not_ready_and_says_why() {
        let identity = Identity {
            namespace: "ns".into(),
            name: "agent-0".into(),
            address: "10.0.0.1:8000".into(),
            grpc_address: "10.0.0.1:8001".into(),
            admin_address: "10.0.0.1:8002".into(),
            node: Some("n".into()),
        };
        let s = device_unavailable(&identity, "--device cuda: no libcuda.so found");
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", DEVICE_UNAVAILABLE)
        );
        assert!(ready.message.contains("no libcuda"), "{}", ready.message);
        assert_eq!((s.device, s.tenants.len()), (None, 0));
    }

    #[test]
    fn an_empty_tenant_list_is_written_as_one() {
        let body = patch_body(&GpuAgentStatus::default());
        assert_eq!(body["status"]["tenants"], serde_json::json!([]));
    }
}
