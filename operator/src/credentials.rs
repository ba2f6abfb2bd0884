//! Tenants' Secrets, read by the operator (`get` only, never list or watch) and at most every
//! [`REFRESH`], which bounds how long a rotated key takes to apply:
//!
//! - Caller credentials (`spec.credentials.secretRef`): the tokens become SHA-256 digests in every
//!   assignment of the tenant, so agents can refuse callers without a token while the tokens
//!   themselves never leave the Secret. It fails closed: a Secret that is missing, unreadable or
//!   holds no usable token gives the tenant an empty digest list (nobody may call) and an Event
//!   saying why. A read that fails for a moment (a timeout, an API server error) keeps the
//!   digests last read.
//! - Model credentials (`spec.model.credentialsSecret`, for `s3://`, `gs://` and `az://`): agents
//!   may read Secrets only in their own namespace, so the operator copies the keys the agents use
//!   (`cotenant_crds::storage`, nothing else of the Secret) into a Secret there, named after the
//!   pool and the tenant's UID, labelled and owned by the pool, and points the tenant's
//!   assignments at the copy. A Secret that cannot be used gives a copy with no data that says
//!   why (so the agent fails the tenant with the reason) and an Event. `crate::apply` writes the
//!   copies before the assignments and deletes those no assignment names any more.

use crate::decide::{EventToRecord, PoolOutcome};
use crate::manifests::{MANAGED_BY, POOL_LABEL};
use crate::reason::EventReason;
use cotenant_crds::credentials::{digest, hex, token_digests};
use cotenant_crds::storage::{
    self, COPY_LABEL, COPY_PROBLEM_ANNOTATION, COPY_SOURCE_ANNOTATION, Store,
};
use cotenant_crds::{CallerTokens, GpuPool, SecretName, TokenSecretRef};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, Resource, ResourceExt};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How long the digests of a Secret are used before it is read again.
pub const REFRESH: Duration = Duration::from_secs(10);

/// What reading a Secret gave.
#[derive(Debug)]
pub enum Fetch {
    Found(Box<Secret>),
    Missing,
    Forbidden,
    /// Anything else: the API server may answer next time.
    Failed(String),
}

/// What is known of one Secret key.
#[derive(Debug, Default)]
struct Known {
    /// Digests last read successfully; `Some(empty)` after a permanent failure.
    digests: Option<Vec<String>>,
    read_at: Option<Instant>,
    /// The problem last reported as an Event, so it is reported once, not every round.
    reported: Option<String>,
}

/// The digests of the tokens under `key` of `secret`.
pub fn digests_of(secret: &Secret, key: &str) -> Result<Vec<String>, String> {
    let name = secret.name_any();
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| format!("Secret {name:?} has no key {key:?}"))?;
    let text = std::str::from_utf8(&value.0)
        .map_err(|_| format!("Secret {name:?} key {key:?} is not UTF-8 text"))?;
    token_digests(text).map_err(|e| format!("Secret {name:?} key {key:?}: {e}"))
}

/// Updates what is known of a Secret key with a fresh read; returns a problem to report, if it
/// is new.
fn settle(
    known: &mut Known,
    namespace: &str,
    secret_ref: &TokenSecretRef,
    fetch: Fetch,
) -> Option<String> {
    let name = &secret_ref.name;
    let result = match fetch {
        Fetch::Found(secret) => digests_of(&secret, secret_ref.key()),
        Fetch::Missing => Err(format!("Secret {namespace}/{name} does not exist")),
        Fetch::Forbidden => Err(format!(
            "the operator may not read Secret {namespace}/{name}"
        )),
        Fetch::Failed(why) => {
            // Keep what was last read; with nothing read yet, nobody may call.
            tracing::warn!(secret = %format!("{namespace}/{name}"), error = %why, "could not read a tenant's credentials");
            if known.digests.is_none() {
                known.digests = Some(Vec::new());
            }
            return None;
        }
    };
    known.read_at = Some(Instant::now());
    match result {
        Ok(digests) => {
            known.digests = Some(digests);
            known.reported = None;
            None
        }
        Err(problem) => {
            known.digests = Some(Vec::new());
            let problem = format!("{problem}: no caller is accepted until it is fixed");
            (known.reported.as_ref() != Some(&problem)).then(|| {
                known.reported = Some(problem.clone());
                problem
            })
        }
    }
}

