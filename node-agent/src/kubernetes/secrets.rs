//! The Secrets assignments name for their models' object-store settings: the operator's copies
//! of tenants' `credentialsSecret`s, in the agent's own namespace, read by name (`get` only,
//! never listed or watched) each time a model is downloaded, so a rotated key applies to the
//! next download.

use crate::load::SecretReader;
use cotenant_crds::storage::{COPY_PROBLEM_ANNOTATION, COPY_SOURCE_ANNOTATION};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use std::collections::BTreeMap;

/// Reads Secrets of the agent's namespace.
pub struct Reader {
    pub api: Api<Secret>,
    pub namespace: String,
}

/// What a copy of a tenant's Secret holds, or why it cannot be used.
fn usable(
    namespace: &str,
    name: &str,
    secret: Secret,
) -> Result<(String, BTreeMap<String, Vec<u8>>), String> {
    let annotations = secret.metadata.annotations.unwrap_or_default();
    let what = match annotations.get(COPY_SOURCE_ANNOTATION) {
        Some(source) => format!("Secret {source}"),
        None => format!("Secret {namespace}/{name}"),
    };
    if let Some(problem) = annotations.get(COPY_PROBLEM_ANNOTATION) {
        return Err(problem.clone());
    }
    let data = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    Ok((what, data))
}

#[async_trait::async_trait]
impl SecretReader for Reader {
    async fn read(&self, name: &str) -> Result<(String, BTreeMap<String, Vec<u8>>), String> {
        let ns = &self.namespace;
        match self.api.get_opt(name).await {
            Ok(Some(secret)) => usable(ns, name, secret),
            Ok(None) => Err(format!(
                "Secret {ns}/{name} (the operator's copy of the tenant's credentialsSecret) does not exist"
            )),
            Err(kube::Error::Api(e)) if e.code == 403 => {
                Err(format!("the agent may not read Secret {ns}/{name}"))
            }
            Err(e) => Err(format!("cannot read Secret {ns}/{name}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn copy(annotations: &[(&str, &str)], data: &[(&str, &str)]) -> Secret {
        let mut s = Secret::default();
        s.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        );
        s
    }

    #[test]
    fn a_copy_is_named_after_its_source_and_says_why_it_is_unusable() {
        let (what, data) = usable(
            "agents",
            "copy",
            copy(
                &[(COPY_SOURCE_ANNOTATION, "team-a/s3-reader")],
                &[("AWS_ACCESS_KEY_ID", "id")],
            ),
        )
        .expect("usable");
        assert_eq!(what, "Secret team-a/s3-reader");
        assert_eq!(data["AWS_ACCESS_KEY_ID"], b"id");
        let e = usable(
            "agents",
            "copy",
            copy(
                &[(
                    COPY_PROBLEM_ANNOTATION,
                    "Secret team-a/s3-reader does not exist",
                )],
                &[],
            ),
        )
        .expect_err("unusable");
        assert_eq!(e, "Secret team-a/s3-reader does not exist");
        let (what, _) = usable("agents", "copy", copy(&[], &[])).expect("unannotated");
        assert_eq!(what, "Secret agents/copy");
    }
}
