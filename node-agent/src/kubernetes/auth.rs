//! Who may read `/report` in Kubernetes mode: the bearer token goes to the API server as a
//! TokenReview for the report audience, and is accepted when it authenticates as the operator's
//! ServiceAccount. Accepted tokens are remembered for a minute (by their SHA-256, never the token
//! itself) so the operator's scrapes do not each cost a review.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an accepted token is trusted without another review.
const CACHE_FOR: Duration = Duration::from_secs(60);
/// Accepted tokens remembered at once.
const CACHE_ENTRIES: usize = 64;
/// The ServiceAccount name accepted from any namespace when no reader is configured.
pub const OPERATOR_ACCOUNT: &str = "cotenant-operator";

/// Whose tokens may read the report.
#[derive(Clone, Debug, PartialEq)]
pub enum Reader {
    /// Exactly this username, e.g. `system:serviceaccount:cotenant-system:cotenant-operator`.
    User(String),
    /// A ServiceAccount of this name in any namespace.
    ServiceAccountNamed(String),
}

impl Reader {
    fn allows(&self, username: &str) -> bool {
        match self {
            Reader::User(user) => username == user,
            Reader::ServiceAccountNamed(name) => username
                .strip_prefix("system:serviceaccount:")
                .and_then(|rest| rest.split_once(':'))
                .is_some_and(|(namespace, account)| !namespace.is_empty() && account == name),
        }
    }
}

/// Checks report tokens with TokenReview.
pub struct Reviewer {
    api: Api<TokenReview>,
    audience: String,
    reader: Reader,
    accepted: Mutex<HashMap<Vec<u8>, Instant>>,
}

impl Reviewer {
    pub fn new(client: kube::Client, audience: String, reader: Reader) -> Reviewer {
        Reviewer {
            api: Api::all(client),
            audience,
            reader,
            accepted: Mutex::new(HashMap::new()),
        }
    }

    /// Ok when `token` may read the report; otherwise why not.
    pub async fn check(&self, token: &str) -> Result<(), String> {
        let key = Sha256::digest(token.as_bytes()).to_vec();
        let now = Instant::now();
        {
            let mut accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
            match accepted.get(&key) {
                Some(at) if now.duration_since(*at) < CACHE_FOR => return Ok(()),
                Some(_) => {
                    accepted.remove(&key);
                }
                None => {}
            }
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let reviewed = self
            .api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed");
                format!("the token could not be reviewed: {e}")
            })?;
        decide(reviewed.status.as_ref(), &self.audience, &self.reader)?;
        let mut accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        accepted.retain(|_, at| now.duration_since(*at) < CACHE_FOR);
        if accepted.len() >= CACHE_ENTRIES
            && let Some(oldest) = accepted
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone())
        {
            accepted.remove(&oldest);
        }
        accepted.insert(key, now);
        Ok(())
    }
}

/// The decision on a review's answer.
fn decide(
    status: Option<&TokenReviewStatus>,
    audience: &str,
    reader: &Reader,
) -> Result<(), String> {
    let status = status.ok_or("the TokenReview came back without a status")?;
    if status.authenticated != Some(true) {
        return Err(match status.error.as_deref() {
            Some(error) if !error.is_empty() => format!("the token is not authenticated: {error}"),
            _ => "the token is not authenticated".to_string(),
        });
    }
    if !status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|a| a == audience))
    {
        return Err(format!("the token is not for audience {audience:?}"));
    }
    let username = status
        .user
        .as_ref()
        .and_then(|u| u.username.as_deref())
        .unwrap_or_default();
    if !reader.allows(username) {
        return Err(format!("{username:?} may not read the report"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;

    fn status(authenticated: bool, user: &str, audiences: &[&str]) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
            user: Some(UserInfo {
                username: Some(user.to_string()),
                ..Default::default()
            }),
            error: None,
        }
    }

    const OPERATOR: &str = "system:serviceaccount:cotenant-system:cotenant-operator";

    #[test]
    fn the_operator_account_with_the_audience_is_accepted() {
        let by_name = Reader::ServiceAccountNamed(OPERATOR_ACCOUNT.into());
        let exact = Reader::User(OPERATOR.into());
        let ok = status(true, OPERATOR, &["cotenant.dev/agent-report"]);
        assert_eq!(
            decide(Some(&ok), "cotenant.dev/agent-report", &by_name),
            Ok(())
        );
        assert_eq!(
            decide(Some(&ok), "cotenant.dev/agent-report", &exact),
            Ok(())
        );
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        let by_name = Reader::ServiceAccountNamed(OPERATOR_ACCOUNT.into());
        let audience = "cotenant.dev/agent-report";
        let cases = [
            status(false, OPERATOR, &[audience]),
            status(true, OPERATOR, &["https://kubernetes.default.svc"]),
            status(true, "system:serviceaccount:x:default", &[audience]),
            status(
                true,
                "system:serviceaccount::cotenant-operator",
                &[audience],
            ),
            status(true, "cotenant-operator", &[audience]),
            status(
                true,
                "system:serviceaccount:x:cotenant-operator-2",
                &[audience],
            ),
        ];
        for case in &cases {
            assert!(decide(Some(case), audience, &by_name).is_err(), "{case:?}");
        }
        assert!(decide(None, audience, &by_name).is_err());
        let other_namespace = status(
            true,
            "system:serviceaccount:x:cotenant-operator",
            &[audience],
        );
        assert!(
            decide(
                Some(&other_namespace),
                audience,
                &Reader::User(OPERATOR.into())
            )
            .is_err()
        );
    }
}
