//! The ONNX backend test data shipped in the onnx 1.22 wheel (node tests, pytorch-converted,
//! pytorch-operator, light models) run through the executor. The node tests are counted over
//! every inference operator: a case whose operator is not implemented is a failure, and only
//! the families in [`OUT_OF_SCOPE`] are left out. Writes the summary `CONFORMANCE.md` (run
//! without `CONFORMANCE_FILTER`) and fails when a case of implemented operators fails without
//! an [`ALLOWED`] reason, or when an allowed case passes.

mod common;

use cotenant_executor::ops::SUPPORTED_OPS;
use cotenant_executor::proto::{ModelProto, TensorProto};
use cotenant_executor::tensor::{DType, Data, Tensor};
use cotenant_executor::tensor_proto::decode_tensor;
use cotenant_executor::{CpuBackend, Model};
use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Failures of in-scope cases whose operators are all implemented: one reason per group, each
/// case named exactly or by a prefix ending in `*`. The test fails when a case fails that no
/// group names, and when a case a group names passes (or an entry names no failing in-scope
/// case), so that the list cannot go stale.
const ALLOWED: &[(&str, &[&str])] = &[(
    "float32 DFT and STFT in onnxruntime's float32 arithmetic (its radix-2 and Bluestein \
     transforms, to match what models are checked against): within 1e-6 of the outputs' scale, \
     but not within 1e-5 of the float64 reference's exact zeros; onnxruntime fails these cases too",
    &[
        "test_dft",
        "test_dft_opset19",
        "test_dft_axis*",
        "test_dft_inverse*",
        "test_dft_rfft*",
        "test_stft*",
    ],
)];

/// Node-test families outside an inference executor's scope, with the reason; each case of
/// one is counted once, under the first family it belongs to.
const OUT_OF_SCOPE: &[(&str, &str)] = &[
    (
        "training",
        "training operators (ai.onnx.preview.training) and training-mode runs: the executor serves inference",
    ),
    (
        "strings",
        "string tensors and string operators: the executor has no string element type",
    ),
    (
        "sequences and optionals",
        "sequence and optional values: the executor's values are tensors",
    ),
    (
        "ML domain",
        "ai.onnx.ml operators (trees, encoders, imputers, ...): classic ML, not neural network serving",
    ),
    (
        "random numbers",
        "random generators: their outputs cannot be compared with a reference",
    ),
];

const STRING_OPS: &[&str] = &[
    "StringConcat",
    "StringNormalizer",
    "StringSplit",
    "RegexFullMatch",
];
const SEQUENCE_OPS: &[&str] = &[
    "ConcatFromSequence",
    "Optional",
    "OptionalGetElement",
    "OptionalHasElement",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceErase",
    "SequenceInsert",
    "SequenceLength",
    "SequenceMap",
    "SplitToSequence",
];
const RANDOM_OPS: &[&str] = &[
    "Bernoulli",
    "Multinomial",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
];

/// The out-of-scope family of a case, from its name, operators and value types.
fn family(name: &str, ops: &[String], model: &Path) -> Option<&'static str> {
    let m = std::fs::read(model)
        .ok()
        .and_then(|b| ModelProto::decode(b.as_slice()).ok());
    let g = m.as_ref().and_then(|m| m.graph.as_ref());
    let values = g.into_iter().flat_map(|g| g.input.iter().chain(&g.output));
    let types: Vec<Option<i32>> = values
        .map(|v| {
            v.r#type
                .as_ref()
                .and_then(|t| t.tensor_type.as_ref())
                .map(|t| t.elem_type)
        })
        .collect();
    let string_consts = g.is_some_and(|g| g.initializer.iter().any(|t| t.data_type == 8));
    let any = |list: &[&str]| ops.iter().any(|o| list.contains(&o.as_str()));
    if name.contains("training")
        || ops
            .iter()
            .any(|o| o.starts_with("ai.onnx.preview.training."))
    {
        Some("training")
    } else if any(STRING_OPS) || types.contains(&Some(8)) || string_consts {
        Some("strings")
    } else if any(SEQUENCE_OPS) || types.contains(&None) {
        Some("sequences and optionals")
    } else if ops.iter().any(|o| o.starts_with("ai.onnx.ml.")) {
        Some("ML domain")
    } else if any(RANDOM_OPS) {
        Some("random numbers")
    } else {
        None
    }
}