/// What is known of a Secret holding model credentials: its keys the agents may use.
#[derive(Debug, Default)]
struct KnownModelSecret {
    data: Option<Result<BTreeMap<String, Vec<u8>>, String>>,
    read_at: Option<Instant>,
}

/// Reads tenants' Secrets and keeps what they gave between rounds.
pub struct Credentials {
    client: Client,
    known: HashMap<(String, String, String), Known>,
    /// Model credentials Secrets by (namespace, name).
    model_secrets: HashMap<(String, String), KnownModelSecret>,
    /// The model credentials problem last reported per tenant UID.
    model_reported: HashMap<String, String>,
}

/// Name of the copy of tenant `uid`'s model credentials for the agents of `pool`.
pub fn model_copy_name(pool: &str, uid: &str) -> String {
    let id = hex(&digest(format!("{pool}/{uid}").as_bytes()));
    format!("cotenant-model-credentials-{}", &id[..20])
}

/// The keys of a tenant's Secret any object store reads.
fn store_keys(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    let all = [Store::S3, Store::Gcs, Store::Azure];
    secret
        .data
        .iter()
        .flatten()
        .filter(|(k, _)| all.iter().any(|s| s.keys().contains(&k.as_str())))
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// The settings of a model in `store` from its Secret `source` (`namespace/name`), or why it
/// cannot be used.
fn model_settings(
    store: Store,
    source: &str,
    data: &Result<BTreeMap<String, Vec<u8>>, String>,
) -> Result<BTreeMap<String, String>, String> {
    let data = data.as_ref().map_err(Clone::clone)?;
    let settings = storage::settings_from(store, data, &format!("Secret {source}"))?;
    if settings.is_empty() {
        return Err(format!(
            "Secret {source} holds none of the keys a {}... model reads ({})",
            store.scheme(),
            store.keys().join(", ")
        ));
    }
    Ok(settings)
}

/// The copy named `name` in `pool`'s agent namespace of Secret `source`: its settings, or no
/// data and why.
pub fn model_copy(
    pool: &GpuPool,
    name: &str,
    source: &str,
    settings: Result<BTreeMap<String, String>, String>,
) -> Secret {
    let mut copy = Secret::default();
    copy.metadata.name = Some(name.to_string());
    copy.metadata.namespace = Some(pool.spec.agent_namespace.clone());
    copy.metadata.labels = Some(BTreeMap::from([
        (COPY_LABEL.to_string(), "true".to_string()),
        (POOL_LABEL.to_string(), pool.name_any()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            MANAGED_BY.to_string(),
        ),
    ]));
    let mut annotations =
        BTreeMap::from([(COPY_SOURCE_ANNOTATION.to_string(), source.to_string())]);
    copy.metadata.owner_references = pool.controller_owner_ref(&()).map(|mut o| {
        o.block_owner_deletion = None;
        vec![o]
    });
    copy.type_ = Some("Opaque".into());
    match settings {
        Ok(settings) => {
            copy.data = Some(
                settings
                    .into_iter()
                    .map(|(k, v)| (k, ByteString(v.into_bytes())))
                    .collect(),
            );
        }
        Err(problem) => {
            annotations.insert(COPY_PROBLEM_ANNOTATION.to_string(), problem);
        }
    }
    copy.metadata.annotations = Some(annotations);
    copy
}

impl Credentials {
    pub fn new(client: Client) -> Credentials {
        Credentials {
            client,
            known: HashMap::new(),
            model_secrets: HashMap::new(),
            model_reported: HashMap::new(),
        }
    }

    /// Points every assignment of a tenant naming a model `credentialsSecret` at the copy of it
    /// in `pool`'s agent namespace, and returns the copies that namespace must hold; records an
    /// Event on each tenant whose Secret cannot be used.
    pub async fn model_copies(&mut self, pool: &GpuPool, outcome: &mut PoolOutcome) -> Vec<Secret> {
        let pool_name = pool.name_any();
        let mut copies: BTreeMap<String, Secret> = BTreeMap::new();
        for t in &mut outcome.tenants {
            let model = &t.tenant.spec.model;
            let (Some(secret), Some(store)) =
                (&model.credentials_secret, Store::of_uri(&model.uri))
            else {
                continue;
            };
            let uid = t.tenant.uid().unwrap_or_default();
            let assigned = outcome
                .assignments
                .values()
                .flatten()
                .any(|a| a.tenant.uid == uid);
            if !assigned {
                continue;
            }
            let namespace = t.tenant.namespace().unwrap_or_default();
            let source = format!("{namespace}/{}", secret.name);
            let data = self.model_secret(&namespace, &secret.name).await;
            let settings = model_settings(store, &source, &data);
            match &settings {
                Ok(_) => {
                    self.model_reported.remove(&uid);
                }
                Err(problem) if self.model_reported.get(&uid) != Some(problem) => {
                    self.model_reported.insert(uid.clone(), problem.clone());
                    t.events.push(EventToRecord {
                        reason: EventReason::ModelCredentialsUnavailable,
                        message: format!(
                            "{problem}: the model cannot be downloaded until it is fixed"
                        ),
                    });
                }
                Err(_) => {}
            }
            let name = model_copy_name(&pool_name, &uid);
            copies.insert(uid, model_copy(pool, &name, &source, settings));
        }
        for a in outcome.assignments.values_mut().flatten() {
            if let Some(copy) = copies.get(&a.tenant.uid) {
                a.model.credentials_secret = Some(SecretName {
                    name: copy.name_any(),
                });
            }
        }
        copies.into_values().collect()
    }

    /// The store keys of a tenant's model credentials Secret, read again when older than
    /// [`REFRESH`]; a read that fails for a moment keeps what was last read.
    async fn model_secret(
        &mut self,
        namespace: &str,
        name: &str,
    ) -> Result<BTreeMap<String, Vec<u8>>, String> {
        let key = (namespace.to_string(), name.to_string());
        let known = self.model_secrets.entry(key).or_default();
        let fresh = known.read_at.is_some_and(|at| at.elapsed() < REFRESH);
        if !fresh {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
            let read = match api.get_opt(name).await {
                Ok(Some(secret)) => Ok(store_keys(&secret)),
                Ok(None) => Err(format!("Secret {namespace}/{name} does not exist")),
                Err(kube::Error::Api(e)) if e.code == 403 => Err(format!(
                    "the operator may not read Secret {namespace}/{name}"
                )),
                Err(e) => {
                    tracing::warn!(secret = %format!("{namespace}/{name}"), error = %e, "could not read a tenant's model credentials");
                    return known.data.clone().unwrap_or_else(|| {
                        Err(format!(
                            "Secret {namespace}/{name} could not be read yet: {e}"
                        ))
                    });
                }
            };
            known.data = Some(read);
            known.read_at = Some(Instant::now());
        }
        known
            .data
            .clone()
            .unwrap_or_else(|| Err(format!("Secret {namespace}/{name} was not read")))
    }

    /// Sets the credentials of every assignment in `outcome` from its tenant's Secret, and records
    /// an Event on each tenant whose Secret cannot be used.
    pub async fn apply(&mut self, outcome: &mut PoolOutcome) {
        let mut by_uid: HashMap<String, Option<CallerTokens>> = HashMap::new();
        for t in &mut outcome.tenants {
            let uid = t.tenant.uid().unwrap_or_default();
            let Some(credentials) = &t.tenant.spec.credentials else {
                by_uid.insert(uid, None);
                continue;
            };
            let namespace = t.tenant.namespace().unwrap_or_default();
            let secret_ref = &credentials.secret_ref;
            let (digests, problem) = self.resolve(&namespace, secret_ref).await;
            if let Some(message) = problem {
                t.events.push(EventToRecord {
                    reason: EventReason::CredentialsUnavailable,
                    message,
                });
            }
            by_uid.insert(
                uid,
                Some(CallerTokens {
                    token_sha256: digests,
                }),
            );
        }
        for a in outcome.assignments.values_mut().flatten() {
            if let Some(tokens) = by_uid.get(&a.tenant.uid) {
                a.credentials = tokens.clone();
            }
        }
    }

    /// The digests of a tenant's Secret key, read again when older than [`REFRESH`], and a
    /// problem to report if there is a new one.
    async fn resolve(
        &mut self,
        namespace: &str,
        secret_ref: &TokenSecretRef,
    ) -> (Vec<String>, Option<String>) {
        let key = (
            namespace.to_string(),
            secret_ref.name.clone(),
            secret_ref.key().to_string(),
        );
        let fresh = self
            .known
            .get(&key)
            .and_then(|k| k.read_at)
            .is_some_and(|at| at.elapsed() < REFRESH);
        let known = self.known.entry(key).or_default();
        let problem = if fresh {
            None
        } else {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
            let fetch = match api.get_opt(&secret_ref.name).await {
                Ok(Some(secret)) => Fetch::Found(Box::new(secret)),
                Ok(None) => Fetch::Missing,
                Err(kube::Error::Api(e)) if e.code == 403 => Fetch::Forbidden,
                Err(e) => Fetch::Failed(e.to_string()),
            };
            settle(known, namespace, secret_ref, fetch)
        };
        (known.digests.clone().unwrap_or_default(), problem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn secret(key: &str, value: &[u8]) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some("callers".into());
        s.data = Some(BTreeMap::from([(
            key.to_string(),
            ByteString(value.to_vec()),
        )]));
        s
    }

    fn reference(key: Option<&str>) -> TokenSecretRef {
        TokenSecretRef {
            name: "callers".into(),
            key: key.map(str::to_string),
        }
    }

    #[test]
    fn tokens_become_digests_and_the_default_key_is_token() {
        let digests =
            digests_of(&secret("token", TOKEN.as_bytes()), reference(None).key()).expect("digests");
        assert_eq!(digests, token_digests(TOKEN).expect("token"));
        assert!(!digests[0].contains(TOKEN));
        let e = digests_of(&secret("other", TOKEN.as_bytes()), "token").expect_err("key");
        assert!(e.contains("no key \"token\""), "{e}");
        let e = digests_of(&secret("token", b"short"), "token").expect_err("weak");
        assert!(e.contains("at least 32"), "{e}");
        let e = digests_of(&secret("token", &[0xff, 0xfe]), "token").expect_err("binary");
        assert!(e.contains("UTF-8"), "{e}");
    }

    #[test]
    fn it_fails_closed_and_reports_each_problem_once() {
        let r = reference(None);
        let mut known = Known::default();
        let problem = settle(&mut known, "team-a", &r, Fetch::Missing).expect("reported");
        assert!(
            problem.contains("team-a/callers does not exist"),
            "{problem}"
        );
        assert_eq!(known.digests, Some(vec![]), "nobody may call");
        assert_eq!(
            settle(&mut known, "team-a", &r, Fetch::Missing),
            None,
            "once"
        );
        let problem = settle(&mut known, "team-a", &r, Fetch::Forbidden).expect("new problem");
        assert!(problem.contains("may not read"), "{problem}");

        let good = Fetch::Found(Box::new(secret("token", TOKEN.as_bytes())));
        assert_eq!(settle(&mut known, "team-a", &r, good), None);
        let digests = known.digests.clone().expect("digests");
        assert_eq!(digests.len(), 1);
        // A passing failure keeps the digests; a later permanent one is reported again.
        assert_eq!(
            settle(&mut known, "team-a", &r, Fetch::Failed("timeout".into())),
            None
        );
        assert_eq!(known.digests, Some(digests));
        assert!(settle(&mut known, "team-a", &r, Fetch::Missing).is_some());
    }

    fn pool() -> GpuPool {
        let mut pool = GpuPool::new(
            "gpus",
            serde_json::from_value(serde_json::json!({
                "agentNamespace": "agents",
                "template": {"image": "a"}
            }))
            .expect("pool spec"),
        );
        pool.metadata.uid = Some("pool-uid".into());
        pool
    }

    fn data(pairs: &[(&str, &str)]) -> Result<BTreeMap<String, Vec<u8>>, String> {
        Ok(pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect())
    }

    #[test]
    fn model_copies_hold_only_the_stores_keys_and_say_why_when_unusable() {
        let mut secret = secret("AWS_ACCESS_KEY_ID", b"id");
        secret.data.get_or_insert_default().extend([
            (
                "AWS_SECRET_ACCESS_KEY".to_string(),
                ByteString(b"key\n".to_vec()),
            ),
            (
                "ssh-privatekey".to_string(),
                ByteString(b"unrelated".to_vec()),
            ),
        ]);
        let keys = store_keys(&secret);
        assert_eq!(
            keys.keys().collect::<Vec<_>>(),
            ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        );
        let settings = model_settings(Store::S3, "team-a/s3", &Ok(keys)).expect("usable");
        let pool = pool();
        let name = model_copy_name("gpus", "uid-1");
        assert_eq!(name, model_copy_name("gpus", "uid-1"), "deterministic");
        assert_ne!(name, model_copy_name("gpus", "uid-2"));
        assert!(name.len() <= 63, "{name}");
        let copy = model_copy(&pool, &name, "team-a/s3", Ok(settings));
        assert_eq!(copy.metadata.namespace.as_deref(), Some("agents"));
        let copied = copy.data.clone().expect("data");
        assert_eq!(copied["AWS_SECRET_ACCESS_KEY"].0, b"key");
        assert!(!copied.contains_key("ssh-privatekey"));
        let labels = copy.metadata.labels.clone().expect("labels");
        assert_eq!(labels[COPY_LABEL], "true");
        assert_eq!(labels[POOL_LABEL], "gpus");
        let owner = &copy.metadata.owner_references.clone().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("GpuPool", "pool-uid")
        );

        for (data, says) in [
            (
                data(&[("AWS_ACCESS_KEY_ID", "id")]),
                "Secret team-a/s3: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is missing",
            ),
            (data(&[("password", "x")]), "holds none of the keys"),
            (
                Err("Secret team-a/s3 does not exist".to_string()),
                "Secret team-a/s3 does not exist",
            ),
        ] {
            let problem = model_settings(Store::S3, "team-a/s3", &data).expect_err(says);
            assert!(problem.contains(says), "{problem}");
            let copy = model_copy(&pool, &name, "team-a/s3", Err(problem.clone()));
            assert!(copy.data.is_none());
            let annotations = copy.metadata.annotations.expect("annotations");
            assert_eq!(annotations[COPY_PROBLEM_ANNOTATION], problem);
            assert_eq!(annotations[COPY_SOURCE_ANNOTATION], "team-a/s3");
        }
    }

    #[test]
    fn a_passing_failure_before_any_read_admits_nobody() {
        let mut known = Known::default();
        settle(
            &mut known,
            "ns",
            &reference(None),
            Fetch::Failed("timeout".into()),
        );
        assert_eq!(known.digests, Some(vec![]));
    }
}
