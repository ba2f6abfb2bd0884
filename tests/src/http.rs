//! A minimal HTTP POST on loopback, for Open Inference Protocol requests in tests.

use std::time::Duration;

/// `POST http://<addr><path>` with a JSON `body`: the status code and the response body.
pub fn http_post_json(addr: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    crate::wait::exchange(
        addr,
        format!(
            "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
        Duration::from_secs(60),
    )
}
