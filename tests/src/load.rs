//! Open-loop load for end-to-end tests: requests at a steady rate, whatever the answers, spread
//! round-robin over the addresses a `targets` function returns (re-read every two seconds, the
//! way a Service's endpoints change under a client), counting every status code.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
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

impl Load {
    /// Sends `request` at `rate_per_s` from `senders` threads; a sender that falls behind skips
    /// ahead rather than bursting, so the offered rate never exceeds the one asked for.
    pub fn start(
        rate_per_s: f64,
        senders: usize,
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
        let senders = senders.max(1);
        let interval = Duration::from_secs_f64(senders as f64 / rate_per_s.max(0.001));
        for s in 0..senders {
            let (stop, counts, addresses, request) = (
                stop.clone(),
                counts.clone(),
                addresses.clone(),
                request.clone(),
            );
            threads.push(std::thread::spawn(move || {
                let mut next = Instant::now() + interval.mul_f64(s as f64 / senders as f64);
                let mut turn = s;
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if next > now && sleep_unless(&stop, next - now) {
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
                    let outcome = match crate::wait::exchange(
                        &addr,
                        &request.bytes_for(&addr),
                        Duration::from_secs(30),
                    ) {
                        Ok((code, _)) => code.to_string(),
                        Err(_) => "connection error".to_string(),
                    };
                    *lock(&counts).entry(outcome).or_default() += 1;
                }
            }));
        }
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
