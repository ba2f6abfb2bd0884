//! Hostile requests against a real standalone agent over raw sockets: framing lies, shapes that
//! ask for more than they send, malformed and over-nested JSON, bodies too large, too slow or
//! cut off, more bytes in flight than the budget allows, and the agent's peak memory under four
//! concurrent maximum-size bodies.

use super::{python, scratch, serve, tenant_yaml, wide_model};
use cotenant_e2e::http::{Response, head, http_post, read_response};
use cotenant_e2e::{http_get, poll, workspace_binary};
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

/// A JSON request for `rows` rows of the wide model, every element `0`.
fn json_zeros(rows: usize, width: usize) -> Vec<u8> {
    let n = rows * width;
    let mut body =
        format!(r#"{{"inputs":[{{"name":"x","shape":[{rows},{width}],"datatype":"FP32","data":["#)
            .into_bytes();
    body.reserve(2 * n + 8);
    for i in 0..n {
        body.extend_from_slice(if i + 1 == n { b"0" } else { b"0," });
    }
    body.extend_from_slice(b"]}]}");
    body
}

/// A binary request for `rows` rows of the wide model, and its header length.
fn binary_zeros(rows: usize, width: usize) -> (Vec<u8>, usize) {
    let size = rows * width * 4;
    let mut body = format!(
        r#"{{"inputs":[{{"name":"x","shape":[{rows},{width}],"datatype":"FP32","parameters":{{"binary_data_size":{size}}}}}]}}"#
    )
    .into_bytes();
    let header_len = body.len();
    body.resize(header_len + size, 0);
    (body, header_len)
}

/// The `error` of a JSON error body.
fn error_of(r: &Response) -> String {
    serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("not a JSON error body: {}", r.text()))
}

fn wide_tenant(name: &str) -> String {
    tenant_yaml(
        name,
        "file://models/wide.onnx",
        "  scaling:\n    approach: Batching\n    maxBatchSize: 1\n    maxInstances: 1\n",
    )
}

/// What it is, its headers, its body, the status it must get and what its error must say.
type HostileCase<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<u8>, u16, &'a str);

