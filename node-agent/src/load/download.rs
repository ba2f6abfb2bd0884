//! Model files over HTTP(S), treating the URL as untrusted. A download:
//!
//! - connects only to addresses a model may come from: never unspecified, multicast, link-local
//!   (where cloud metadata services live) or a known metadata address, and in Kubernetes mode
//!   never loopback (the agent's own pod). The addresses a name resolves to are checked, not the
//!   name, and the connection goes to the checked addresses only;
//! - follows at most a few redirects, each to the same scheme and an address allowed as above;
//! - ignores proxy settings (a proxy would resolve names where they cannot be checked);
//! - has a connect deadline, a read deadline (`--download-read-timeout`) and a total deadline;
//! - streams the body into a file of the model cache, hashing it on the way and stopping at
//!   [`MAX_MODEL_BYTES`]; a body shorter than its declared length is an error. The cache keeps
//!   the file only when the digest matches (see `cache`).
//!
//! Object stores (`store`) go through the same client, so the same rules hold for them.
//!
//! Plain `http://` is allowed: the required SHA-256 guarantees the bytes are the ones the tenant
//! named, whoever is on the path (it does not keep the model's weights secret on the wire).

use super::source::MAX_MODEL_BYTES;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Connecting to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The default silence allowed between two reads of a body (`--download-read-timeout`).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The whole download, body included.
const TOTAL_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 5;

/// What downloads may do on this agent, and the HTTP client that does them.
#[derive(Debug)]
pub struct Policy {
    /// Whether loopback addresses are allowed (standalone mode: a model server on this machine).
    pub allow_loopback: bool,
    /// Silence allowed between two reads of a body.
    pub read_timeout: Duration,
    client: OnceLock<Result<reqwest::Client, String>>,
}

impl Policy {
    pub fn new(allow_loopback: bool, read_timeout: Duration) -> Policy {
        Policy {
            allow_loopback,
            read_timeout,
            client: OnceLock::new(),
        }
    }

    /// The client every download of this agent goes through (built on first use).
    pub fn client(&self) -> Result<&reqwest::Client, String> {
        self.client
            .get_or_init(|| build_client(self.allow_loopback, self.read_timeout))
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// Installs ring as the process's TLS crypto provider (reqwest is built without one, and ring is
/// what kube uses). Calling it again does nothing.
pub fn install_crypto_provider() {
    // Err means a provider is installed already, which is all that is needed.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Why `ip` may not be downloaded from, if it may not.
pub fn refused_address(ip: IpAddr, allow_loopback: bool) -> Option<&'static str> {
    // An IPv4 address written as IPv6 is judged as the IPv4 address it is.
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(a) if a.is_loopback() => (!allow_loopback).then_some("loopback"),
        IpAddr::V4(a) if a.is_link_local() => Some("link-local (where cloud metadata lives)"),
        IpAddr::V4(a) if a.is_unspecified() || a.octets()[0] == 0 => Some("unspecified"),
        IpAddr::V4(a) if a.is_broadcast() || a.is_multicast() => Some("broadcast or multicast"),
        IpAddr::V4(a) if a == Ipv4Addr::new(100, 100, 100, 200) => Some("a cloud metadata address"),
        IpAddr::V6(a) if a.is_loopback() => (!allow_loopback).then_some("loopback"),
        IpAddr::V6(a) if a.is_unspecified() => Some("unspecified"),
        IpAddr::V6(a) if a.is_multicast() => Some("multicast"),
        IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80 => {
            Some("link-local (where cloud metadata lives)")
        }
        IpAddr::V6(a) if a == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) => {
            Some("a cloud metadata address")
        }
        _ => None,
    }
}

/// Why the host of `url` may not be downloaded from, when it is an address (names are checked
/// when they resolve).
pub fn refused_host(url: &reqwest::Url, allow_loopback: bool) -> Option<String> {
    let host = url.host_str()?;
    let ip: IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    refused_address(ip, allow_loopback)
        .map(|why| format!("{ip} is {why}: models may not come from there"))
}

