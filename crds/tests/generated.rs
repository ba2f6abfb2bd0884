//! The CRD YAML committed in the chart is exactly what the types generate, and the types accept
//! the shipped examples.

use cotenant_crds::{Approach, GpuPool, ModelTenant, crd_yaml, crds};
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn committed_crds_match_the_types() {
    for (file, crd) in crds() {
        let path = repo().join("charts/cotenant/crds").join(file);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == crd_yaml(&crd).expect("serialise"),
            "{} is stale: run `cargo run -p cotenant-crds --bin crdgen`",
            path.display()
        );
    }
}

#[test]
fn no_unsigned_formats_reach_the_api_server() {
    for (file, crd) in crds() {
        let yaml = crd_yaml(&crd).expect("serialise");
        assert!(
            !yaml.contains("format: uint"),
            "{file} has an unsigned format"
        );
    }
}

#[test]
fn examples_deserialise_with_defaults() {
    let text = std::fs::read_to_string(repo().join("examples/mobilenet-v2.yaml")).expect("example");
    let tenant: ModelTenant = serde_yaml::from_str(&text).expect("a ModelTenant");
    assert_eq!(tenant.spec.slo.percentile, 99.0);
    assert_eq!(tenant.spec.pool, "default");
    assert_eq!(tenant.spec.scaling.approach, Approach::Auto);
    assert_eq!(tenant.spec.scaling.max_instances, 8);
    assert_eq!(tenant.spec.scaling.max_batch_size, 32);

    let text = std::fs::read_to_string(repo().join("examples/pools/h200.yaml")).expect("example");
    let pool: GpuPool = serde_yaml::from_str(&text).expect("a GpuPool");
    assert_eq!(pool.spec.template.gpus_per_agent, 1);
    assert_eq!(pool.spec.gpu_memory_mib, Some(143360));
}
