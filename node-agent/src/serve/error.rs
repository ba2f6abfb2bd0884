//! Errors as the Open Inference Protocol returns them: a status code and `{"error": "..."}`.
//! Messages speak about the request; where a model lives and the agent's own paths stay in the
//! agent's log.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// A request that failed, with the status a client acts on.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// Seconds after which the client may retry (`Retry-After`), for back-pressure.
    pub retry_after: Option<u32>,
    /// Whether to ask for a bearer token (`WWW-Authenticate`), for 401.
    pub challenge: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
            challenge: false,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// The same error, telling the client when to try again.
    pub fn retry_after(mut self, seconds: u32) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    /// 401 asking for a bearer token.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError {
            challenge: true,
            ..ApiError::new(StatusCode::UNAUTHORIZED, message)
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response();
        let headers = response.headers_mut();
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.challenge {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"cotenant\""),
            );
        }
        response
    }
}
