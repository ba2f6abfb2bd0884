//! The routers as clients see them, with tenants in the states that need no model: which
//! listener serves what, what a guarded tenant tells a caller without its token, and what a
//! failed tenant tells anyone.

use super::*;
use crate::credentials::TenantTokens;
use crate::registry::{Entry, State};
use axum::body::Body;
use axum::http::{Method, Request};
use tower::ServiceExt;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn app(entries: Vec<Entry>) -> Arc<AppState> {
    let registry = Arc::new(Registry::default());
    for e in entries {
        registry.put(e);
    }
    Arc::new(AppState {
        registry,
        report_auth: ReportAuth::Token(Some("report-token".into())),
        initialised: AtomicBool::new(true),
        draining: AtomicBool::new(false),
        budget: Budget::new(64 << 20, 32 << 20),
        limits: Limits {
            body_timeout: Duration::from_secs(5),
            answer_timeout: Duration::from_secs(5),
        },
    })
}

fn guarded(name: &str, state: State) -> Entry {
    Entry {
        state,
        tokens: Some(TenantTokens::parse(TOKEN).expect("token")),
        ..Entry::loading(name, "file:///models/secret/m.onnx", 100.0, 99.0)
    }
}

fn failed(name: &str) -> Entry {
    Entry {
        state: State::Failed(
            "cannot read /models/team-a/resnet.onnx: No such file or directory".into(),
        ),
        ..Entry::loading(name, "file:///models/team-a/resnet.onnx", 100.0, 99.0)
    }
}

/// Sends one request; returns the status, the headers and the body as text.
async fn send(
    router: Router,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut request = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(Body::from(body.to_string())).expect("request");
    let response = router.oneshot(request).await.expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

#[tokio::test]
async fn metrics_are_served_on_the_admin_listener_only() {
    let state = app(vec![failed("a")]);
    let (status, _, _) = send(
        inference_router(state.clone()),
        Method::GET,
        "/metrics",
        &[],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, body) = send(
        admin_router(state.clone()),
        Method::GET,
        "/metrics",
        &[],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("cotenant_agent_tenant_state"), "{body}");
    assert!(body.contains("cotenant_agent_inflight_bytes 0"), "{body}");
    // Standalone's single listener keeps both.
    let (status, _, _) = send(router(state), Method::GET, "/metrics", &[], "").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_failed_tenant_does_not_tell_callers_where_its_model_is() {
    let state = app(vec![failed("a")]);
    for (method, path) in [
        (Method::POST, "/v2/models/a/infer"),
        (Method::GET, "/v2/models/a"),
        (Method::GET, "/v2/models/a/ready"),
    ] {
        let (_, _, body) = send(inference_router(state.clone()), method, path, &[], "{}").await;
        assert!(
            !body.contains("/models/") && !body.contains("resnet.onnx") && !body.contains("file:"),
            "{path}: {body}"
        );
    }
    let (status, _, body) = send(
        inference_router(state),
        Method::POST,
        "/v2/models/a/infer",
        &[],
        "{}",
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("failed to load"), "{body}");
}

#[tokio::test]
async fn a_guarded_tenant_answers_401_to_callers_without_its_token() {
    let state = app(vec![
        guarded("team-a.secret", State::Loading),
        failed("team-b.open"),
    ]);
    let wrong = format!("Bearer {TOKEN}-not");
    let right = format!("Bearer {TOKEN}");
    for (method, path) in [
        (Method::POST, "/v2/models/team-a.secret/infer"),
        (Method::POST, "/v2/models/team-a.secret/versions/1/infer"),
        (Method::GET, "/v2/models/team-a.secret"),
        (Method::GET, "/v2/models/team-a.secret/ready"),
    ] {
        for headers in [vec![], vec![("authorization", wrong.as_str())]] {
            let (status, head, body) = send(
                inference_router(state.clone()),
                method.clone(),
                path,
                &headers,
                "{}",
            )
            .await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{path} {headers:?}: {body}"
            );
            assert!(head.contains_key("www-authenticate"), "{path}");
            assert!(
                !body.contains("Loading") && !body.contains("/models/"),
                "{body}"
            );
        }
        // With the token the request reaches the tenant, which is still loading.
        let (status, _, body) = send(
            inference_router(state.clone()),
            method,
            path,
            &[("authorization", right.as_str())],
            "{}",
        )
        .await;
        assert_ne!(status, StatusCode::UNAUTHORIZED, "{path}: {body}");
    }
    // The token of one tenant opens no other; an open tenant needs none.
    let (status, _, _) = send(
        inference_router(state.clone()),
        Method::GET,
        "/v2/models/team-b.open",
        &[],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn unknown_names_cannot_be_told_from_guarded_ones() {
    let guarded_agent = app(vec![guarded("team-a.secret", State::Loading)]);
    let (status, _, missing) = send(
        inference_router(guarded_agent.clone()),
        Method::POST,
        "/v2/models/team-z.nothing/infer",
        &[],
        "{}",
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (_, _, secret) = send(
        inference_router(guarded_agent.clone()),
        Method::POST,
        "/v2/models/team-a.secret/infer",
        &[],
        "{}",
    )
    .await;
    assert_eq!(missing, secret, "the same answer for both");
    // An agent with no guarded tenant still says 404.
    let open_agent = app(vec![failed("team-b.open")]);
    let (status, _, _) = send(
        inference_router(open_agent),
        Method::POST,
        "/v2/models/team-z.nothing/infer",
        &[],
        "{}",
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A guarded tenant that left recently stays indistinguishable.
    guarded_agent.registry.remove("team-a.secret");
    let (status, _, _) = send(
        inference_router(guarded_agent),
        Method::POST,
        "/v2/models/team-a.secret/infer",
        &[],
        "{}",
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_path_that_does_not_decode_is_a_json_400() {
    let state = app(vec![failed("a")]);
    let (status, _, body) = send(
        inference_router(state),
        Method::GET,
        "/v2/models/%FF%FE/ready",
        &[],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("\"error\""), "{body}");
}
