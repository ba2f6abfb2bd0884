//! Polling for a condition with a deadline (tests never wait on a fixed sleep), and a minimal
//! HTTP GET for health and metrics endpoints on loopback.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Calls `probe` every `interval` until it returns `Some`, or fails with the last observation
/// once `timeout` has passed.
pub fn poll<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match probe() {
            Ok(value) => return Ok(value),
            Err(last) if Instant::now() > deadline => {
                return Err(format!(
                    "timed out after {timeout:?} waiting for {what}; last: {last}"
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// `GET http://<addr><path>`: the status code and body.
pub fn http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    http_get_with(addr, path, &[])
}

/// `GET` with extra request headers.
pub fn http_get_with(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    exchange(
        addr,
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n{extra}\r\n").as_bytes(),
        Duration::from_secs(10),
    )
}

/// Sends one HTTP/1.0 `request` to `addr` and reads the whole response: its status code and body.
pub(crate) fn exchange(
    addr: &str,
    request: &[u8],
    timeout: Duration,
) -> Result<(u16, String), String> {
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    stream.write_all(request).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    let response = String::from_utf8_lossy(&bytes);
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {response:.80}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}
