//! The Python references (onnx, onnxruntime, numpy) in a venv outside the repository, keyed by a
//! hash of `xtask/requirements.txt` so a change of pins makes a new venv.

use anyhow::{Context, bail};
use std::path::PathBuf;
use std::process::Command;

/// The folder holding libnvrtc from the `nvidia-cuda-nvrtc-cu12` wheel in the venv of `python`.
pub fn nvrtc_lib_dir(python: &std::path::Path) -> anyhow::Result<PathBuf> {
    let lib = python
        .parent()
        .and_then(|bin| bin.parent())
        .context("venv layout")?
        .join("lib");
    for entry in std::fs::read_dir(&lib).with_context(|| format!("{}", lib.display()))? {
        let dir = entry?.path().join("site-packages/nvidia/cuda_nvrtc/lib");
        if dir.is_dir() {
            return Ok(dir);
        }
    }
    bail!("no nvidia/cuda_nvrtc/lib under {}", lib.display())
}

/// Path of the venv's interpreter, creating the venv when missing.
pub fn venv() -> anyhow::Result<PathBuf> {
    let requirements = crate::repo_root().join("xtask/requirements.txt");
    let pins = std::fs::read(&requirements)
        .with_context(|| format!("cannot read {}", requirements.display()))?;
    let dir = cotenant_e2e::cache_dir().join(format!("venv-{:016x}", fnv1a(&pins)));
    let python = dir.join("bin/python");
    if dir.join(".complete").exists() {
        return Ok(python);
    }
    eprintln!("xtask: creating the Python venv {}", dir.display());
    let _ = std::fs::remove_dir_all(&dir);
    let interpreter = ["python3", "python"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .context("no python3 on PATH")?;
    let mut create = Command::new(interpreter);
    create.args(["-m", "venv"]).arg(&dir);
    crate::run(create)?;
    let mut install = Command::new(&python);
    install
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&requirements);
    crate::run(install)?;
    if !python.exists() {
        bail!("the venv at {} has no bin/python", dir.display());
    }
    std::fs::write(dir.join(".complete"), "")?;
    Ok(python)
}

/// FNV-1a: a stable content hash without a dependency.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
