//! The tenants and pools as the leader last decided them, as gauges: each round replaces the
//! whole [`Snapshot`], and a [`Published`] collector encodes it at scrape time, so a deleted
//! tenant or pool leaves `/metrics` with the round that no longer sees it. A follower publishes
//! an empty snapshot; the families are always described, so every replica has one catalogue.

use cotenant_crds::{GpuPool, GpuPoolStatus, ModelTenant, ModelTenantStatus};
use kube::ResourceExt;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;
use std::sync::{Arc, Mutex, PoisonError};

/// One tenant's gauges.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantGauges {
    pub namespace: String,
    pub name: String,
    /// Its Ready condition is True.
    pub ready: bool,
    /// Its SLOMet condition; `None` while unknown (absent, or status Unknown).
    pub slo_met: Option<bool>,
    /// Replicas placed on agents (loading or serving).
    pub replicas: u32,
    /// Replicas the operator wants.
    pub replicas_desired: u32,
    pub slo_latency_seconds: f64,
}

impl TenantGauges {
    /// `tenant` with the status this round decided for it.
    pub fn new(tenant: &ModelTenant, status: &ModelTenantStatus) -> TenantGauges {
        let condition = |type_: &str| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == type_)
                .and_then(|c| match c.status.as_str() {
                    "True" => Some(true),
                    "False" => Some(false),
                    _ => None,
                })
        };
        TenantGauges {
            namespace: tenant.namespace().unwrap_or_default(),
            name: tenant.name_any(),
            ready: condition("Ready") == Some(true),
            slo_met: condition("SLOMet"),
            replicas: u32::try_from(status.placements.len()).unwrap_or(u32::MAX),
            replicas_desired: status.replicas.unwrap_or(0),
            slo_latency_seconds: tenant.spec.slo.latency_millis / 1e3,
        }
    }
}

/// One pool's gauges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolGauges {
    pub name: String,
    pub agents: u32,
    pub ready_agents: u32,
    pub pending_agents: u32,
    pub max_agents: u32,
}

impl PoolGauges {
    /// `pool` with the status this round decided for it.
    pub fn new(pool: &GpuPool, status: &GpuPoolStatus) -> PoolGauges {
        PoolGauges {
            name: pool.name_any(),
            agents: status.agents,
            ready_agents: status.ready_agents,
            pending_agents: status.pending_agents,
            max_agents: pool.spec.max_agents,
        }
    }
}

/// Everything one round saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub tenants: Vec<TenantGauges>,
    pub pools: Vec<PoolGauges>,
}

/// The latest snapshot, shared by the control loop (which replaces it) and the registry (which
/// encodes it on every scrape).
#[derive(Clone, Debug, Default)]
pub struct Published(Arc<Mutex<Snapshot>>);

impl Published {
    pub fn replace(&self, snapshot: Snapshot) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = snapshot;
    }

    fn current(&self) -> Snapshot {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

type Labels = Vec<(&'static str, String)>;

/// A tenant gauge: its name, help, and how to read its value (`None`: no series).
type Read = (&'static str, &'static str, fn(&TenantGauges) -> Option<u32>);

/// Writes one gauge family: its descriptor, then one sample per `(labels, value)`.
fn family<V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, V)>,
    mut write: impl FnMut(&mut MetricEncoder, V) -> Result<(), std::fmt::Error>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        write(&mut metric.encode_family(&labels)?, value)?;
    }
    Ok(())
}

fn integer(m: &mut MetricEncoder, v: u32) -> Result<(), std::fmt::Error> {
    m.encode_gauge(&i64::from(v))
}

fn real(m: &mut MetricEncoder, v: f64) -> Result<(), std::fmt::Error> {
    m.encode_gauge(&v)
}

fn tenant_labels(t: &TenantGauges) -> Labels {
    vec![
        ("namespace", t.namespace.clone()),
        ("tenant", t.name.clone()),
    ]
}

