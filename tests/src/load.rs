//! Open-loop load for end-to-end tests: requests at a steady rate, whatever the answers (each on
//! its own thread, so slow answers do not slow the sender), spread
//! round-robin over the addresses a `targets` function returns (re-read every two seconds, the
//! way a Service's endpoints change under a client), counting every status code.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Load running until [`Load::stop`].
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

/// What to send: one HTTP request, written once and sent to every target.
pub struct Request {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// An Open Inference Protocol inference with one FP32 input sent as a binary tensor.
    pub fn oip_binary_f32(model: &str, input: &str, shape: &[usize], values: &[f32]) -> Request {
        let header = serde_json::json!({
            "inputs": [{
                "name": input,
                "shape": shape,
                "datatype": "FP32",
                "parameters": {"binary_data_size": values.len() * 4},
            }]
        })
        .to_string();
        let mut body = header.clone().into_bytes();
        body.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        Request {
            path: format!("/v2/models/{model}/infer"),
            headers: vec![
                ("Content-Type".into(), "application/octet-stream".into()),
                (
                    "Inference-Header-Content-Length".into(),
                    header.len().to_string(),
                ),
            ],
            body,
        }
    }

    fn bytes_for(&self, addr: &str) -> Vec<u8> {
        let mut head = format!("POST {} HTTP/1.0\r\nHost: {addr}\r\n", self.path);
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", self.body.len()));
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// Requests in flight at most; past it a tick is skipped (and counted) rather than queued, so a
/// stalled server cannot make the client grow without bound.
const MAX_IN_FLIGHT: usize = 256;

impl Load {
    /// Sends `request` at `rate_per_s`, open loop: each request gets its own thread, so slow
    /// answers do not lower the offered rate (up to `MAX_IN_FLIGHT` at once).
    pub fn start(
        rate_per_s: f64,
        request: Request,
        targets: impl Fn() -> Vec<String> + Send + 'static,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Mutex::new(BTreeMap::new()));
        let addresses = Arc::new(Mutex::new(targets()));
        let request = Arc::new(request);
        let mut threads = Vec::new();
        {
            let (stop, addresses) = (stop.clone(), addresses.clone());
            threads.push(std::thread::spawn(move || {
                while !sleep_unless(&stop, Duration::from_secs(2)) {
                    let now = targets();
                    if !now.is_empty() {
                        *lock(&addresses) = now;
                    }
                }
            }));
        }
        let interval = Duration::from_secs_f64(1.0 / rate_per_s.max(0.001));
        let (flag, tally) = (stop.clone(), counts.clone());
        threads.push(std::thread::spawn(move || {
            let in_flight = Arc::new(AtomicUsize::new(0));
            let mut sent = Vec::new();
            let mut next = Instant::now();
            let mut turn = 0;
            while !flag.load(Ordering::Relaxed) {
                let now = Instant::now();
                if next > now && sleep_unless(&flag, next - now) {
                    break;
                }
                next = (next + interval).max(Instant::now());
                let addr = {
                    let all = lock(&addresses);
                    if all.is_empty() {
                        continue;
                    }
                    turn += 1;
                    all[turn % all.len()].clone()
                };
                if in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
                    *lock(&tally)
                        .entry("not sent: client at its in-flight limit".into())
                        .or_default() += 1;
                    continue;
                }
                in_flight.fetch_add(1, Ordering::Relaxed);
                let (request, tally, in_flight) =
                    (request.clone(), tally.clone(), in_flight.clone());
                sent.retain(|t: &JoinHandle<()>| !t.is_finished());
                sent.push(std::thread::spawn(move || {
                    let outcome = match crate::wait::exchange(
                        &addr,
                        &request.bytes_for(&addr),
                        Duration::from_secs(30),
                    ) {
                        Ok((code, _)) => code.to_string(),
                        Err(_) => "connection error".to_string(),
                    };
                    *lock(&tally).entry(outcome).or_default() += 1;
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                }));
            }
            for t in sent {
                let _ = t.join();
            }
        }));
        Load {
            stop,
            threads,
            counts,
        }
    }

    /// Responses so far, by status code.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.counts).clone()
    }

    /// Stops sending and waits for the requests in flight; the responses by status code.
    pub fn stop(self) -> BTreeMap<String, u64> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        lock(&self.counts).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sleeps for `d` in short steps; true when `stop` was raised meanwhile.
fn sleep_unless(stop: &AtomicBool, d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        std::thread::sleep((until - Instant::now()).min(Duration::from_millis(100)));
    }
    stop.load(Ordering::Relaxed)
}
