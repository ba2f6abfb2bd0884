//! The API server's validation rules for a ModelTenant, for the places with no API server in
//! front (the agent's standalone mode). Keep in step with the schema attributes and CEL rules in
//! `tenant.rs` and `common.rs`; `tests/generated.rs` checks both on the same cases.

use crate::tenant::ModelTenantSpec;

/// An invalid field: its path, as the API server would name it, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

fn fail(field: &str, message: impl Into<String>) -> Result<(), FieldError> {
    Err(FieldError {
        field: field.to_string(),
        message: message.into(),
    })
}

fn within(field: &str, value: f64, min: f64, max: f64) -> Result<(), FieldError> {
    if value.is_finite() && value >= min && value <= max {
        Ok(())
    } else {
        fail(field, format!("{value} must be within [{min}, {max}]"))
    }
}

/// Whether `name` is a lowercase DNS subdomain name (the names of pools and Secrets).
fn dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.'])
}

/// Longest tenant name: a Service name is an RFC 1035 label.
pub const MAX_TENANT_NAME: usize = 63;

/// A ModelTenant's name is also the name of its Service, so it must be an RFC 1035 label:
/// lowercase letters, digits and `-`, starting with a letter, at most 63 characters (a valid
/// object name such as `bert.large` or `3net` is not). The CRD's CEL rule says the same.
pub fn validate_tenant_name(name: &str) -> Result<(), FieldError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TENANT_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        fail("metadata.name", format!("{name:?} {TENANT_NAME_RULE}"))
    }
}

/// What a tenant name must be, as the CEL rule's message says it.
pub const TENANT_NAME_RULE: &str = "must be a Service name (RFC 1035 label): lowercase letters, digits and '-', starting with a letter and ending with a letter or digit, at most 63 characters; the tenant's Service takes this name";

impl ModelTenantSpec {
    /// The first rule this spec breaks, if any.
    pub fn validate(&self) -> Result<(), FieldError> {
        let uri = &self.model.uri;
        let store = crate::storage::Store::of_uri(uri);
        let plain_ok = ["file://", "http://", "https://"]
            .iter()
            .any(|s| uri.starts_with(s) && uri.len() > s.len());
        let uri_ok = match store {
            Some(_) => crate::storage::bucket_and_key(uri).is_some(),
            None => plain_ok,
        };
        if !uri_ok || uri.len() > 2048 || uri.chars().any(char::is_whitespace) {
            fail(
                "spec.model.uri",
                format!(
                    "{uri:?} must be a file://, http:// or https:// URI, or s3://, gs:// or az:// with a bucket and a key"
                ),
            )?;
        }
        if let Some(sha) = &self.model.sha256
            && (sha.len() != 64 || !sha.chars().all(|c| c.is_ascii_hexdigit()))
        {
            fail("spec.model.sha256", "must be 64 hex characters")?;
        }
        // The API server also refuses a relative file:// path, which standalone mode reads
        // relative to the tenant's file: the one rule this check leaves out.
        if !uri.starts_with("file://") && self.model.sha256.is_none() {
            fail(
                "spec.model.sha256",
                "an http(s)://, s3://, gs:// or az:// model needs spec.model.sha256: the agent checks every download against it",
            )?;
        }
        if let Some(secret) = &self.model.credentials_secret {
            if store.is_none() {
                fail(
                    "spec.model.credentialsSecret",
                    "spec.model.credentialsSecret is for s3://, gs:// and az:// models only",
                )?;
            }
            if !dns_name(&secret.name) {
                fail(
                    "spec.model.credentialsSecret.name",
                    format!("{:?} must be a Secret name", secret.name),
                )?;
            }
        }
        let slo = &self.slo;
        if !(slo.latency_millis.is_finite()
            && slo.latency_millis > 0.0
            && slo.latency_millis <= 600_000.0)
        {
            fail(
                "spec.slo.latencyMillis",
                "must be greater than 0 and at most 600000",
            )?;
        }
        within("spec.slo.percentile", slo.percentile, 50.0, 99.99)?;
        let s = &self.scaling;
        within(
            "spec.scaling.maxBatchSize",
            f64::from(s.max_batch_size),
            1.0,
            1024.0,
        )?;
        within(
            "spec.scaling.maxInstances",
            f64::from(s.max_instances),
            1.0,
            64.0,
        )?;
        within(
            "spec.scaling.minReplicas",
            f64::from(s.min_replicas),
            1.0,
            1000.0,
        )?;
        within(
            "spec.scaling.maxReplicas",
            f64::from(s.max_replicas),
            1.0,
            1000.0,
        )?;
        if s.min_replicas > s.max_replicas {
            fail(
                "spec.scaling.minReplicas",
                "minReplicas must be less than or equal to maxReplicas",
            )?;
        }
        if !dns_name(&self.pool) {
            fail(
                "spec.pool",
                format!("{:?} must be a lowercase DNS name", self.pool),
            )?;
        }
        Ok(())
    }
}