impl Collector for Published {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.current();
        let e = &mut encoder;
        let tenants = &snapshot.tenants;
        let tenant_gauges: [Read; 4] = [
            (
                "tenant_ready",
                "1 while the tenant's Ready condition is True, else 0.",
                |t| Some(u32::from(t.ready)),
            ),
            (
                "tenant_slo_met",
                "1 while the tenant's SLOMet condition is True, 0 while False; absent while unknown.",
                |t| t.slo_met.map(u32::from),
            ),
            (
                "tenant_replicas",
                "Replicas of the tenant placed on agents (loading or serving).",
                |t| Some(t.replicas),
            ),
            (
                "tenant_replicas_desired",
                "Replicas of the tenant the operator wants.",
                |t| Some(t.replicas_desired),
            ),
        ];
        for (name, help, value) in tenant_gauges {
            family(
                e,
                name,
                help,
                tenants
                    .iter()
                    .filter_map(|t| Some((tenant_labels(t), value(t)?))),
                integer,
            )?;
        }
        family(
            e,
            "tenant_slo_latency_seconds",
            "The tenant's latency SLO.",
            tenants
                .iter()
                .map(|t| (tenant_labels(t), t.slo_latency_seconds)),
            real,
        )?;
        family(
            e,
            "pool_agents",
            "Agents of the pool by state: ready (reporting ready), pending (waiting for a node), total (pods that exist).",
            snapshot.pools.iter().flat_map(|p| {
                [
                    ("ready", p.ready_agents),
                    ("pending", p.pending_agents),
                    ("total", p.agents),
                ]
                .map(|(state, n)| {
                    (
                        vec![("pool", p.name.clone()), ("state", state.to_string())],
                        n,
                    )
                })
            }),
            integer,
        )?;
        family(
            e,
            "pool_max_agents",
            "The most agents the pool may run.",
            snapshot
                .pools
                .iter()
                .map(|p| (vec![("pool", p.name.clone())], p.max_agents)),
            integer,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    fn encoded(published: &Published) -> String {
        let mut registry = Registry::with_prefix("cotenant_operator");
        registry.register_collector(Box::new(published.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
        out
    }

    fn tenant(name: &str, slo_met: Option<bool>) -> TenantGauges {
        TenantGauges {
            namespace: "ml".into(),
            name: name.into(),
            ready: true,
            slo_met,
            replicas: 2,
            replicas_desired: 3,
            slo_latency_seconds: 0.025,
        }
    }

    fn pool() -> PoolGauges {
        PoolGauges {
            name: "gpus".into(),
            agents: 4,
            ready_agents: 3,
            pending_agents: 1,
            max_agents: 8,
        }
    }

    /// The sample lines (not `#` lines) of `text`.
    fn samples(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#')).collect()
    }

    #[test]
    fn a_snapshot_is_encoded_with_its_labels() {
        let published = Published::default();
        published.replace(Snapshot {
            tenants: vec![tenant("resnet", Some(false))],
            pools: vec![pool()],
        });
        let out = encoded(&published);
        for line in [
            r#"cotenant_operator_tenant_ready{namespace="ml",tenant="resnet"} 1"#,
            r#"cotenant_operator_tenant_slo_met{namespace="ml",tenant="resnet"} 0"#,
            r#"cotenant_operator_tenant_replicas{namespace="ml",tenant="resnet"} 2"#,
            r#"cotenant_operator_tenant_replicas_desired{namespace="ml",tenant="resnet"} 3"#,
            r#"cotenant_operator_tenant_slo_latency_seconds{namespace="ml",tenant="resnet"} 0.025"#,
            r#"cotenant_operator_pool_agents{pool="gpus",state="ready"} 3"#,
            r#"cotenant_operator_pool_agents{pool="gpus",state="pending"} 1"#,
            r#"cotenant_operator_pool_agents{pool="gpus",state="total"} 4"#,
            r#"cotenant_operator_pool_max_agents{pool="gpus"} 8"#,
            "# TYPE cotenant_operator_tenant_ready gauge",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
    }

    #[test]
    fn an_unknown_slo_has_no_series() {
        let published = Published::default();
        published.replace(Snapshot {
            tenants: vec![tenant("resnet", None)],
            pools: vec![],
        });
        let out = encoded(&published);
        assert!(out.contains("# TYPE cotenant_operator_tenant_slo_met gauge"));
        assert!(!out.contains("cotenant_operator_tenant_slo_met{"), "{out}");
        assert!(
            out.contains(r#"cotenant_operator_tenant_ready{namespace="ml",tenant="resnet"} 1"#)
        );
    }

    #[test]
    fn what_a_round_no_longer_sees_disappears() {
        let published = Published::default();
        published.replace(Snapshot {
            tenants: vec![tenant("resnet", Some(true)), tenant("bert", Some(true))],
            pools: vec![pool()],
        });
        assert!(encoded(&published).contains(r#"tenant="bert""#));
        published.replace(Snapshot {
            tenants: vec![tenant("resnet", Some(true))],
            pools: vec![],
        });
        let out = encoded(&published);
        assert!(!out.contains(r#"tenant="bert""#), "{out}");
        assert!(!out.contains(r#"pool="gpus""#), "{out}");
        assert!(out.contains(r#"tenant="resnet""#), "{out}");
    }

    #[test]
    fn an_empty_snapshot_describes_every_family_and_has_no_series() {
        let out = encoded(&Published::default());
        assert_eq!(samples(&out), Vec::<&str>::new(), "{out}");
        for name in [
            "tenant_ready",
            "tenant_slo_met",
            "tenant_replicas",
            "tenant_replicas_desired",
            "tenant_slo_latency_seconds",
            "pool_agents",
            "pool_max_agents",
        ] {
            let line = format!("# TYPE cotenant_operator_{name} gauge");
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
    }

    #[test]
    fn gauges_come_from_the_conditions_and_placements() {
        let t: ModelTenant = serde_json::from_value(serde_json::json!({
            "apiVersion": "cotenant.dev/v1alpha1", "kind": "ModelTenant",
            "metadata": {"name": "resnet", "namespace": "ml"},
            "spec": {"model": {"uri": "file:///m.onnx"}, "slo": {"latencyMillis": 40}, "pool": "gpus"},
        }))
        .expect("tenant");
        let status: ModelTenantStatus = serde_json::from_value(serde_json::json!({
            "replicas": 2,
            "placements": [{"agent": "a-0", "ready": true}],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Serving", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "SLOMet", "status": "Unknown", "reason": "NoTraffic", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]
        }))
        .expect("status");
        let g = TenantGauges::new(&t, &status);
        assert_eq!((g.namespace.as_str(), g.name.as_str()), ("ml", "resnet"));
        assert!(g.ready);
        assert_eq!(g.slo_met, None);
        assert_eq!((g.replicas, g.replicas_desired), (1, 2));
        assert!((g.slo_latency_seconds - 0.04).abs() < 1e-12);
        let g = TenantGauges::new(&t, &ModelTenantStatus::default());
        assert!(!g.ready, "no Ready condition is not ready");
        assert_eq!((g.replicas, g.replicas_desired), (0, 0));
    }
}