/// Resolves names and keeps only the addresses a model may come from.
struct CheckedResolver {
    allow_loopback: bool,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_loopback = self.allow_loopback;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = all
                .iter()
                .filter(|a| refused_address(a.ip(), allow_loopback).is_none())
                .copied()
                .collect();
            if allowed.is_empty() {
                let why: Vec<String> = all
                    .iter()
                    .filter_map(|a| {
                        refused_address(a.ip(), allow_loopback).map(|w| format!("{} ({w})", a.ip()))
                    })
                    .collect();
                return Err(format!(
                    "{host} resolves only to addresses models may not come from: {}",
                    why.join(", ")
                )
                .into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

fn build_client(allow_loopback: bool, read_timeout: Duration) -> Result<reqwest::Client, String> {
    install_crypto_provider();
    let redirects = reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
        }
        let from = attempt.previous().first().map(|u| u.scheme().to_string());
        let to = attempt.url().scheme().to_string();
        if from.as_deref() != Some(to.as_str()) {
            return attempt.error(format!(
                "a redirect from {} to {to} changes the scheme",
                from.unwrap_or_default()
            ));
        }
        if let Some(why) = refused_host(attempt.url(), allow_loopback) {
            return attempt.error(format!("a redirect to {why}"));
        }
        attempt.follow()
    });
    reqwest::Client::builder()
        .user_agent(concat!("cotenant-agent/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(read_timeout)
        .timeout(TOTAL_TIMEOUT)
        .redirect(redirects)
        .no_proxy()
        .dns_resolver(Arc::new(CheckedResolver { allow_loopback }))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// Why a transfer failed, in words: "timed out" first when a deadline passed, then the error's
/// causes.
pub fn transfer_error(e: &dyn std::error::Error) -> String {
    let text = error_chain(e);
    if text.contains("timed out") || text.contains("deadline has elapsed") {
        format!("timed out: {text}")
    } else {
        text
    }
}

/// Downloads `url` into `file` and returns the SHA-256 of what it wrote. Refuses anything but a
/// 2xx answer, bodies over [`MAX_MODEL_BYTES`], bodies shorter than their declared length and
/// what `policy` forbids. Blocking writes: run it where blocking is allowed.
pub async fn fetch_into(url: &str, policy: &Policy, mut file: File) -> Result<[u8; 32], String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url}: not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{url}: not an http(s) URL"));
    }
    if let Some(why) = refused_host(&parsed, policy.allow_loopback) {
        return Err(format!("GET {url}: {why}"));
    }
    let fail = |e: reqwest::Error| {
        let why = if e.is_timeout() {
            "timed out".to_string()
        } else {
            transfer_error(&e)
        };
        format!("GET {url}: {why}")
    };
    let mut response = policy.client()?.get(parsed).send().await.map_err(fail)?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("GET {url}: HTTP {status}"));
    }
    let declared = response.content_length();
    if let Some(length) = declared
        && length > MAX_MODEL_BYTES
    {
        return Err(format!(
            "GET {url}: the model is {length} bytes, more than the limit of {MAX_MODEL_BYTES}"
        ));
    }
    let mut hasher = Sha256::new();
    let mut size: u64 = 0;
    loop {
        let chunk = response
            .chunk()
            .await
            .map_err(|e| format!("{} (the transfer stopped after {size} bytes)", fail(e)))?;
        let Some(chunk) = chunk else { break };
        size += chunk.len() as u64;
        if size > MAX_MODEL_BYTES {
            return Err(format!(
                "GET {url}: the body exceeds the limit of {MAX_MODEL_BYTES} bytes"
            ));
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .map_err(|e| format!("GET {url}: cannot write the model cache file: {e}"))?;
    }
    if let Some(length) = declared
        && size != length
    {
        return Err(format!(
            "GET {url}: truncated: the body ended after {size} of {length} bytes"
        ));
    }
    Ok(hasher.finalize().into())
}

