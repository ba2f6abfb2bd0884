//! Child processes of the harness: each logs to its own file and is stopped either with its
//! parent (tests) or explicitly (`cargo xtask cluster down`).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a process lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Killed by the kernel when the thread that spawned it exits, even if the parent is killed or
    /// panics, so a failed test run leaves nothing behind.
    WithParent,
    /// Own session, outlives the parent; stopped by pid.
    Detached,
}

/// One running component.
#[derive(Debug)]
pub struct Process {
    pub name: String,
    pub pid: u32,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Process {
    /// Starts `cmd` with stdout and stderr appended to `<log_dir>/<name>.log`.
    pub fn spawn(
        name: &str,
        mut cmd: Command,
        log_dir: &Path,
        lifetime: Lifetime,
    ) -> Result<Process, crate::Error> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: only async-signal-safe calls (prctl, setsid) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                match lifetime {
                    Lifetime::WithParent => {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Lifetime::Detached => {
                        if libc::setsid() < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| crate::Error::Spawn {
            what: name.to_string(),
            source: e,
        })?;
        Ok(Process {
            name: name.to_string(),
            pid: child.id(),
            log,
            child: Some(child),
        })
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => pid_alive(self.pid),
        }
    }

    /// The last `lines` lines of the process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// SIGTERM, then SIGKILL after a grace period.
    pub fn stop(&mut self) {
        stop_pid(self.pid, Duration::from_secs(5));
        if let Some(child) = &mut self.child {
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
    }
}

/// Whether a process with this pid exists (and is not a zombie we could reap).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Sends SIGTERM to `pid`, waits up to `grace`, then SIGKILL.
pub fn stop_pid(pid: u32, grace: Duration) {
    let Ok(raw) = i32::try_from(pid) else { return };
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(raw, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while pid_alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if pid_alive(pid) {
        // SAFETY: as above.
        unsafe { libc::kill(raw, libc::SIGKILL) };
    }
}

/// The last `lines` lines of a log file, for error messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