fn matches(pattern: &str, case: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(pre) => case.starts_with(pre),
        None => pattern == case,
    }
}

/// The reason the allow-list gives for `case`'s failure.
fn allowed(case: &str) -> Option<&'static str> {
    ALLOWED
        .iter()
        .find(|(_, cases)| cases.iter().any(|p| matches(p, case)))
        .map(|(r, _)| *r)
}

fn read_pb(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let tp = TensorProto::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
    decode_tensor(&tp, None).map_err(|e| e.to_string())
}

fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.shape != want.shape {
        return Err(format!("shape {:?}, expected {:?}", got.shape, want.shape));
    }
    if got.dtype() != want.dtype() {
        return Err(format!(
            "type {:?}, expected {:?}",
            got.dtype(),
            want.dtype()
        ));
    }
    match (&got.data, &want.data) {
        (Data::F32(_) | Data::F64(_) | Data::F16(_) | Data::BF16(_), _) => {
            // A half-precision result rounds at every op: a few units in its last place.
            let (rtol, atol) = match got.dtype() {
                DType::F16 => (rtol.max(1e-2), atol.max(1e-3)),
                DType::BF16 => (rtol.max(2e-2), atol.max(1e-3)),
                _ => (rtol, atol),
            };
            let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                if !common::close(*a, *b, rtol, atol) {
                    return Err(format!("element {i}: {a} vs {b}"));
                }
            }
            Ok(())
        }
        _ if got.data == want.data => Ok(()),
        _ => Err("values differ".into()),
    }
}

struct Case {
    suite: &'static str,
    name: String,
    ops: Vec<String>,
    /// Every operator is one the executor implements.
    supported: bool,
    /// The out-of-scope family, if any.
    family: Option<&'static str>,
    result: Result<(), String>,
}

fn run_case(
    model_path: &Path,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
    rtol: f64,
    atol: f64,
) -> Result<(), String> {
    let model = Model::load(model_path).map_err(|e| format!("import: {e}"))?;
    let names = model.plan.input_names();
    if names.len() != inputs.len() {
        return Err(format!(
            "model has {} inputs, test gives {}",
            names.len(),
            inputs.len()
        ));
    }
    let backend = CpuBackend::new(2);
    let got = model
        .plan
        .run(&backend, names.into_iter().zip(inputs).collect())
        .map_err(|e| format!("run: {e}"))?;
    if got.len() < outputs.len() {
        return Err(format!("{} outputs, expected {}", got.len(), outputs.len()));
    }
    for (k, ((_, g), w)) in got.iter().zip(&outputs).enumerate() {
        compare(g, w, rtol, atol).map_err(|e| format!("output {k}: {e}"))?;
    }
    Ok(())
}

