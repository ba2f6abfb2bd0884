//! Who may read `/report` in Kubernetes mode: the bearer token goes to the API server as a
//! TokenReview for the report audience, and is accepted when it authenticates as exactly the
//! operator's user (`system:serviceaccount:<namespace>:<name>`, set on the agent pod by the
//! operator from the chart's values; there is no default).
//!
//! Verdicts are remembered by the token's SHA-256, never the token: an accepted token for a
//! minute, so the operator's scrapes do not each cost a review; a refused one for ten minutes.
//! Reviews of tokens not remembered are rate-limited (a token bucket), so a flood of made-up
//! tokens costs the API server a few reviews a second, not one per request.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an accepted token is trusted without another review.
const ACCEPTED_FOR: Duration = Duration::from_secs(60);
/// How long a refused token is refused without another review.
const REFUSED_FOR: Duration = Duration::from_secs(600);
/// Accepted tokens remembered at once (the operator presents one, two around a rotation).
const ACCEPTED_ENTRIES: usize = 64;
/// Refused tokens remembered at once; the oldest is forgotten first.
const REFUSED_ENTRIES: usize = 4096;
/// Reviews of unknown tokens allowed in a burst, and refilled per second after it.
const REVIEW_BURST: f64 = 8.0;
const REVIEWS_PER_SECOND: f64 = 1.0;
/// A longer bearer token is refused unreviewed (ServiceAccount tokens are about 1 KiB).
const MAX_TOKEN_BYTES: usize = 16 << 10;

/// Checks report tokens with TokenReview.
pub struct Reviewer {
    api: Api<TokenReview>,
    audience: String,
    /// The only username allowed, exactly.
    reader: String,
    gate: Mutex<Gate>,
}

impl Reviewer {
    pub fn new(client: kube::Client, audience: String, reader: String) -> Reviewer {
        Reviewer {
            api: Api::all(client),
            audience,
            reader,
            gate: Mutex::new(Gate::new(Instant::now())),
        }
    }

    /// Ok when `token` may read the report; otherwise why not.
    pub async fn check(&self, token: &str) -> Result<(), String> {
        checked(
            &self.gate,
            token,
            Instant::now(),
            &self.audience,
            &self.reader,
            |token| self.review(token),
        )
        .await
    }

    /// Asks the API server whose token `token` is.
    async fn review(&self, token: String) -> Result<Option<TokenReviewStatus>, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        match self.api.create(&PostParams::default(), &review).await {
            Ok(reviewed) => Ok(reviewed.status),
            Err(e) => {
                tracing::warn!(error = %e, "TokenReview failed");
                Err(format!("the token could not be reviewed: {e}"))
            }
        }
    }
}

/// The check with the review as a parameter: the gate decides whether `review` is called at
/// all, and remembers its verdict (but not a failure to review, which may pass).
async fn checked<F, Fut>(
    gate: &Mutex<Gate>,
    token: &str,
    now: Instant,
    audience: &str,
    reader: &str,
    review: F,
) -> Result<(), String>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<Option<TokenReviewStatus>, String>>,
{
    if token.len() > MAX_TOKEN_BYTES {
        return Err(format!("the token is longer than {MAX_TOKEN_BYTES} bytes"));
    }
    let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    let lock = || gate.lock().unwrap_or_else(|e| e.into_inner());
    match lock().admit(&key, now) {
        Admission::Accepted => return Ok(()),
        Admission::Refused(why) => return Err(why),
        Admission::Throttled => {
            return Err("too many unknown tokens: try again in a few seconds".to_string());
        }
        Admission::Review => {}
    }
    let status = review(token.to_string()).await?;
    let verdict = decide(status.as_ref(), audience, reader);
    lock().remember(key, now, &verdict);
    verdict
}

/// What to do with a presented token.
#[derive(Debug, Clone, PartialEq)]
enum Admission {
    /// Accepted recently.
    Accepted,
    /// Refused recently, with the reason given then.
    Refused(String),
    /// Unknown, and the review budget allows asking the API server.
    Review,
    /// Unknown, and the review budget is spent.
    Throttled,
}

/// Remembered verdicts and the review budget.
#[derive(Debug)]
struct Gate {
    accepted: HashMap<[u8; 32], Instant>,
    refused: HashMap<[u8; 32], (Instant, String)>,
    /// Reviews available now, and when that was counted.
    budget: f64,
    counted_at: Instant,
}

