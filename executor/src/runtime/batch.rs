//! Requests to batches and back: checking a request against the model's inputs, stacking
//! compatible requests along the batch (first) dimension, and slicing the outputs per request.

use crate::error::RunError;
use crate::graph::{Dim, GraphInput};
use crate::plan::Plan;
use crate::tensor::Tensor;

/// One request's inputs, in the model's input order, checked against the model.
#[derive(Debug, Clone)]
pub struct Rows {
    pub tensors: Vec<Tensor>,
    /// Rows along the batch dimension (1 for a model without one).
    pub rows: usize,
}

impl Rows {
    /// The shapes after the batch dimension: requests batch together only when these match.
    pub fn key(&self) -> Vec<&[usize]> {
        self.tensors
            .iter()
            .map(|t| t.shape.get(1..).unwrap_or(&[]))
            .collect()
    }
}

/// Whether requests may be stacked into one batch: only where the plan proves every sample is
/// computed from itself alone (`Plan::separable_batch`). A model whose rows meet (a reduction
/// or normalisation over the batch, a reshape folding it) would show each request the others'
/// data; its requests run one at a time (see `Plan::batch_refusal` for why).
pub fn batchable(plan: &Plan) -> bool {
    plan.separable_batch.is_some()
}

/// Orders and checks named inputs against the model: every input present once, nothing unknown,
/// dtypes equal, ranks and fixed dimensions equal, and one batch size across inputs.
pub fn check(
    declared: &[GraphInput],
    given: Vec<(String, Tensor)>,
    batchable: bool,
) -> Result<Rows, RunError> {
    let mut given: Vec<Option<(String, Tensor)>> = given.into_iter().map(Some).collect();
    let mut tensors = Vec::with_capacity(declared.len());
    let mut rows = None;
    for decl in declared {
        let slot = given
            .iter_mut()
            .find(|g| g.as_ref().is_some_and(|(n, _)| *n == decl.name))
            .and_then(Option::take);
        let Some((name, tensor)) = slot else {
            return Err(RunError::MissingInput(decl.name.clone()));
        };
        if given
            .iter()
            .any(|g| g.as_ref().is_some_and(|(n, _)| *n == name))
        {
            return Err(RunError::BadInput {
                name,
                expected: "one tensor".into(),
                got: "the input twice".into(),
            });
        }
        let bad = |expected: String, got: String| RunError::BadInput {
            name: name.clone(),
            expected,
            got,
        };
        if tensor.dtype() != decl.dtype {
            return Err(bad(
                format!("{:?}", decl.dtype),
                format!("{:?}", tensor.dtype()),
            ));
        }
        if let Some(dims) = &decl.dims {
            if dims.len() != tensor.shape.len() {
                return Err(bad(
                    format!("rank {} {}", dims.len(), show(dims)),
                    format!("shape {:?}", tensor.shape),
                ));
            }
            for (axis, (d, &n)) in dims.iter().zip(&tensor.shape).enumerate() {
                if let Dim::Fixed(f) = d
                    && *f != n
                {
                    return Err(bad(
                        show(dims),
                        format!("{n} at axis {axis} of {:?}", tensor.shape),
                    ));
                }
            }
        }
        if batchable {
            let r = tensor.shape.first().copied().unwrap_or(1);
            if r == 0 {
                return Err(bad(
                    "a batch of at least 1".into(),
                    format!("shape {:?}", tensor.shape),
                ));
            }
            match rows {
                Some(prev) if prev != r => {
                    return Err(bad(
                        format!("batch size {prev} like the other inputs"),
                        format!("{r}"),
                    ));
                }
                _ => rows = Some(r),
            }
        }
        tensors.push(tensor);
    }
    if let Some((name, _)) = given.into_iter().flatten().next() {
        return Err(RunError::UnknownInput {
            name,
            expected: declared.iter().map(|d| d.name.clone()).collect(),
        });
    }
    Ok(Rows {
        tensors,
        rows: rows.unwrap_or(1),
    })
}

fn show(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => n.to_string(),
            Dim::Symbol(s) => s.clone(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// Stacks requests with equal keys along the first dimension, input by input.
pub fn stack(requests: &[&Rows]) -> Result<Vec<Tensor>, RunError> {
    let Some(first) = requests.first() else {
        return Ok(Vec::new());
    };
    if requests.len() == 1 {
        return Ok(first.tensors.clone());
    }
    (0..first.tensors.len())
        .map(|i| {
            let parts: Vec<&Tensor> = requests.iter().map(|r| &r.tensors[i]).collect();
            Tensor::cat_rows(&parts).map_err(|e| RunError::BadInput {
                name: format!("input #{i}"),
                expected: "stackable shapes".into(),
                got: e.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DType, split_rows};

    fn decl(name: &str, dims: Vec<Dim>) -> GraphInput {
        GraphInput {
            value: 0,
            name: name.into(),
            dtype: DType::F32,
            dims: Some(dims),
        }
    }

    fn x(rows: usize, fill: f32) -> (String, Tensor) {
        (
            "x".into(),
            Tensor::f32(vec![rows, 2], vec![fill; rows * 2]).expect("tensor"),
        )
    }

    #[test]
    fn stack_then_split_round_trips() {
        let inputs = [decl("x", vec![Dim::Symbol("batch".into()), Dim::Fixed(2)])];
        let a = check(&inputs, vec![x(1, 1.0)], true).expect("ok");
        let b = check(&inputs, vec![x(3, 2.0)], true).expect("ok");
        assert_eq!(a.key(), b.key());
        let stacked = stack(&[&a, &b]).expect("stack");
        assert_eq!(stacked[0].shape, vec![4, 2]);
        let parts = split_rows(vec![("y".into(), stacked[0].clone())], &[1, 3]);
        assert_eq!(parts[0][0].1.shape, vec![1, 2]);
        assert_eq!(parts[1][0].1.as_f32().expect("f32"), &[2.0; 6]);
    }

    #[test]
    fn bad_requests_name_the_input() {
        let inputs = [decl("x", vec![Dim::Symbol("batch".into()), Dim::Fixed(2)])];
        let wrong_dim = (
            "x".to_string(),
            Tensor::f32(vec![1, 3], vec![0.0; 3]).expect("t"),
        );
        let e = check(&inputs, vec![wrong_dim], true).expect_err("bad dim");
        assert!(e.to_string().contains("\"x\""), "{e}");
        let e = check(&inputs, vec![], true).expect_err("missing");
        assert!(matches!(e, RunError::MissingInput(_)));
        let e = check(
            &inputs,
            vec![x(1, 0.0), ("y".into(), Tensor::scalar_f32(1.0))],
            true,
        )
        .expect_err("unknown");
        assert!(matches!(e, RunError::UnknownInput { .. }));
        let ints = (
            "x".to_string(),
            Tensor::i64(vec![1, 2], vec![1, 2]).expect("t"),
        );
        assert!(check(&inputs, vec![ints], true).is_err());
        let empty = ("x".to_string(), Tensor::f32(vec![0, 2], vec![]).expect("t"));
        assert!(check(&inputs, vec![empty], true).is_err());
    }
}