#[test]
#[ignore = "needs COTENANT_PYTHON and the agent binary: cargo xtask test"]
fn hostile_requests_get_a_clear_4xx_and_the_agent_keeps_serving() {
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("hostile");
    wide_model(&python(), &dir.join("models/wide.onnx"), 4);
    std::fs::write(dir.join("wide.yaml"), wide_tenant("wide")).expect("tenant");
    let (mut server, addr) = serve(&agent, &dir, &["--body-timeout-seconds", "2"]);
    let infer = "/v2/models/wide/infer";

    let x = |shape: &str, dtype: &str, data: &str| {
        format!(
            r#"{{"inputs":[{{"name":"x","shape":{shape},"datatype":"{dtype}","data":{data}}}]}}"#
        )
        .into_bytes()
    };
    let (binary, header_len) = binary_zeros(1, 4);
    let ihcl = header_len.to_string();
    let deep = format!(
        r#"{{"inputs":[{{"name":"x","shape":[1,4],"datatype":"FP32","data":{}{}}}]}}"#,
        "[".repeat(200_000),
        "]".repeat(200_000)
    );
    let mut not_utf8 = x("[1,4]", "FP32", "[0,0,0,0]");
    not_utf8[20] = 0xff;
    let cases: Vec<HostileCase> = vec![
        ("header length negative", vec![("Inference-Header-Content-Length", "-5")], binary.clone(), 400, "non-negative"),
        ("header length not a number", vec![("Inference-Header-Content-Length", "1e3")], binary.clone(), 400, "non-negative"),
        ("header length past the body", vec![("Inference-Header-Content-Length", "999999")], binary.clone(), 400, "exceeds the body"),
        ("binary tail shorter than declared", vec![("Inference-Header-Content-Length", &ihcl)], binary[..binary.len() - 4].to_vec(), 400, "truncated"),
        ("binary tail longer than declared", vec![("Inference-Header-Content-Length", &ihcl)], [&binary[..], &[0u8; 8]].concat(), 400, "follow the JSON"),
        ("a huge shape with a tiny body", vec![], x("[10000000,4]", "FP32", "[0,0,0,0]"), 400, "cannot hold"),
        ("a shape whose element count overflows", vec![], x("[4294967296,4294967296,4]", "FP32", "[]"), 400, "count"),
        ("a shape past the element limit", vec![], x("[1048576,1048576,4]", "FP32", "[]"), 413, "exceeds"),
        ("ragged data", vec![], x("[2,4]", "FP32", "[[0,0,0,0],[0]]"), 400, "axis 1"),
        ("data nested deeper than the shape", vec![], x("[1,4]", "FP32", "[[[0],[0],[0],[0]]]"), 400, "nested deeper"),
        ("200000 levels of nesting", vec![], deep.into_bytes(), 400, "data"),
        ("invalid UTF-8", vec![], not_utf8, 400, "malformed"),
        ("BYTES", vec![], x("[1,4]", "BYTES", r#"["a","b","c","d"]"#), 400, "not supported"),
        ("a datatype the model does not take", vec![], x("[1,4]", "INT64", "[0,0,0,0]"), 400, "expects FP32"),
        ("an unknown datatype", vec![], x("[1,4]", "FLOAT", "[0,0,0,0]"), 400, "unknown datatype"),
        (
            "the same input twice",
            vec![],
            br#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[0,0,0,0]},{"name":"x","shape":[1,4],"datatype":"FP32","data":[0,0,0,0]}]}"#.to_vec(),
            400,
            "given twice",
        ),
        (
            "an unknown output",
            vec![],
            br#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[0,0,0,0]}],"outputs":[{"name":"secrets"}]}"#.to_vec(),
            400,
            "unknown output",
        ),
        ("not JSON", vec![], b"\x00\x01\x02".to_vec(), 400, "malformed"),
    ];
    let mut table = String::new();
    for (label, headers, body, want, says) in cases {
        let r = http_post(&addr, infer, &headers, &body).unwrap_or_else(|e| panic!("{label}: {e}"));
        let error = error_of(&r);
        table.push_str(&format!("| {label} | {} {error:.100} |\n", r.status));
        assert_eq!(r.status, want, "{label}: {error}");
        assert!(error.contains(says), "{label}: {error}");
    }

    // A declared body past the limit is refused before any of it is sent.
    let declared = (65u64 << 20).to_string();
    let mut stream = TcpStream::connect(&addr).expect("connect");
    stream
        .write_all(&head(
            &addr,
            "POST",
            infer,
            &[("Content-Length", &declared)],
        ))
        .expect("head");
    let r = read_response(&mut stream).expect("an answer to the head alone");
    assert_eq!(r.status, 413, "{}", r.text());
    table.push_str(&format!(
        "| a declared 65 MiB body | {} {:.80} |\n",
        r.status,
        error_of(&r)
    ));

    // A chunked body that never ends is cut off at the limit.
    let mut stream = TcpStream::connect(&addr).expect("connect");
    stream
        .write_all(&head(
            &addr,
            "POST",
            infer,
            &[("Transfer-Encoding", "chunked")],
        ))
        .expect("head");
    let chunk = [b"100000\r\n".as_slice(), &[b' '; 1 << 20], b"\r\n"].concat();
    for _ in 0..80 {
        if stream.write_all(&chunk).is_err() {
            break;
        }
    }
    let r = read_response(&mut stream).expect("an answer");
    assert_eq!(r.status, 413, "{}", r.text());
    table.push_str(&format!(
        "| an endless chunked body | {} {:.80} |\n",
        r.status,
        error_of(&r)
    ));

    // A body that stalls gets 408 once its deadline (2 s here) passes; one cut off, 400.
    for (label, cut, want) in [
        ("a stalled body", false, 408),
        ("a body cut off", true, 400),
    ] {
        let mut stream = TcpStream::connect(&addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let mut request = head(&addr, "POST", infer, &[("Content-Length", "1000")]);
        request.extend_from_slice(br#"{"inputs":"#);
        stream.write_all(&request).expect("part of the body");
        if cut {
            stream.shutdown(Shutdown::Write).expect("shutdown");
        }
        let r = read_response(&mut stream).expect("an answer");
        table.push_str(&format!(
            "| {label} | {} {:.80} |\n",
            r.status,
            error_of(&r)
        ));
        assert_eq!(r.status, want, "{label}: {}", r.text());
    }
    eprintln!("| request | answer |\n|---|---|\n{table}");

    // Still serving, and nothing is left reserved.
    let r = http_post(
        &addr,
        infer,
        &[],
        &x("[2,4]", "FP32", "[[1,2,3,4],[5,6,7,8]]"),
    )
    .expect("infer");
    assert_eq!(r.status, 200, "{}", r.text());
    let answer: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
    assert_eq!(answer["outputs"][0]["data"], serde_json::json!([2.5, 6.5]));
    assert!(server.is_running(), "{}", server.log_tail(20));
    let (_, metrics) = http_get(&addr, "/metrics").expect("metrics");
    assert!(
        metrics.contains("cotenant_agent_inflight_bytes 0"),
        "{metrics}"
    );
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bytes requests hold now, from `/metrics`.
fn inflight(addr: &str) -> Result<u64, String> {
    let (_, metrics) = http_get(addr, "/metrics")?;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("cotenant_agent_inflight_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no cotenant_agent_inflight_bytes".to_string())
}

/// Starts a request whose body is `body`, sending all but its last `held_back` bytes.
fn start_request(
    addr: &str,
    path: &str,
    body: &[u8],
    header_len: usize,
    held_back: usize,
) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let length = body.len().to_string();
    let ihcl = header_len.to_string();
    let mut request = head(
        addr,
        "POST",
        path,
        &[
            ("Content-Length", &length),
            ("Inference-Header-Content-Length", &ihcl),
        ],
    );
    request.extend_from_slice(&body[..body.len() - held_back]);
    stream.write_all(&request).expect("send");
    stream
}

#[test]
#[ignore = "needs COTENANT_PYTHON and the agent binary: cargo xtask test"]
fn bytes_in_flight_past_the_budget_get_429_or_503_with_retry_after() {
    const MIB: u64 = 1 << 20;
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("budget");
    let width = 1 << 16;
    wide_model(&python(), &dir.join("models/wide.onnx"), width);
    for name in ["wide-a", "wide-b"] {
        std::fs::write(dir.join(format!("{name}.yaml")), wide_tenant(name)).expect("tenant");
    }
    // A 1 MiB body reserves 3 MiB while it arrives: one fits a tenant (5 MiB), two the agent (7).
    let (mut server, addr) = serve(
        &agent,
        &dir,
        &[
            "--max-inflight-bytes",
            &(7 * MIB).to_string(),
            "--max-inflight-bytes-per-tenant",
            &(5 * MIB).to_string(),
        ],
    );
    let (body, header_len) = binary_zeros(4, width);
    let held_back = 400 << 10;

    let mut first = start_request(
        &addr,
        "/v2/models/wide-a/infer",
        &body,
        header_len,
        held_back,
    );
    poll("the first body reserved", Duration::from_secs(30), || {
        let n = inflight(&addr)?;
        if n >= 3 * MIB {
            Ok(())
        } else {
            Err(n.to_string())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", server.log_tail(20)));
    // A second body for the same tenant passes the tenant's cap while it arrives.
    let mut second = start_request(&addr, "/v2/models/wide-a/infer", &body, header_len, 0);
    let r = read_response(&mut second).expect("an answer");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"), "{:?}", r.headers);
    eprintln!("same tenant over its cap: {} {}", r.status, error_of(&r));

    let mut third = start_request(
        &addr,
        "/v2/models/wide-b/infer",
        &body,
        header_len,
        held_back,
    );
    poll("the third body reserved", Duration::from_secs(30), || {
        let n = inflight(&addr)?;
        if n >= 6 * MIB {
            Ok(())
        } else {
            Err(n.to_string())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", server.log_tail(20)));
    // Another tenant's body now passes the agent's cap.
    let mut fourth = start_request(&addr, "/v2/models/wide-b/infer", &body, header_len, 0);
    let r = read_response(&mut fourth).expect("an answer");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"), "{:?}", r.headers);
    eprintln!("agent over its cap: {} {}", r.status, error_of(&r));

    // The bodies kept finish and are served; then nothing is reserved.
    for stream in [&mut first, &mut third] {
        stream
            .write_all(&body[body.len() - held_back..])
            .expect("the rest of the body");
        let r = read_response(stream).expect("an answer");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    poll(
        "the budget released",
        Duration::from_secs(30),
        || match inflight(&addr)? {
            0 => Ok(()),
            n => Err(n.to_string()),
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A line of `/proc/<pid>/status`, in KiB.
fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The documented bound (`node-agent/src/serve/budget.rs`): one tenant's requests hold at most
/// its cap (256 MiB by default), and a running batch takes the executor three more copies of its
/// inputs. Four concurrent maximum-size JSON bodies to one tenant (62 MiB of `0,` each, 124 MiB
/// once decoded) must keep the agent's peak RSS growth within that plus 64 MiB of runtime and
/// allocator slack.
#[test]
#[ignore = "needs COTENANT_PYTHON and the agent binary: cargo xtask test"]
fn peak_memory_under_four_maximum_bodies_stays_within_the_documented_bound() {
    const MIB: u64 = 1 << 20;
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("peak-rss");
    let width = 1 << 20;
    wide_model(&python(), &dir.join("models/wide.onnx"), width);
    std::fs::write(dir.join("wide.yaml"), wide_tenant("wide")).expect("tenant");
    let (mut server, addr) = serve(&agent, &dir, &[]);
    // Let the start-up profile finish before measuring.
    poll("the tenant profiled", Duration::from_secs(120), || {
        let (_, body) =
            cotenant_e2e::http_get_with(&addr, "/report", &[("Authorization", "Bearer s3cret")])?;
        if body.contains("\"approach\"") {
            Ok(())
        } else {
            Err(body)
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", server.log_tail(20)));

    let rows = 31;
    let body = json_zeros(rows, width);
    assert!(body.len() < 64 << 20, "{} bytes", body.len());
    let decoded = (rows * width * 4) as u64;
    // Forget the peak so far ("5" resets VmHWM to the current RSS).
    std::fs::write(format!("/proc/{}/clear_refs", server.pid), "5").expect("reset the peak");
    let baseline = proc_kib(server.pid, "VmRSS:") * 1024;

    let answers: Vec<Response> = std::thread::scope(|s| {
        let sends: Vec<_> = (0..4)
            .map(|_| s.spawn(|| http_post(&addr, "/v2/models/wide/infer", &[], &body)))
            .collect();
        sends
            .into_iter()
            .map(|h| h.join().expect("sender").expect("an answer"))
            .collect()
    });
    let peak = proc_kib(server.pid, "VmHWM:") * 1024;
    let growth = peak.saturating_sub(baseline);
    let bound = 256 * MIB + 3 * decoded + 64 * MIB;
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    eprintln!(
        "four {} MiB bodies: answers {statuses:?}, peak RSS growth {} MiB (bound {} MiB)",
        body.len() >> 20,
        growth >> 20,
        bound >> 20
    );
    for r in &answers {
        match r.status {
            200 => {}
            429 | 503 => assert_eq!(r.header("retry-after"), Some("1"), "{}", r.text()),
            other => panic!("{other}: {}", r.text()),
        }
    }
    assert!(statuses.contains(&200), "none was served: {statuses:?}");
    assert!(
        growth <= bound,
        "peak RSS grew {} MiB, past the bound of {} MiB",
        growth >> 20,
        bound >> 20
    );
    assert!(server.is_running(), "{}", server.log_tail(20));
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits for the server to close `stream` (reading and discarding anything it sends first).
fn closed_by_server(mut stream: TcpStream) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
#[ignore = "needs COTENANT_PYTHON and the agent binary: cargo xtask test"]
fn stalled_connections_are_closed_and_at_most_the_cap_are_held() {
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("connections");
    wide_model(&python(), &dir.join("models/wide.onnx"), 4);
    std::fs::write(dir.join("wide.yaml"), wide_tenant("wide")).expect("tenant");
    let (mut server, addr) = serve(
        &agent,
        &dir,
        &["--header-timeout-seconds", "2", "--max-connections", "3"],
    );
    // Three connections that never finish their headers fill the listener.
    let stalled: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(20)))
                .expect("timeout");
            s.write_all(b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: x\r\n")
                .expect("part of the headers");
            s
        })
        .collect();
    // A fourth is answered once the header timeout has closed a stalled one.
    let fourth = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let r = cotenant_e2e::http::http_raw(
                &addr,
                &head(&addr, "GET", "/v2/health/live", &[]),
                Duration::from_secs(60),
            );
            (r, std::time::Instant::now())
        }
    });
    let mut first_closed = None;
    for s in stalled {
        assert!(closed_by_server(s), "a stalled connection was kept open");
        first_closed.get_or_insert_with(std::time::Instant::now);
    }
    let (answer, answered_at) = fourth.join().expect("fourth");
    assert_eq!(answer.expect("an answer").status, 200);
    let first_closed = first_closed.expect("closed");
    assert!(
        answered_at + Duration::from_millis(500) >= first_closed,
        "the fourth connection was served while three were held"
    );

    // An idle keep-alive connection is closed too.
    let mut idle = TcpStream::connect(&addr).expect("connect");
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    idle.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("request");
    assert!(closed_by_server(idle), "an idle connection was kept open");
    assert!(server.is_running(), "{}", server.log_tail(20));
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