impl Gate {
    fn new(now: Instant) -> Gate {
        Gate {
            accepted: HashMap::new(),
            refused: HashMap::new(),
            budget: REVIEW_BURST,
            counted_at: now,
        }
    }

    fn admit(&mut self, key: &[u8; 32], now: Instant) -> Admission {
        if let Some(at) = self.accepted.get(key) {
            if now.saturating_duration_since(*at) < ACCEPTED_FOR {
                return Admission::Accepted;
            }
            self.accepted.remove(key);
        }
        if let Some((at, why)) = self.refused.get(key) {
            if now.saturating_duration_since(*at) < REFUSED_FOR {
                return Admission::Refused(why.clone());
            }
            self.refused.remove(key);
        }
        let elapsed = now.saturating_duration_since(self.counted_at).as_secs_f64();
        self.budget = (self.budget + elapsed * REVIEWS_PER_SECOND).min(REVIEW_BURST);
        self.counted_at = now;
        if self.budget >= 1.0 {
            self.budget -= 1.0;
            Admission::Review
        } else {
            Admission::Throttled
        }
    }

    fn remember(&mut self, key: [u8; 32], now: Instant, verdict: &Result<(), String>) {
        match verdict {
            Ok(()) => {
                self.accepted
                    .retain(|_, at| now.saturating_duration_since(*at) < ACCEPTED_FOR);
                evict_oldest(&mut self.accepted, ACCEPTED_ENTRIES, |at| *at);
                self.accepted.insert(key, now);
            }
            Err(why) => {
                self.refused
                    .retain(|_, (at, _)| now.saturating_duration_since(*at) < REFUSED_FOR);
                evict_oldest(&mut self.refused, REFUSED_ENTRIES, |(at, _)| *at);
                self.refused.insert(key, (now, why.clone()));
            }
        }
    }
}

/// Makes room for one more entry in `map` of at most `max` entries.
fn evict_oldest<V>(map: &mut HashMap<[u8; 32], V>, max: usize, at: impl Fn(&V) -> Instant) {
    if map.len() < max {
        return;
    }
    if let Some(oldest) = map.iter().min_by_key(|(_, v)| at(v)).map(|(k, _)| *k) {
        map.remove(&oldest);
    }
}

