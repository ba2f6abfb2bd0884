//! Reading a request body: memory grows with the bytes that actually arrive (never from what a
//! header claims), every growth is reserved against the budget first (the oldest body on a full
//! cap waits there for room, see `budget`), and the body must arrive within its deadline and its
//! size limit.
//!
//! Each byte of buffer is reserved [`RESERVED_PER_BYTE`] times: once for itself and twice for the
//! tensors it will decode to (FP32 data as JSON text decodes to about twice its size, binary to
//! its own). So concurrent large bodies are refused while they arrive, leaving room for the ones
//! kept to be decoded, rather than all being taken in and none having room left to decode.

use super::budget::Reservation;
use super::error::ApiError;
use axum::body::Body;
use axum::http::StatusCode;
use futures::StreamExt;
use tokio::time::Instant;

/// The first buffer a body gets; it then at most doubles per growth.
const FIRST_BUFFER: usize = 16 << 10;

/// Bytes of budget reserved per byte of body buffer: the buffer and room for its tensors.
pub const RESERVED_PER_BYTE: u64 = 3;

/// Reads `body` whole. `declared` is its Content-Length, if any: the buffer never grows past it,
/// but nothing is allocated for it before the bytes arrive.
pub async fn read(
    body: Body,
    declared: Option<u64>,
    max: usize,
    deadline: Instant,
    reservation: &mut Reservation,
) -> Result<Vec<u8>, ApiError> {
    let ceiling = declared
        .and_then(|d| usize::try_from(d).ok())
        .map_or(max, |d| d.min(max));
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body did not arrive in time ({} bytes received)",
                        buf.len()
                    ),
                )
            })?;
        let Some(chunk) = next else {
            return Ok(buf);
        };
        let chunk = chunk
            .map_err(|e| ApiError::bad_request(format!("the request body was cut off: {e}")))?;
        let len = buf.len() + chunk.len();
        if len > max {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body exceeds {max} bytes"),
            ));
        }
        if len > buf.capacity() {
            let target = len
                .max(buf.capacity().saturating_mul(2))
                .max(FIRST_BUFFER)
                .min(ceiling)
                .max(len);
            reservation
                .grow_or_wait(
                    (target - buf.capacity()) as u64 * RESERVED_PER_BYTE,
                    deadline,
                )
                .await?;
            buf.reserve_exact(target - buf.len());
        }
        buf.extend_from_slice(&chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::budget::Budget;
    use std::time::Duration;

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    fn chunked(parts: Vec<Vec<u8>>) -> Body {
        let stream = futures::stream::iter(parts.into_iter().map(Ok::<_, std::io::Error>));
        Body::from_stream(stream)
    }

    #[tokio::test]
    async fn memory_follows_the_bytes_that_arrive_not_the_declared_length() {
        let budget = Budget::new(1 << 30, 1 << 30);
        let mut reservation = budget.open("t");
        // Declares 60 MiB, sends 10 bytes.
        let body = read(
            chunked(vec![b"0123456789".to_vec()]),
            Some(60 << 20),
            64 << 20,
            deadline(),
            &mut reservation,
        )
        .await
        .expect("body");
        assert_eq!(body, b"0123456789");
        assert!(body.capacity() <= FIRST_BUFFER, "{}", body.capacity());
        assert_eq!(
            reservation.bytes(),
            body.capacity() as u64 * RESERVED_PER_BYTE
        );
    }

    #[tokio::test]
    async fn growth_stays_within_twice_the_bytes_received() {
        let budget = Budget::new(1 << 30, 1 << 30);
        let mut reservation = budget.open("t");
        let parts: Vec<Vec<u8>> = (0..100).map(|_| vec![7u8; 10_000]).collect();
        let body = read(chunked(parts), None, 64 << 20, deadline(), &mut reservation)
            .await
            .expect("body");
        assert_eq!(body.len(), 1_000_000);
        assert!(body.capacity() <= 2_000_000, "{}", body.capacity());
        assert_eq!(
            reservation.bytes(),
            body.capacity() as u64 * RESERVED_PER_BYTE
        );
    }

    #[tokio::test]
    async fn too_long_too_slow_or_over_budget_is_refused() {
        let budget = Budget::new(1 << 30, 1 << 30);
        let mut reservation = budget.open("t");
        let e = read(
            chunked(vec![vec![0; 600], vec![0; 600]]),
            None,
            1000,
            deadline(),
            &mut reservation,
        )
        .await
        .expect_err("over the limit");
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);

        let never =
            Body::from_stream(futures::stream::pending::<Result<Vec<u8>, std::io::Error>>());
        let soon = Instant::now() + Duration::from_millis(50);
        let e = read(never, None, 1000, soon, &mut reservation)
            .await
            .expect_err("too slow");
        assert_eq!(e.status, StatusCode::REQUEST_TIMEOUT);

        let small = Budget::new(3 << 20, 3 << 20);
        let mut reservation = small.open("t");
        let e = read(
            chunked(vec![vec![0; 600 << 10], vec![0; 600 << 10]]),
            None,
            64 << 20,
            deadline(),
            &mut reservation,
        )
        .await
        .expect_err("over the budget");
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
    }
}
