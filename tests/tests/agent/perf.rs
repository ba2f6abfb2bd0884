//! Triton's own load generator, `perf_analyzer`, against a standalone agent over HTTP and gRPC: it
//! reads the model's metadata, configuration and statistics the way it reads Triton's, measures,
//! and writes its CSV report.

use super::{scratch, serve, tenant_yaml, zoo};
use cotenant_e2e::cluster::free_port;
use cotenant_e2e::{poll, workspace_binary};
use std::fs::File;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Far above a run's length (two concurrencies, at most three 1.5 s windows each): only a hung
/// perf_analyzer reaches it.
const RUN_LIMIT: Duration = Duration::from_secs(120);

fn perf_analyzer() -> PathBuf {
    std::env::var_os("COTENANT_PERF_ANALYZER")
        .map(PathBuf::from)
        .expect("COTENANT_PERF_ANALYZER must name the perf_analyzer wrapper: run cargo xtask test")
}

/// How one perf_analyzer run ended.
struct Outcome {
    /// `None` when it was killed at `RUN_LIMIT`.
    status: Option<ExitStatus>,
    /// What it printed, stdout and stderr together.
    output: String,
    /// The command line, the output and how it ended, for failure messages.
    report: String,
}

impl Outcome {
    fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Runs `perf_analyzer args`, its stdout and stderr to `log`, killing it at `RUN_LIMIT`.
fn run(args: &[&str], log: &Path) -> Outcome {
    let out = File::create(log).expect("log file");
    let mut child = Command::new(perf_analyzer())
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .expect("perf_analyzer starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(log).unwrap_or_default();
    let report = format!(
        "perf_analyzer {}\n{}\n(exit: {}, after {:.1?})",
        args.join(" "),
        output.trim_end(),
        status.map_or_else(|| "killed at the limit".to_string(), |s| s.to_string()),
        started.elapsed()
    );
    Outcome {
        status,
        output,
        report,
    }
}

/// One row of perf_analyzer's CSV report.
struct Row {
    concurrency: u32,
    inferences_per_second: f64,
    p50_us: u64,
    p99_us: u64,
}

/// The rows of a CSV report, its columns found by name.
fn parse_csv(text: &str) -> Result<Vec<Row>, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next().ok_or("empty")?.split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| h.trim() == name)
            .ok_or(format!("no column {name:?} in {header:?}"))
    };
    let (c, ips, p50, p99) = (
        column("Concurrency")?,
        column("Inferences/Second")?,
        column("p50 latency")?,
        column("p99 latency")?,
    );
    lines
        .map(|line| {
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            let cell = |i: usize| cells.get(i).copied().ok_or(format!("short row {line:?}"));
            let bad = |e: &dyn std::fmt::Display| format!("{e} in row {line:?}");
            Ok(Row {
                concurrency: cell(c)?.parse().map_err(|e| bad(&e))?,
                inferences_per_second: cell(ips)?.parse().map_err(|e| bad(&e))?,
                p50_us: cell(p50)?.parse().map_err(|e| bad(&e))?,
                p99_us: cell(p99)?.parse().map_err(|e| bad(&e))?,
            })
        })
        .collect()
}

