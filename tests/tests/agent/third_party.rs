//! Real models that third-party Python packages ship inside their wheels, from PyTorch, tf2onnx
//! and paddle2onnx exports, across vision, text and audio, including int8 (static QDQ among
//! them) and float16 ones: each runs through `cotenant-agent run` and onnxruntime on the same
//! seeded random inputs, and every output must match (`tests/third_party/compare.py`; the list,
//! with each file's sha256, is `tests/third_party/models.json`). The wheels are downloaded once
//! into the cotenant cache.

use super::{python, run_checked};
use cotenant_e2e::toolchain::cache_dir;
use cotenant_e2e::{TestNamespace, workspace_binary};
use std::process::Command;

#[test]
#[ignore = "needs COTENANT_PYTHON, the agent binary and the package index: cargo xtask test"]
fn models_from_python_packages_match_onnxruntime() {
    let work = std::env::temp_dir().join(format!("cotenant-third-party-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let mut cmd = Command::new(python());
    cmd.arg(TestNamespace::repo_root().join("tests/third_party/compare.py"))
        .arg("--agent")
        .arg(workspace_binary("cotenant-agent"))
        .arg("--cache")
        .arg(cache_dir().join("third-party-models"))
        .arg("--work")
        .arg(&work);
    run_checked(cmd, "a third-party model", String::new);
    let _ = std::fs::remove_dir_all(&work);
}