/// The decision on a review's answer.
fn decide(status: Option<&TokenReviewStatus>, audience: &str, reader: &str) -> Result<(), String> {
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
    if username != reader {
        return Err(format!("{username:?} may not read the report"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use std::sync::atomic::{AtomicUsize, Ordering};

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
    const AUDIENCE: &str = cotenant_crds::report::REPORT_AUDIENCE;

    #[test]
    fn the_operator_account_with_the_audience_is_accepted() {
        let ok = status(true, OPERATOR, &[AUDIENCE]);
        assert_eq!(decide(Some(&ok), AUDIENCE, OPERATOR), Ok(()));
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        let cases = [
            status(false, OPERATOR, &[AUDIENCE]),
            status(true, OPERATOR, &["https://kubernetes.default.svc"]),
            status(true, "system:serviceaccount:x:default", &[AUDIENCE]),
            status(
                true,
                "system:serviceaccount::cotenant-operator",
                &[AUDIENCE],
            ),
            status(true, "cotenant-operator", &[AUDIENCE]),
            status(
                true,
                "system:serviceaccount:x:cotenant-operator-2",
                &[AUDIENCE],
            ),
            // The operator's account name in another namespace is someone else.
            status(
                true,
                "system:serviceaccount:x:cotenant-operator",
                &[AUDIENCE],
            ),
        ];
        for case in &cases {
            assert!(decide(Some(case), AUDIENCE, OPERATOR).is_err(), "{case:?}");
        }
        assert!(decide(None, AUDIENCE, OPERATOR).is_err());
    }

    /// Runs `checked` with a review that counts its calls and answers `answer`.
    async fn check(
        gate: &Mutex<Gate>,
        token: &str,
        now: Instant,
        reviews: &AtomicUsize,
        answer: Result<TokenReviewStatus, String>,
    ) -> Result<(), String> {
        checked(gate, token, now, AUDIENCE, OPERATOR, |_| async {
            reviews.fetch_add(1, Ordering::Relaxed);
            answer.map(Some)
        })
        .await
    }

    fn refused() -> Result<TokenReviewStatus, String> {
        Ok(status(false, "", &[]))
    }

    #[tokio::test]
    async fn a_refused_token_is_not_reviewed_again() {
        let t0 = Instant::now();
        let gate = Mutex::new(Gate::new(t0));
        let reviews = AtomicUsize::new(0);
        for i in 0..100 {
            let at = t0 + Duration::from_millis(i * 100);
            let e = check(&gate, "bad", at, &reviews, refused()).await;
            assert!(e.is_err_and(|e| e.contains("not authenticated")));
        }
        assert_eq!(reviews.load(Ordering::Relaxed), 1);
        // After the negative cache's time it is reviewed once more.
        let later = t0 + REFUSED_FOR + Duration::from_secs(1);
        assert!(
            check(&gate, "bad", later, &reviews, refused())
                .await
                .is_err()
        );
        assert_eq!(reviews.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_flood_of_unknown_tokens_costs_a_few_reviews_a_second() {
        let t0 = Instant::now();
        let gate = Mutex::new(Gate::new(t0));
        let reviews = AtomicUsize::new(0);
        let mut throttled = 0;
        // 1000 distinct made-up tokens within ten seconds.
        for i in 0..1000u64 {
            let at = t0 + Duration::from_millis(i * 10);
            let e = check(&gate, &format!("made-up-{i}"), at, &reviews, refused()).await;
            if e.is_err_and(|e| e.contains("too many")) {
                throttled += 1;
            }
        }
        let allowed = REVIEW_BURST + 10.0 * REVIEWS_PER_SECOND;
        assert!(reviews.load(Ordering::Relaxed) as f64 <= allowed);
        assert_eq!(throttled + reviews.load(Ordering::Relaxed), 1000);
        // The budget comes back: the operator's token is reviewed and accepted a while later.
        let later = t0 + Duration::from_secs(30);
        let ok = Ok(status(true, OPERATOR, &[AUDIENCE]));
        assert_eq!(check(&gate, "operator", later, &reviews, ok).await, Ok(()));
    }

    #[tokio::test]
    async fn an_accepted_token_is_reviewed_once_a_minute() {
        let t0 = Instant::now();
        let gate = Mutex::new(Gate::new(t0));
        let reviews = AtomicUsize::new(0);
        let ok = || Ok(status(true, OPERATOR, &[AUDIENCE]));
        for i in 0..30 {
            let at = t0 + Duration::from_secs(2 * i);
            assert_eq!(check(&gate, "op", at, &reviews, ok()).await, Ok(()));
        }
        assert_eq!(reviews.load(Ordering::Relaxed), 1);
        let later = t0 + ACCEPTED_FOR + Duration::from_secs(1);
        assert_eq!(check(&gate, "op", later, &reviews, ok()).await, Ok(()));
        assert_eq!(reviews.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_review_that_failed_is_not_remembered_as_a_refusal() {
        let t0 = Instant::now();
        let gate = Mutex::new(Gate::new(t0));
        let reviews = AtomicUsize::new(0);
        let down = Err("connection refused".to_string());
        assert!(check(&gate, "op", t0, &reviews, down).await.is_err());
        let ok = Ok(status(true, OPERATOR, &[AUDIENCE]));
        let at = t0 + Duration::from_secs(2);
        assert_eq!(check(&gate, "op", at, &reviews, ok).await, Ok(()));
        assert_eq!(reviews.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn an_oversized_token_is_refused_unreviewed() {
        let t0 = Instant::now();
        let gate = Mutex::new(Gate::new(t0));
        let reviews = AtomicUsize::new(0);
        let huge = "x".repeat(MAX_TOKEN_BYTES + 1);
        assert!(check(&gate, &huge, t0, &reviews, refused()).await.is_err());
        assert_eq!(reviews.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_refused_tokens_remembered_are_bounded() {
        let t0 = Instant::now();
        let mut gate = Gate::new(t0);
        for i in 0..(REFUSED_ENTRIES as u32 + 100) {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_le_bytes());
            gate.remember(
                key,
                t0 + Duration::from_millis(u64::from(i)),
                &Err("no".into()),
            );
        }
        assert_eq!(gate.refused.len(), REFUSED_ENTRIES);
    }
}
