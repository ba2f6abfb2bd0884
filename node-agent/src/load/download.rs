//! Model files over HTTP(S): one shared client, bounded size and time, and errors that name the
//! URL and what the server said.

use std::sync::OnceLock;
use std::time::Duration;

/// The largest model file the agent downloads.
pub const MAX_MODEL_BYTES: u64 = 4 << 30;
/// Connecting to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Silence between two reads of the body.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The whole download, body included.
const TOTAL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Installs ring as the process's TLS crypto provider (reqwest is built without one, and ring is
/// what kube uses). Calling it again does nothing.
pub fn install_crypto_provider() {
    // Err means a provider is installed already, which is all that is needed.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn client() -> Result<&'static reqwest::Client, String> {
    static CLIENT: OnceLock<Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            install_crypto_provider();
            reqwest::Client::builder()
                .user_agent(concat!("cotenant-agent/", env!("CARGO_PKG_VERSION")))
                .connect_timeout(CONNECT_TIMEOUT)
                .read_timeout(READ_TIMEOUT)
                .timeout(TOTAL_TIMEOUT)
                .build()
                .map_err(|e| format!("cannot build the HTTP client: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Downloads `url` into memory, refusing anything but a 2xx answer and bodies over
/// [`MAX_MODEL_BYTES`].
pub async fn get(url: &str) -> Result<Vec<u8>, String> {
    let fail = |e: reqwest::Error| {
        let why = if e.is_timeout() {
            "timed out".to_string()
        } else {
            error_chain(&e)
        };
        format!("GET {url}: {why}")
    };
    let mut response = client()?.get(url).send().await.map_err(fail)?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("GET {url}: HTTP {status}"));
    }
    if let Some(length) = response.content_length()
        && length > MAX_MODEL_BYTES
    {
        return Err(format!(
            "GET {url}: the model is {length} bytes, more than the limit of {MAX_MODEL_BYTES}"
        ));
    }
    let capacity = response.content_length().unwrap_or(0).min(MAX_MODEL_BYTES);
    let mut body = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
    while let Some(chunk) = response.chunk().await.map_err(fail)? {
        if (body.len() + chunk.len()) as u64 > MAX_MODEL_BYTES {
            return Err(format!(
                "GET {url}: the body exceeds the limit of {MAX_MODEL_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An error with its causes, which is where reqwest keeps the useful part ("connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Serves one canned HTTP response on loopback and returns its URL.
    fn serve_once(response: &'static [u8]) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            if let Ok((mut stream, _)) = listener.accept() {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(response);
            }
        });
        format!("http://{addr}/model.onnx")
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn downloads_the_body() {
        let url =
            serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
        assert_eq!(runtime().block_on(get(&url)).expect("body"), b"hello");
    }

    #[test]
    fn names_the_url_and_the_status() {
        let url =
            serve_once(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let e = runtime().block_on(get(&url)).expect_err("404");
        assert!(e.contains(&url) && e.contains("404"), "{e}");
    }

    #[test]
    fn refuses_a_declared_size_over_the_limit() {
        let url = serve_once(
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\nConnection: close\r\n\r\n",
        );
        let e = runtime().block_on(get(&url)).expect_err("too big");
        assert!(e.contains("limit"), "{e}");
    }

    #[test]
    fn connection_refused_is_an_error_not_a_panic() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let url = format!("http://127.0.0.1:{port}/m.onnx");
        let e = runtime().block_on(get(&url)).expect_err("refused");
        assert!(e.contains(&url), "{e}");
    }
}