/// An error with its causes, which is where reqwest keeps the useful part ("connection refused"),
/// on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        // Some errors already print their causes.
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Serves each canned response once, in order, on an address of this host; returns the
    /// base URL (`http://<addr>`).
    fn serve(ip: IpAddr, responses: Vec<Vec<u8>>) -> String {
        let listener = std::net::TcpListener::bind((ip, 0)).expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            for response in responses {
                if let Ok((mut stream, _)) = listener.accept() {
                    let mut buf = [0u8; 2048];
                    let _ = stream.read(&mut buf);
                    let _ = stream.write_all(&response);
                }
            }
        });
        format!("http://{addr}")
    }

    fn local(responses: Vec<Vec<u8>>) -> String {
        serve(IpAddr::V4(Ipv4Addr::LOCALHOST), responses)
    }

    fn ok(body: &[u8]) -> Vec<u8> {
        let mut r = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    }

    fn redirect(to: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .into_bytes()
    }

    fn sha(bytes: &[u8]) -> String {
        crate::credentials::hex(&Sha256::digest(bytes).into())
    }

    fn policy(allow_loopback: bool) -> Policy {
        Policy::new(allow_loopback, DEFAULT_READ_TIMEOUT)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// Downloads into a scratch file, checks the digest and reads the file back.
    fn get(url: &str, sha256: &str, allow_loopback: bool) -> Result<Vec<u8>, String> {
        use std::io::Seek;
        let mut file = tempfile::tempfile().expect("scratch file");
        let writer = file.try_clone().expect("clone");
        let digest = runtime().block_on(fetch_into(url, &policy(allow_loopback), writer))?;
        crate::load::source::check_digest(&digest, sha256, url)?;
        let mut bytes = Vec::new();
        file.rewind().expect("rewind");
        file.read_to_end(&mut bytes).expect("read back");
        Ok(bytes)
    }

    #[test]
    fn downloads_and_checks_the_body() {
        let base = local(vec![ok(b"hello")]);
        let url = format!("{base}/model.onnx");
        assert_eq!(get(&url, &sha(b"hello"), true).expect("body"), b"hello");
        let base = local(vec![ok(b"hellO")]);
        let e = get(&format!("{base}/m.onnx"), &sha(b"hello"), true).expect_err("digest");
        assert!(e.contains("sha256"), "{e}");
    }

    #[test]
    fn names_the_url_and_the_status() {
        let base = local(vec![
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
        ]);
        let url = format!("{base}/model.onnx");
        let e = get(&url, &sha(b""), true).expect_err("404");
        assert!(e.contains(&url) && e.contains("404"), "{e}");
    }

    #[test]
    fn a_body_shorter_than_declared_is_an_error() {
        let base = local(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\nonly this"
                .to_vec(),
        ]);
        let e = get(&format!("{base}/m"), &sha(b""), true).expect_err("cut");
        assert!(
            e.contains("after 9 bytes") || e.contains("after 9 of 100"),
            "{e}"
        );
    }

    #[test]
    fn a_stalled_body_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            if let Ok((mut stream, _)) = listener.accept() {
                let mut buf = [0u8; 2048];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\nsome",
                );
                // Then nothing more, with the connection open.
                std::thread::sleep(Duration::from_secs(5));
            }
        });
        let policy = Policy::new(true, Duration::from_millis(300));
        let file = tempfile::tempfile().expect("scratch");
        let e = runtime()
            .block_on(fetch_into(&format!("http://{addr}/m"), &policy, file))
            .expect_err("stalled");
        assert!(
            e.contains("timed out") && e.contains("after 4 bytes"),
            "{e}"
        );
    }

    #[test]
    fn refuses_a_declared_size_over_the_limit() {
        let base = local(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\nConnection: close\r\n\r\n".to_vec(),
        ]);
        let e = get(&format!("{base}/m"), &sha(b""), true).expect_err("too big");
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
        let e = get(&url, &sha(b""), true).expect_err("refused");
        assert!(e.contains(&url), "{e}");
    }

    #[test]
    fn metadata_link_local_and_loopback_addresses_are_refused() {
        for (url, says) in [
            ("http://169.254.169.254/latest/meta-data/", "link-local"),
            ("http://[fe80::1]/m", "link-local"),
            ("http://[fd00:ec2::254]/m", "metadata"),
            ("http://100.100.100.200/m", "metadata"),
            ("http://0.0.0.0/m", "unspecified"),
            ("http://[::ffff:169.254.169.254]/m", "link-local"),
            ("http://224.0.0.1/m", "multicast"),
            // Other spellings of the metadata address are normalised before the check.
            ("http://2852039166/m", "link-local"),
            ("http://0xa9.0xfe.0xa9.0xfe/m", "link-local"),
        ] {
            let e = get(url, &sha(b""), true).expect_err(url);
            assert!(e.contains(says), "{url}: {e}");
        }
        // Loopback only where the policy refuses it, by address and by name.
        let base = local(vec![ok(b"x")]);
        let e = get(&format!("{base}/m"), &sha(b"x"), false).expect_err("loopback");
        assert!(e.contains("loopback"), "{e}");
        let port = base.rsplit(':').next().unwrap_or_default();
        let e = get(&format!("http://0x7f.1:{port}/m"), &sha(b"x"), false).expect_err("hex");
        assert!(e.contains("loopback"), "{e}");
        let e = get(&format!("http://localhost:{port}/m"), &sha(b"x"), false).expect_err("name");
        assert!(e.contains("loopback"), "{e}");
    }

    #[test]
    fn redirects_may_not_change_scheme_or_reach_refused_addresses() {
        let base = local(vec![redirect("https://example.invalid/m")]);
        let e = get(&format!("{base}/m"), &sha(b""), true).expect_err("scheme");
        assert!(e.contains("changes the scheme"), "{e}");
        let base = local(vec![redirect("http://169.254.169.254/latest/")]);
        let e = get(&format!("{base}/m"), &sha(b""), true).expect_err("metadata");
        assert!(
            e.contains("169.254.169.254") && e.contains("link-local"),
            "{e}"
        );
        // A redirect within the rules is followed.
        let target = local(vec![ok(b"moved")]);
        let base = local(vec![redirect(&format!("{target}/m"))]);
        assert_eq!(
            get(&format!("{base}/m"), &sha(b"moved"), true).expect("followed"),
            b"moved"
        );
    }
}
