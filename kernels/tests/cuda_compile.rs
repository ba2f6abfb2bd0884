//! Every CUDA source in `kernels/cuda/*.cu` compiles to PTX for sm_90 through NVRTC (PyPI wheel
//! `nvidia-cuda-nvrtc-cu12`) and assembles with ptxas (`nvidia-cuda-nvcc-cu12`) without register
//! spills. No GPU needed. `kernels/cuda/compile_check.py` does the work and prints the per-kernel
//! register / spill / shared-memory table; this test fails when it does.

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "needs COTENANT_PYTHON: cargo xtask test"]
fn cuda_kernels_compile_for_sm90() {
    let python = std::env::var("COTENANT_PYTHON")
        .expect("COTENANT_PYTHON: a python with the nvidia-cuda-{nvrtc,nvcc}-cu12 wheels");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let out = Command::new(&python)
        .current_dir(root)
        .args(["kernels/cuda/compile_check.py", "kernels/cuda"])
        .output()
        .unwrap_or_else(|e| panic!("running {python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "compile_check.py failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}