#[test]
#[ignore = "needs COTENANT_PERF_ANALYZER and the agent binary: cargo xtask test"]
fn perf_analyzer_measures_a_standalone_agent_over_http_and_grpc() {
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("agent-perf");
    zoo(
        &agent,
        &dir.join("models"),
        "squeezenet",
        "squeezenet.onnx",
        &[],
    );
    // Knobs held at batch 1, one instance: a knob change rebuilds the instances, and a window
    // that spans the rebuild measures the rebuild, not the agent's serving path.
    std::fs::write(
        dir.join("squeezenet.yaml"),
        tenant_yaml(
            "squeezenet",
            "file://models/squeezenet.onnx",
            "  scaling:\n    approach: Batching\n    maxBatchSize: 1\n    maxInstances: 1\n",
        ),
    )
    .expect("write tenant");
    let grpc = format!("127.0.0.1:{}", free_port().expect("port"));
    let (mut server, http) = serve(&agent, &dir, &["--grpc-listen", &grpc]);
    let listening = poll("the gRPC listener", Duration::from_secs(30), || {
        TcpStream::connect(&grpc)
            .map(drop)
            .map_err(|e| e.to_string())
    });
    assert!(listening.is_ok(), "{listening:?}\n{}", server.log_tail(30));

    // A model the agent does not serve: perf_analyzer stops and says which.
    let missing = run(
        &["-m", "nosuchmodel", "-u", &http, "-i", "http"],
        &dir.join("perf-missing.log"),
    );
    assert!(
        missing.status.is_some() && !missing.succeeded(),
        "perf_analyzer did not stop on a missing model:\n{}",
        missing.report
    );
    assert!(missing.output.contains("nosuchmodel"), "{}", missing.report);

    let mut table = vec![format!(
        "{:<8} {:>11} {:>13} {:>9} {:>9}",
        "protocol", "concurrency", "inferences/s", "p50 µs", "p99 µs"
    )];
    for (protocol, url) in [("http", &http), ("grpc", &grpc)] {
        let csv = dir.join(format!("perf-{protocol}.csv"));
        let csv_arg = csv.to_string_lossy();
        let outcome = run(
            &[
                "-m",
                "squeezenet",
                "-u",
                url,
                "-i",
                protocol,
                "--concurrency-range",
                "1:2",
                "--measurement-interval",
                "1500",
                // Checks that perf_analyzer measures the agent, not how steady this shared
                // two-core host is: a window may take up to 10x another's time.
                "--stability-percentage",
                "1000",
                "--max-trials",
                "6",
                "-f",
                &csv_arg,
            ],
            &dir.join(format!("perf-{protocol}.log")),
        );
        assert!(
            outcome.succeeded(),
            "{}\nagent log:\n{}",
            outcome.report,
            server.log_tail(30)
        );
        let text = std::fs::read_to_string(&csv).expect("perf_analyzer wrote its CSV report");
        // Server-side columns appear only when `GET /v2` lists the `statistics` extension and
        // `GET /v2/models/{m}/stats` answered before and after each window.
        assert!(
            text.lines()
                .next()
                .is_some_and(|h| h.contains("Server Compute Infer")),
            "{protocol}: perf_analyzer read no server statistics:\n{text}\n{}",
            outcome.report
        );
        let mut rows = parse_csv(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        rows.sort_by_key(|r| r.concurrency);
        assert_eq!(
            rows.iter().map(|r| r.concurrency).collect::<Vec<_>>(),
            [1, 2],
            "{text}"
        );
        for row in &rows {
            assert!(row.inferences_per_second > 0.0, "{protocol}: {text}");
            assert!(
                row.p50_us > 0 && row.p50_us <= row.p99_us,
                "{protocol}: {text}"
            );
            table.push(format!(
                "{protocol:<8} {:>11} {:>13.1} {:>9} {:>9}",
                row.concurrency, row.inferences_per_second, row.p50_us, row.p99_us
            ));
        }
    }
    eprintln!("{}", table.join("\n"));
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The report as perf_analyzer 2.41 writes it when the server answers its statistics requests.
#[test]
fn perf_analyzer_csv_reports_parse() {
    let text = "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,\
                Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,\
                p50 latency,p90 latency,p95 latency,p99 latency\n\
                1,22.406,85,4200,310,300,1500,290,0,44003,47975,48014,50521\n\
                2,44.4419,79,4100,320,310,1520,300,0,44016,48021,48129,51987\n";
    let rows = parse_csv(text).expect("parses");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].concurrency, 2);
    assert!((rows[1].inferences_per_second - 44.4419).abs() < 1e-9);
    assert_eq!((rows[0].p50_us, rows[0].p99_us), (44003, 50521));
    assert!(parse_csv("Concurrency,Inferences/Second\n1,2\n").is_err());
}
