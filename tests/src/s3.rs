//! A real S3-compatible server for the object-store tests: moto in server mode from the
//! reference venv (`xtask/requirements.txt`), with authentication on, holding a bucket of the
//! files a test gives and a user whose key may read it (`tests/python/s3_models.py`).

use crate::cluster::free_port;
use crate::process::{Lifetime, Process};
use crate::{TestNamespace, http_get, poll};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub struct S3Server {
    /// `<ip>:<port>`.
    pub addr: String,
    /// `http://<ip>:<port>`, for `AWS_ENDPOINT_URL`.
    pub endpoint: String,
    /// The key of the user that may read the bucket.
    pub access_key_id: String,
    pub secret_access_key: String,
    process: Process,
}

impl S3Server {
    /// Starts moto (`moto_server` beside `python`) on a free loopback port, logging to `dir`,
    /// and puts `objects` (key, file) into `bucket`.
    pub fn start(
        python: &Path,
        dir: &Path,
        bucket: &str,
        objects: &[(&str, &Path)],
    ) -> Result<S3Server, String> {
        S3Server::start_on(python, dir, "127.0.0.1", bucket, objects)
    }

    /// [`S3Server::start`] listening on `ip` (an agent in Kubernetes mode refuses loopback).
    pub fn start_on(
        python: &Path,
        dir: &Path,
        ip: &str,
        bucket: &str,
        objects: &[(&str, &Path)],
    ) -> Result<S3Server, String> {
        let port = free_port().map_err(|e| e.to_string())?;
        let addr = format!("{ip}:{port}");
        let server = python.with_file_name("moto_server");
        let mut cmd = Command::new(&server);
        cmd.args(["-H", ip, "-p", &port.to_string()])
            // The setup script's three IAM calls are the only unsigned requests served; every
            // later one needs a key the server issued.
            .env("INITIAL_NO_AUTH_ACTION_COUNT", "3");
        let mut process = Process::spawn(&format!("moto-{port}"), cmd, dir, Lifetime::WithParent)
            .map_err(|e| format!("{}: {e}", server.display()))?;
        let ready = poll("moto_server", Duration::from_secs(60), || {
            if !process.is_running() {
                return Ok(false);
            }
            http_get(&addr, "/moto-api/").map(|_| true)
        });
        if !matches!(ready, Ok(true)) {
            return Err(format!(
                "moto_server did not start: {ready:?}\n{}",
                process.log_tail(20)
            ));
        }
        let endpoint = format!("http://{addr}");
        let out = Command::new(python)
            .arg(TestNamespace::repo_root().join("tests/python/s3_models.py"))
            .args([endpoint.as_str(), bucket])
            .args(
                objects
                    .iter()
                    .map(|(key, file)| format!("{key}={}", file.display())),
            )
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "s3_models.py failed: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                process.log_tail(20)
            ));
        }
        let key: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        let field = |k: &str| key[k].as_str().map(str::to_string).ok_or(format!("no {k}"));
        Ok(S3Server {
            access_key_id: field("AWS_ACCESS_KEY_ID")?,
            secret_access_key: field("AWS_SECRET_ACCESS_KEY")?,
            addr,
            endpoint,
            process,
        })
    }

    /// The end of the server's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}
