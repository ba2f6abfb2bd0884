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

#[test]
fn standalone_validation_names_the_field() {
    let base = "model:\n  uri: file://m.onnx\nslo:\n  latencyMillis: 50\n";
    let spec = |yaml: &str| -> cotenant_crds::ModelTenantSpec {
        serde_yaml::from_str(yaml).expect("parses")
    };
    assert!(spec(base).validate().is_ok());
    let digest = "0".repeat(64);
    let downloaded = base.replace(
        "file://m.onnx",
        &format!("https://models.example/m.onnx\n  sha256: {digest}"),
    );
    assert!(spec(&downloaded).validate().is_ok(), "{downloaded}");
    let in_a_bucket = base.replace(
        "file://m.onnx",
        &format!(
            "s3://models/m.onnx\n  sha256: {digest}\n  credentialsSecret:\n    name: s3-reader"
        ),
    );
    assert!(spec(&in_a_bucket).validate().is_ok(), "{in_a_bucket}");
    let cases = [
        (base.replace("50", "0"), "spec.slo.latencyMillis"),
        (
            base.replace("50", "50\n  percentile: 99.995"),
            "spec.slo.percentile",
        ),
        (
            base.replace("50", "50\n  percentile: 30"),
            "spec.slo.percentile",
        ),
        (base.replace("file://", "ftp://"), "spec.model.uri"),
        (
            base.replace("m.onnx", "m.onnx\n  sha256: abc"),
            "spec.model.sha256",
        ),
        (
            format!("{base}scaling:\n  maxBatchSize: 0\n"),
            "spec.scaling.maxBatchSize",
        ),
        (
            format!("{base}scaling:\n  maxInstances: 65\n"),
            "spec.scaling.maxInstances",
        ),
        (
            format!("{base}scaling:\n  minReplicas: 3\n  maxReplicas: 2\n"),
            "spec.scaling.minReplicas",
        ),
        (format!("{base}pool: Bad_Pool\n"), "spec.pool"),
        (
            base.replace("file://m.onnx", "https://models.example/m.onnx"),
            "spec.model.sha256",
        ),
        (
            base.replace("file://m.onnx", "s3://models/m.onnx"),
            "spec.model.sha256",
        ),
        (
            base.replace("file://m.onnx", &format!("gs://models\n  sha256: {digest}")),
            "spec.model.uri",
        ),
        (
            in_a_bucket.replace("s3://models/m.onnx", "az:///m.onnx"),
            "spec.model.uri",
        ),
        (
            in_a_bucket.replace("s3://models/m.onnx", "https://models.example/m.onnx"),
            "spec.model.credentialsSecret",
        ),
        (
            in_a_bucket.replace("s3-reader", "S3_Reader"),
            "spec.model.credentialsSecret.name",
        ),
    ];
    for (yaml, field) in cases {
        let err = spec(&yaml).validate().expect_err(field);
        assert_eq!(err.field, field, "{yaml}");
    }
}

#[test]
fn tenant_names_must_be_service_names() {
    for ok in ["bert", "bert-large", "b3", &"a".repeat(63)] {
        assert!(cotenant_crds::validate_tenant_name(ok).is_ok(), "{ok}");
    }
    for bad in [
        "bert.large",
        "3net",
        "-a",
        "a-",
        "Bert",
        "",
        &"a".repeat(64),
    ] {
        let err = cotenant_crds::validate_tenant_name(bad).expect_err(bad);
        assert_eq!(err.field, "metadata.name");
    }
}
