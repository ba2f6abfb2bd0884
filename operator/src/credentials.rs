//! Tenants' caller credentials: for a tenant naming a Secret (`spec.credentials.secretRef`), the
//! operator reads the Secret (`get` only, never list or watch), turns its tokens into SHA-256
//! digests and writes them into every assignment of the tenant, so agents can refuse callers
//! without a token while the tokens themselves never leave the Secret.
//!
//! It fails closed: a Secret that is missing, unreadable or holds no usable token gives the
//! tenant an empty digest list (nobody may call) and an Event saying why. A read that fails for
//! a moment (a timeout, an API server error) keeps the digests last read. Each Secret is read
//! again at most every [`REFRESH`], which bounds how long a rotated token takes to apply.

use crate::decide::{Note, PoolOutcome};
use cotenant_crds::credentials::token_digests;
use cotenant_crds::{CallerTokens, TokenSecretRef};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long the digests of a Secret are used before it is read again.
pub const REFRESH: Duration = Duration::from_secs(10);

/// The Event a tenant gets when its credentials cannot be used.
const REASON: &str = "CredentialsUnavailable";

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

/// Reads tenants' Secrets and keeps their digests between rounds.
pub struct Credentials {
    client: Client,
    known: HashMap<(String, String, String), Known>,
}

impl Credentials {
    pub fn new(client: Client) -> Credentials {
        Credentials {
            client,
            known: HashMap::new(),
        }
    }

    /// Sets the credentials of every assignment in `outcome` from its tenant's Secret, and notes
    /// each tenant whose Secret cannot be used.
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
                t.notes.push(Note {
                    reason: REASON,
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
