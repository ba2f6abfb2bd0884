//! Types shared by several kinds: the SLO, the knobs DNNScaler moves, model sources and tenant references.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a model comes from and how it is encoded.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSource {
    /// Location of the model file: `file:///<path>` (an absolute path under one of the agent's
    /// model volume roots; a relative path is read relative to the YAML file in standalone mode
    /// only), `http://` or `https://`, or an object in a bucket: `s3://<bucket>/<key>`,
    /// `gs://<bucket>/<key>` or `az://<container>/<blob>`. All but `file://` need `sha256`.
    #[schemars(
        length(min = 8, max = 2048),
        regex(pattern = r"^((file|https?)://\S+|(s3|gs|az)://[^/\s]+/\S+)$")
    )]
    pub uri: String,
    /// Expected SHA-256 of the model file as 64 hex characters; the agent refuses a file that
    /// differs. Required for every source but `file://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-fA-F]{64}$"))]
    pub sha256: Option<String>,
    /// Encoding of the model file.
    #[serde(default)]
    pub format: ModelFormat,
    /// The Secret with the credentials and endpoint settings of an `s3://`, `gs://` or `az://`
    /// model (keys as the object store's environment variables: `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`, `GOOGLE_SERVICE_ACCOUNT_KEY`,
    /// `AZURE_STORAGE_ACCOUNT_NAME`, ...). In a ModelTenant, a Secret in the tenant's namespace;
    /// in a GpuAgent's assignment, the operator's copy of it in the agent's namespace. Without
    /// it the bucket is read anonymously.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<SecretName>,
}

/// A Secret named in the same namespace as the object naming it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretName {
    /// Name of the Secret.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
}

/// Encoding of a model file.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ModelFormat {
    /// An ONNX model (opsets 9 to 18).
    #[default]
    #[serde(rename = "onnx")]
    Onnx,
}

/// A latency service-level objective: `percentile` of requests finish within `latencyMillis`,
/// measured end to end at the agent (queueing included).
///
/// Fractional bounds are CEL rules: the API server truncates a schema's `minimum`/`maximum` to an
/// integer when the value given is an integer, so `minimum: 0.001` would let `0` through.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.latencyMillis > 0.0",
        "message": "latencyMillis must be greater than 0",
        "fieldPath": ".latencyMillis",
        "reason": "FieldValueInvalid"
    },
    {
        "rule": "self.percentile <= 99.99",
        "message": "percentile must be at most 99.99",
        "fieldPath": ".percentile",
        "reason": "FieldValueInvalid"
    }
]))]
pub struct Slo {
    /// Latency target in milliseconds, from arrival at the agent to the response (greater than 0,
    /// at most 600000).
    #[schemars(range(max = 600000))]
    pub latency_millis: f64,
    /// The percentile of requests that must meet the latency target, in [50, 99.99].
    #[serde(default = "default_percentile")]
    #[schemars(range(min = 50, max = 100))]
    pub percentile: f64,
}

fn default_percentile() -> f64 {
    99.0
}

/// The two knobs DNNScaler moves for one replica: `instances` co-located copies of the model, each
/// running batches of up to `batchSize` requests.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Knobs {
    /// Largest batch one instance runs, in [1, 1024].
    #[schemars(range(min = 1, max = 1024))]
    pub batch_size: u32,
    /// Number of co-located instances of the model, in [1, 64].
    #[schemars(range(min = 1, max = 64))]
    pub instances: u32,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            batch_size: 1,
            instances: 1,
        }
    }
}

/// A reference to one ModelTenant that survives its deletion and re-creation under the same name.
#[derive(
    Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct TenantRef {
    /// Namespace of the ModelTenant.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Name of the ModelTenant.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// UID of the ModelTenant, so a re-created tenant of the same name is a different assignment.
    #[schemars(length(min = 1, max = 64))]
    pub uid: String,
}

impl TenantRef {
    /// `namespace/name`, the key a tenant is served and reported under.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The standard `status.conditions` entry (`metav1.Condition`).
pub type Condition = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