fn ops_of(path: &Path) -> Vec<String> {
    let Ok(bytes) = std::fs::read(path) else {
        return vec![];
    };
    let Ok(m) = ModelProto::decode(bytes.as_slice()) else {
        return vec![];
    };
    let mut ops: Vec<String> = m
        .graph
        .map(|g| {
            g.node
                .iter()
                .map(|n| {
                    if n.domain.is_empty() || n.domain == "ai.onnx" {
                        n.op_type.clone()
                    } else {
                        format!("{}.{}", n.domain, n.op_type)
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    ops.sort();
    ops.dedup();
    ops
}

fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for i in 0.. {
        let p = dir.join(format!("{prefix}_{i}.pb"));
        if !p.exists() {
            break;
        }
        v.push(p);
    }
    v
}

fn guarded(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("PANIC: {msg}"))
    })
}

#[test]
#[ignore = "needs COTENANT_PYTHON: run cargo xtask test"]
fn onnx_backend_test_data() {
    let site = common::py("import onnx, os; print(os.path.dirname(onnx.__file__))");
    let data = Path::new(&site).join("backend/test/data");
    let filter = std::env::var("CONFORMANCE_FILTER").unwrap_or_default();
    let mut cases: Vec<Case> = Vec::new();
    for suite in ["node", "pytorch-converted", "pytorch-operator"] {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(data.join(suite))
            .expect("suite dir")
            .flatten()
            .map(|e| e.path())
            .collect();
        dirs.sort();
        for dir in dirs {
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !name.contains(&filter) {
                continue;
            }
            let model = dir.join("model.onnx");
            let ops = ops_of(&model);
            let supported =
                !ops.is_empty() && ops.iter().all(|o| SUPPORTED_OPS.contains(&o.as_str()));
            let set = dir.join("test_data_set_0");
            let result = guarded(|| {
                let inputs = numbered(&set, "input")
                    .iter()
                    .map(|p| read_pb(p))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("input: {e}"))?;
                let outputs = numbered(&set, "output")
                    .iter()
                    .map(|p| read_pb(p))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("expected output: {e}"))?;
                run_case(&model, inputs, outputs, 1e-3, 1e-5)
            });
            let family = family(&name, &ops, &model);
            cases.push(Case {
                suite,
                name,
                ops,
                supported,
                family,
                result,
            });
        }
    }
    let mut light: Vec<PathBuf> = std::fs::read_dir(data.join("light"))
        .expect("light dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    light.sort();
    for model in light {
        let name = model
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !name.contains(&filter) {
            continue;
        }
        let ops = ops_of(&model);
        let supported = ops.iter().all(|o| SUPPORTED_OPS.contains(&o.as_str()));
        let result = guarded(|| {
            // The runner feeds light models arange(n)/n in the declared shape (see onnx's backend runner).
            let m =
                ModelProto::decode(std::fs::read(&model).map_err(|e| e.to_string())?.as_slice())
                    .map_err(|e| e.to_string())?;
            let g = m.graph.ok_or("no graph")?;
            let inits: Vec<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
            let mut inputs = Vec::new();
            for vi in g.input.iter().filter(|i| !inits.contains(&i.name.as_str())) {
                let shape: Vec<usize> = vi
                    .r#type
                    .as_ref()
                    .and_then(|t| t.tensor_type.as_ref())
                    .and_then(|t| t.shape.as_ref())
                    .map(|s| {
                        s.dim
                            .iter()
                            .map(|d| match d.value {
                                Some(cotenant_executor::proto::DimValue::DimValue(v)) => {
                                    v.max(1) as usize
                                }
                                _ => 1,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let n: usize = shape.iter().product();
                inputs.push(
                    Tensor::f32(
                        shape,
                        (0..n).map(|i| (i as f64 / n as f64) as f32).collect(),
                    )
                    .map_err(|e| e.to_string())?,
                );
            }
            let out = model.with_file_name(format!("{name}_output_0.pb"));
            run_case(&model, inputs, vec![read_pb(&out)?], 1e-3, 1e-5)
        });
        cases.push(Case {
            suite: "light",
            name,
            ops,
            supported,
            family: None,
            result,
        });
    }
    let report = Report::new(&cases, filter.is_empty());
    if filter.is_empty() {
        std::fs::write(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("CONFORMANCE.md"),
            report.markdown(),
        )
        .expect("write CONFORMANCE.md");
    }
    for c in cases.iter().filter(|c| c.family.is_none()) {
        if let Err(e) = &c.result {
            println!("fail {}/{}: {e}", c.suite, c.name);
        }
    }
    println!("{}", report.headline());
    let mut problems = report.unexpected.clone();
    problems.extend(report.stale.iter().cloned());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// What the run found.
struct Report<'a> {
    cases: &'a [Case],
    /// Failures of implemented operators that no group allows.
    unexpected: Vec<String>,
    /// Allowed cases that pass, and allow-list entries that match no case.
    stale: Vec<String>,
}

impl<'a> Report<'a> {
    fn new(cases: &'a [Case], all: bool) -> Report<'a> {
        let mut unexpected = Vec::new();
        let mut stale = Vec::new();
        for c in cases.iter().filter(|c| c.family.is_none() && c.supported) {
            match (&c.result, allowed(&c.name)) {
                (Err(e), None) => unexpected.push(format!("{}/{}: {e}", c.suite, c.name)),
                (Ok(()), Some(why)) => stale.push(format!(
                    "{}/{} passes but is allowed to fail ({why}): take it off ALLOWED",
                    c.suite, c.name
                )),
                _ => {}
            }
        }
        // Under a filter most cases were not run, so only a full run can tell an entry names
        // no failure it must excuse (a renamed case, or one now out of scope).
        if all {
            for (why, patterns) in ALLOWED {
                for p in patterns.iter() {
                    let excuses = cases.iter().any(|c| {
                        c.family.is_none()
                            && c.supported
                            && c.result.is_err()
                            && matches(p, &c.name)
                    });
                    if !excuses {
                        stale.push(format!(
                            "ALLOWED entry {p:?} ({why}) names no failing in-scope case"
                        ));
                    }
                }
            }
        }
        Report {
            cases,
            unexpected,
            stale,
        }
    }

    fn node_in_scope(&self) -> impl Iterator<Item = &'a Case> {
        self.cases
            .iter()
            .filter(|c| c.suite == "node" && c.family.is_none())
    }

    fn headline(&self) -> String {
        let total = self.cases.iter().filter(|c| c.suite == "node").count();
        let scope: Vec<&Case> = self.node_in_scope().collect();
        let pass = scope.iter().filter(|c| c.result.is_ok()).count();
        format!(
            "node tests: {pass} of {} in scope pass ({:.1}%); {} of {total} are out of scope",
            scope.len(),
            100.0 * pass as f64 / scope.len().max(1) as f64,
            total - scope.len()
        )
    }

    fn markdown(&self) -> String {
        let mut md = String::from(
            "# ONNX backend conformance\n\n\
             Generated by `executor/tests/conformance.rs` (run by `cargo xtask test`) from the \
             test data in the onnx 1.22.0 wheel. The node tests count every inference \
             operator: a case whose operator the executor does not implement is a failure. \
             The test prints each failing case with its error; the allow-list with one reason per \
             group is `ALLOWED` in the test.\n\n",
        );
        md.push_str(&format!("**{}.**\n\n", self.headline()));
        // Out of scope.
        md.push_str("## Out of scope\n\n| family | node cases | reason |\n|---|---|---|\n");
        for (fam, why) in OUT_OF_SCOPE {
            let n = self
                .cases
                .iter()
                .filter(|c| c.suite == "node" && c.family == Some(fam))
                .count();
            md.push_str(&format!("| {fam} | {n} | {why} |\n"));
        }
        // Failures by reason.
        let scope: Vec<&Case> = self.node_in_scope().collect();
        let failing: Vec<&&Case> = scope.iter().filter(|c| c.result.is_err()).collect();
        let missing_op = failing.iter().filter(|c| !c.supported).count();
        md.push_str("\n## In-scope node failures by reason\n\n| reason | cases |\n|---|---|\n");
        md.push_str(&format!(
            "| an operator is not implemented (below) | {missing_op} |\n"
        ));
        let mut by_reason: BTreeMap<&str, usize> = BTreeMap::new();
        for c in failing.iter().filter(|c| c.supported) {
            *by_reason
                .entry(allowed(&c.name).unwrap_or("**not allowed: the test fails**"))
                .or_default() += 1;
        }
        let mut reasons: Vec<(&str, usize)> = by_reason.into_iter().collect();
        reasons.sort_by_key(|(r, n)| (std::cmp::Reverse(*n), *r));
        for (r, n) in reasons {
            md.push_str(&format!("| {r} | {n} |\n"));
        }
        // Missing operators.
        let mut missing: BTreeMap<&str, usize> = BTreeMap::new();
        for c in scope.iter().filter(|c| !c.supported) {
            for o in c
                .ops
                .iter()
                .filter(|o| !SUPPORTED_OPS.contains(&o.as_str()))
            {
                *missing.entry(o.as_str()).or_default() += 1;
            }
        }
        md.push_str(&format!(
            "\n## In-scope operators not implemented ({})\n\nWith the node cases that use \
             each.\n\n",
            missing.len()
        ));
        md.push_str(
            &missing
                .iter()
                .map(|(o, n)| format!("{o} ({n})"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        // The other suites.
        md.push_str(
            "\n\n## Other suites\n\n| suite | cases | pass | allowed failures | other failures |\n\
             |---|---|---|---|---|\n",
        );
        let mut suites: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
        for c in self.cases.iter().filter(|c| c.suite != "node") {
            let e = suites.entry(c.suite).or_default();
            e.0 += 1;
            match (&c.result, allowed(&c.name)) {
                (Ok(()), _) => e.1 += 1,
                (Err(_), Some(_)) => e.2 += 1,
                _ => {}
            }
        }
        for (s, (n, p, a)) in suites {
            md.push_str(&format!("| {s} | {n} | {p} | {a} | {} |\n", n - p - a));
        }
        md
    }
}
