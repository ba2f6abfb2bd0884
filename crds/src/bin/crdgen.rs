//! Writes the CRD YAML of the API into the chart, or with `--check` fails when the committed YAML
//! differs from what the Rust types generate.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.iter().any(|a| a == "--check");
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: crdgen [--check] [DIR]\n\nWrites the cotenant CRDs to DIR (default: charts/cotenant/crds).\n--check  exit 1 when a file in DIR differs from the generated YAML"
        );
        return ExitCode::SUCCESS;
    }
    let dir = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/cotenant/crds")
        });
    let mut stale = Vec::new();
    for (file, crd) in cotenant_crds::crds() {
        let yaml = match cotenant_crds::crd_yaml(&crd) {
            Ok(yaml) => yaml,
            Err(e) => {
                eprintln!("crdgen: cannot serialise {file}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let path = dir.join(file);
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(yaml.as_str()) {
                stale.push(path.display().to_string());
            }
        } else if let Err(e) =
            std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, yaml))
        {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if !stale.is_empty() {
        eprintln!(
            "crdgen: the committed CRDs differ from the types: {}\nrun `cargo run -p cotenant-crds --bin crdgen` and commit",
            stale.join(", ")
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
