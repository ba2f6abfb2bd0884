//! Which tenant a request names, and whether its caller may use it. A tenant that requires
//! tokens answers a caller without a valid one 401, whatever state it is in; and on an agent that
//! holds any such tenant, a name that resolves to nothing answers the same 401, so an
//! unauthenticated caller cannot tell a guarded tenant from a missing one.

use super::AppState;
use super::error::ApiError;
use crate::registry::Entry;
use axum::http::{HeaderMap, StatusCode};
use std::sync::Arc;

/// The one answer every refused or unresolvable request gets where some tenant is guarded.
const UNAUTHORIZED: &str =
    "this model needs a valid bearer token (Authorization: Bearer <token>), or does not exist here";

/// The tenant `model` names, if the request may use it.
pub fn tenant(app: &AppState, model: &str, headers: &HeaderMap) -> Result<Arc<Entry>, ApiError> {
    match app.registry.resolve(model) {
        Ok(entry) => match &entry.tokens {
            Some(tokens) if !tokens.admit(headers) => Err(ApiError::unauthorized(UNAUTHORIZED)),
            _ => Ok(entry),
        },
        Err(_) if app.registry.guards_any() => Err(ApiError::unauthorized(UNAUTHORIZED)),
        Err(message) => Err(match app.registry.departed(model) {
            // One that left this agent moments ago is 503 (a client's route to it is stale and
            // will follow), one never held here 404.
            Some(ago) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "model {model:?} moved off this agent {:.0} s ago; retry, the route is being updated",
                    ago.as_secs_f64()
                ),
            )
            .retry_after(1),
            None => ApiError::new(StatusCode::NOT_FOUND, message),
        }),
    }
}
