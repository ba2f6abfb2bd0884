//! Spans leave the agent for an OpenTelemetry collector when it is given one
//! (`--otlp-endpoint`): a model's `fetch` span and a request's `infer` span, with its model,
//! arrive over OTLP/HTTP.

use super::{python, scratch, serve, tenant_yaml, wide_model};
use cotenant_e2e::http::http_post_json;
use cotenant_e2e::{poll, workspace_binary};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a collector received: the path and body of each POST.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A minimal OTLP/HTTP collector on a free port: it answers every POST with 200 and keeps it.
fn collector() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let received: Received = Arc::default();
    let keep = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let keep = keep.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut stream = stream;
                // One connection may carry several requests.
                loop {
                    let mut head = String::new();
                    let mut length = 0;
                    let mut line = String::new();
                    while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                        head.push_str(&line);
                        line.clear();
                    }
                    if head.is_empty() {
                        return;
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    keep.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((path, body));
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    if stream.write_all(ok).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, received)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
#[ignore = "needs COTENANT_PYTHON and the agent binary: cargo xtask test"]
fn request_spans_reach_an_otlp_collector() {
    let (endpoint, received) = collector();
    let dir = scratch("otlp");
    wide_model(&python(), &dir.join("models/wide.onnx"), 4);
    std::fs::write(
        dir.join("wide.yaml"),
        tenant_yaml("wide", "file://models/wide.onnx", ""),
    )
    .expect("tenant file");
    let (agent, addr) = serve(
        &workspace_binary("cotenant-agent"),
        &dir,
        &["--otlp-endpoint", &endpoint],
    );
    let body = r#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[0,0,0,0]}]}"#;
    let (code, answer) = http_post_json(&addr, "/v2/models/wide/infer", body).expect("infer");
    assert_eq!(code, 200, "{answer}");
    poll(
        "the fetch and infer spans at the collector",
        Duration::from_secs(30),
        || {
            let got = received.lock().unwrap_or_else(|e| e.into_inner());
            let traces = || got.iter().filter(|(path, _)| path == "/v1/traces");
            let request = traces().any(|(_, body)| {
                contains(body, "infer")
                    && contains(body, "wide")
                    && contains(body, "cotenant-agent")
            });
            let load = traces()
                .any(|(_, body)| contains(body, "fetch") && contains(body, "models/wide.onnx"));
            match (request && load).then_some(()) {
                Some(()) => Ok(()),
                None => Err(format!(
                    "{} posts: {:?}",
                    got.len(),
                    got.iter().map(|(p, b)| (p, b.len())).collect::<Vec<_>>()
                )),
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
}
