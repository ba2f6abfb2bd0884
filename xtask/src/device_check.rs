//! `cargo xtask device-check`: builds the CUDA device check here (release, `--features cuda`,
//! x86-64) and writes a self-contained bundle to `target/device-bundle/` for a GPU host: the
//! `device_check` and `gacer_search` binaries, `torch_eager.py`, the agent built with `cuda` and
//! `gpu_agent_check.py` with the example tenants, and `run.sh`, which runs them and writes
//! `$OUT/device-<date>.md`. The GPU host needs no Rust toolchain.

use anyhow::{Context, bail};
use std::path::Path;
use std::process::Command;

/// The bundle must travel to the device machine (64 MiB limit on what it carries).
const MAX_BUNDLE_BYTES: u64 = 60 << 20;

const RUN_SH: &str = r##"#!/usr/bin/env bash
# cotenant device check on a GPU host: CUDA kernels and zoo models vs the CPU backend with the
# copies and host waits of one batch counted, GPU latency against PyTorch eager's, tenant mixes
# under the three schedules at batch 1, 4 and 8 with GPU utilisation and a GACER timeline, and the
# agent serving the example tenants on the GPU (answers against onnxruntime, bad requests, load,
# NVML metrics). Writes $OUT/device-<date>.md (or ./device-out/ without $OUT) and prints it.
# Finishes in under 9 minutes (each step has its own timeout: 200 + 90 + 150 + 300 s).
# STEPS=kernels,torch,mixes,agent picks steps (default: all). DEVICE=sim tries the kernel and mix
# steps on the simulated GPU of a machine without one.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
stamp="$(date -u +%Y%m%d-%H%M%S)"
report="$out/device-$stamp.md"
py="$(command -v python3 || command -v python || true)"

