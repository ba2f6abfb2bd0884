//! Minimal HTTP on loopback for Open Inference Protocol requests in tests: a JSON POST, and raw
//! requests whose framing a test controls byte by byte (to send what a hostile client would).

use std::io::{Read, Write};
use std::net::TcpStream;
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

/// A response read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Header names in lowercase.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The head of a `method` request for `path` with `headers` (Host and `Connection: close`
/// added), ready for a body to follow.
pub fn head(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// Sends `request` (head and body, as given) and reads the response until the server closes.
pub fn http_raw(addr: &str, request: &[u8], timeout: Duration) -> Result<Response, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    // The server may answer and close before taking all of it: that is an answer, not an error.
    let _ = stream.write_all(request);
    read_response(&mut stream)
}

/// A POST of `body` with Content-Length and `headers`.
pub fn http_post(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, String> {
    let length = body.len().to_string();
    let mut all = headers.to_vec();
    all.push(("Content-Length", &length));
    let mut request = head(addr, "POST", path, &all);
    request.extend_from_slice(body);
    http_raw(addr, &request, Duration::from_secs(120))
}

/// Reads one response from `stream` until it closes (requests carry `Connection: close`).
pub fn read_response(stream: &mut TcpStream) -> Result<Response, String> {
    let mut bytes = Vec::new();
    let read = stream.read_to_end(&mut bytes);
    // A reset after the whole response arrived (the server closed with our body unread) still
    // leaves a response to parse.
    if bytes.is_empty() {
        read.map_err(|e| e.to_string())?;
    }
    parse(&bytes)
}

fn parse(bytes: &[u8]) -> Result<Response, String> {
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            format!(
                "no complete response head in {:?}",
                String::from_utf8_lossy(bytes)
            )
        })?;
    let head = String::from_utf8_lossy(&bytes[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {head:.80}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = bytes[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body)?;
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk without its size line")?;
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&rest[..line_end])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .map_err(|e| e.to_string())?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest.get(..size).ok_or("a chunk shorter than its size")?;
        out.extend_from_slice(chunk);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
}
