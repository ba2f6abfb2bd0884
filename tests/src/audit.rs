//! Counting what one user asked of the API server, from the control plane's audit log
//! (`ControlPlane::audit_log`): requests by verb and resource over a stretch of the log, taken
//! between two byte offsets.

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Verbs that change something.
pub const WRITES: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

/// Requests of one user, by `(verb, resource)`; the resource names its subresource as
/// `resource/subresource`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Requests(pub BTreeMap<(String, String), u64>);

impl Requests {
    /// Requests by `user` in `log` between byte `from` and byte `to`.
    pub fn read(log: &Path, user: &str, from: u64, to: u64) -> std::io::Result<Requests> {
        let mut file = std::fs::File::open(log)?;
        file.seek(SeekFrom::Start(from))?;
        let mut text = String::new();
        file.take(to.saturating_sub(from))
            .read_to_string(&mut text)?;
        let mut counts = BTreeMap::new();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if event["user"]["username"] != user {
                continue;
            }
            let verb = event["verb"].as_str().unwrap_or("?").to_string();
            let object = &event["objectRef"];
            let mut resource = object["resource"].as_str().unwrap_or("-").to_string();
            if let Some(sub) = object["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            *counts.entry((verb, resource)).or_insert(0) += 1;
        }
        Ok(Requests(counts))
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Requests whose verb is one of `verbs`.
    pub fn of(&self, verbs: &[&str]) -> u64 {
        self.0
            .iter()
            .filter(|((v, _), _)| verbs.contains(&v.as_str()))
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests whose verb is one of `verbs`, on any resource but `except`.
    pub fn of_except(&self, verbs: &[&str], except: &str) -> u64 {
        self.0
            .iter()
            .filter(|((v, r), _)| verbs.contains(&v.as_str()) && r != except)
            .map(|(_, n)| n)
            .sum()
    }

    /// One line per `(verb, resource)`: `verb resource count (rate/s)` over `seconds`.
    pub fn table(&self, seconds: f64) -> String {
        self.0
            .iter()
            .map(|((verb, resource), n)| {
                format!(
                    "    {verb:<8} {resource:<36} {n:>7}  {:>8.2}/s\n",
                    *n as f64 / seconds.max(1e-9)
                )
            })
            .collect()
    }
}

/// The log's current length: the offset where the next request will be written.
pub fn offset(log: &Path) -> u64 {
    std::fs::metadata(log).map_or(0, |m| m.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_one_users_requests_by_verb_and_resource() {
        let dir = std::env::temp_dir().join(format!("audit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let log = dir.join("audit.log");
        let line = |user: &str, verb: &str, resource: &str, sub: Option<&str>| {
            let mut object = serde_json::json!({ "resource": resource });
            if let Some(sub) = sub {
                object["subresource"] = sub.into();
            }
            serde_json::json!({"user": {"username": user}, "verb": verb, "objectRef": object})
                .to_string()
        };
        let text = [
            line("op", "patch", "modeltenants", Some("status")),
            line("op", "patch", "modeltenants", Some("status")),
            line("op", "list", "pods", None),
            line("other", "delete", "pods", None),
            "not json".to_string(),
        ]
        .join("\n");
        std::fs::write(&log, &text).expect("write");
        let r = Requests::read(&log, "op", 0, offset(&log)).expect("read");
        assert_eq!(
            r.0.get(&("patch".into(), "modeltenants/status".into())),
            Some(&2)
        );
        assert_eq!((r.total(), r.of(WRITES), r.of(&["list"])), (3, 2, 1));
        assert_eq!(r.of_except(WRITES, "modeltenants/status"), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