# libnvrtc and libcublas: a CUDA toolkit if there is one, else the nvidia-* wheels torch brings.
dirs=""
add() { case ":$dirs:" in *":$1:"*) ;; *) dirs="$dirs:$1" ;; esac; }
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && add "$d"; done
if [ -n "$py" ]; then
  for s in $("$py" -c 'import site; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null); do
    for f in $(find "$s/nvidia" -maxdepth 4 \( -name 'libnvrtc.so*' -o -name 'libcublas.so*' -o -name 'libcublasLt.so*' \) 2>/dev/null); do
      add "$(dirname "$f")"
    done
  done
fi
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export COTENANT_PTX_CACHE="${TMPDIR:-/tmp}/cotenant-ptx"
export RUST_BACKTRACE=1
steps=",${STEPS:-kernels,torch,mixes,agent},"
want() { case "$steps" in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
rc=0; grc=0; arc=0

{
  echo "# device check $stamp"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -3
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo '```'
  echo
} > "$report"

if want kernels; then
echo "== device_check (CUDA vs CPU, CUDA latency)"
timeout 200 "$here/device_check" --device "${DEVICE:-cuda}" --out "$out/rust.md" --json "$out/gpu.json" --iters "${ITERS:-20}" 2>&1 | tee "$out/rust.log"
rc=${PIPESTATUS[0]}
if [ -f "$out/rust.md" ]; then cat "$out/rust.md" >> "$report"; else echo "device_check wrote no report (exit $rc)" >> "$report"; fi
if [ "$rc" -ne 0 ]; then { echo; echo "device_check log (last 40 lines):"; echo '```'; tail -40 "$out/rust.log"; echo '```'; } >> "$report"; fi
echo >> "$report"
fi

echo "== torch_eager.py (PyTorch eager latency)"
if want torch && [ -n "$py" ]; then
  timeout 90 "$py" "$here/torch_eager.py" --iters "${ITERS:-20}" --json "$out/torch.json" > "$out/torch.md" 2> "$out/torch.err"
  trc=$?
  cat "$out/torch.md" >> "$report"
  if [ -f "$out/gpu.json" ] && [ -f "$out/torch.json" ]; then
    "$py" - "$out/gpu.json" "$out/torch.json" >> "$report" <<'PY'
import json, sys
ours = {(r["model"], r["batch"]): r for r in json.load(open(sys.argv[1]))}
torch = {(r["model"], r["batch"]): r for r in json.load(open(sys.argv[2]))}
print("\n## cotenant on the GPU vs PyTorch eager (p50 latency ratio; target <= 1.2)\n")
print("| model | batch | cotenant p50 ms | PyTorch p50 ms | ratio |")
print("|---|---|---|---|---|")
for key in sorted(ours):
    if key in torch:
        o, t = ours[key]["p50"], torch[key]["p50"]
        print(f"| {key[0]} | {key[1]} | {o:.2f} | {t:.2f} | {o / t:.2f} |")
PY
  fi
  if [ "$trc" -ne 0 ]; then { echo; echo "torch_eager.py exit $trc:"; echo '```'; tail -20 "$out/torch.err"; echo '```'; } >> "$report"; fi
elif want torch; then
  echo "no python on this host: PyTorch eager not measured" >> "$report"
fi
echo >> "$report"

if want mixes; then
echo "== gacer_search --device cuda (tenant mixes: sequential, multi-stream, gacer)"
timeout 150 "$here/gacer_search" --device "${DEVICE:-cuda}" --duration "${MIX_SECS:-2}" --threads 8 > "$out/mixes.md" 2> "$out/mixes.err"
grc=$?
cat "$out/mixes.md" >> "$report"
if [ "$grc" -ne 0 ]; then { echo; echo "gacer_search exit $grc:"; echo '```'; tail -20 "$out/mixes.err"; echo '```'; } >> "$report"; fi
echo >> "$report"
fi

echo "== gpu_agent_check.py (the agent on the GPU: example tenants, schedules multi-stream and gacer)"
if want agent && [ -n "$py" ] && [ "${DEVICE:-cuda}" = cuda ]; then
  timeout 300 "$py" "$here/gpu_agent_check.py" --agent "$here/cotenant-agent" --tenants "$here/tenants" \
    --out "$out/agent.md" --secs "${AGENT_SECS:-10}" > "$out/agent.log" 2>&1
  arc=$?
  if [ -f "$out/agent.md" ]; then cat "$out/agent.md" >> "$report"; else { echo "gpu_agent_check.py wrote no report (exit $arc):"; echo '```'; tail -30 "$out/agent.log"; echo '```'; } >> "$report"; fi
  echo >> "$report"
fi

echo "device_check exit status: $rc (0 all passed, 1 a check failed, 2 no usable GPU, 124 timeout); gacer_search: $grc; gpu_agent_check: $arc" >> "$report"
echo
cat "$report"
[ "$rc" -ne 0 ] && exit $rc
exit $arc
"##;

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    if !args.is_empty() {
        bail!("device-check takes no arguments");
    }
    let root = crate::repo_root();
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build.args([
        "build",
        "--release",
        "-p",
        "cotenant-executor",
        "--features",
        "cuda",
        "--example",
        "device_check",
        "--example",
        "gacer_search",
    ]);
    crate::run(build)?;
    let mut agent = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    agent.args([
        "build",
        "--release",
        "-p",
        "cotenant-agent",
        "--features",
        "cuda",
    ]);
    crate::run(agent)?;
    let bundle = root.join("target/device-bundle");
    let _ = std::fs::remove_dir_all(&bundle);
    std::fs::create_dir_all(&bundle).with_context(|| format!("creating {}", bundle.display()))?;
    let release = crate::target_dir().join("release");
    for (bin, name) in [
        (release.join("examples/device_check"), "device_check"),
        (release.join("examples/gacer_search"), "gacer_search"),
        (release.join("cotenant-agent"), "cotenant-agent"),
    ] {
        let dest = bundle.join(name);
        std::fs::copy(&bin, &dest).with_context(|| format!("copying {}", bin.display()))?;
        // Debug line tables are not needed there; strip when the tool exists (smaller to carry).
        let _ = Command::new("strip").arg(&dest).status();
    }
    for (from, to) in [
        ("executor/bench/torch_eager.py", "torch_eager.py"),
        ("node-agent/bench/gpu_agent_check.py", "gpu_agent_check.py"),
    ] {
        std::fs::copy(root.join(from), bundle.join(to))?;
    }
    let tenants = bundle.join("tenants");
    std::fs::create_dir_all(&tenants)?;
    for example in ["resnet50.yaml", "mobilenet-v2.yaml", "bert-encoder.yaml"] {
        std::fs::copy(root.join("examples").join(example), tenants.join(example))?;
    }
    write_executable(&bundle.join("run.sh"), RUN_SH)?;
    let size: u64 = std::fs::read_dir(&bundle)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    if size > MAX_BUNDLE_BYTES {
        bail!(
            "the bundle is {} MiB, over the {} MiB that can be carried",
            size >> 20,
            MAX_BUNDLE_BYTES >> 20
        );
    }
    println!(
        "device bundle: {} ({:.1} MiB)\n\non the GPU host (device `run` tool), one call:\n  \
         command: bash target/device-bundle/run.sh\n  carry: [\"target/device-bundle\"]\n  \
         timeout_s: 540\nthe report comes back as $OUT/device-<date>.md",
        bundle.display(),
        size as f64 / (1 << 20) as f64
    );
    Ok(())
}

fn write_executable(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}
