//! Losses: NegativeLogLikelihoodLoss, and SoftmaxCrossEntropyLoss as its case of a
//! log-softmax over the classes first.

use super::attrs::Attrs;
use super::norm::softmax;
use super::{Cx, input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::Tensor;

#[derive(Clone, Debug, PartialEq)]
pub struct LossAttrs {
    /// SoftmaxCrossEntropyLoss: the input is scores, not log-probabilities.
    pub softmax: bool,
    pub reduction: Reduction,
    /// Targets of this class count for nothing.
    pub ignore_index: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reduction {
    None,
    Sum,
    /// The weighted sum over the sum of the weights.
    Mean,
}

impl LossAttrs {
    pub fn parse(a: &Attrs, softmax: bool) -> Result<LossAttrs, String> {
        Ok(LossAttrs {
            softmax,
            reduction: match a.string_or("reduction", "mean")?.as_str() {
                "none" => Reduction::None,
                "sum" => Reduction::Sum,
                "mean" => Reduction::Mean,
                r => return Err(format!("attribute \"reduction\" is {r:?}")),
            },
            ignore_index: a.int("ignore_index")?,
        })
    }
}

/// Outputs: the loss and, for SoftmaxCrossEntropyLoss, the log-probabilities.
pub fn loss(cx: &Cx, l: &LossAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
    let (x, target) = (input(inputs, 0)?, input(inputs, 1)?);
    if x.rank() < 2 {
        return shape_err(format!("loss input {:?} needs [N, C, ...]", x.shape));
    }
    let (n, c) = (x.shape[0], x.shape[1]);
    let mut want = vec![n];
    want.extend(&x.shape[2..]);
    if target.shape != want {
        return shape_err(format!(
            "target {:?} for input {:?}: expected {want:?}",
            target.shape, x.shape
        ));
    }
    let weight = opt_input(inputs, 2).map(|w| w.as_f32()).transpose()?;
    if weight.is_some_and(|w| w.len() != c) {
        return shape_err(format!(
            "{} class weights for {c} classes",
            weight.map_or(0, <[f32]>::len)
        ));
    }
    let log_prob = match l.softmax {
        true => softmax(cx, x, 1, true, false, 1.0)?,
        false => x.clone(),
    };
    let lp = log_prob.as_f32()?;
    let inner = x.shape[2..].iter().product::<usize>();
    // Per target element, its weighted loss and its weight.
    let (losses, weights): (Vec<f32>, Vec<f32>) = target
        .to_i64_vec()?
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            if Some(t) == l.ignore_index {
                return Ok((0.0, 0.0));
            }
            let class = usize::try_from(t)
                .ok()
                .filter(|&t| t < c)
                .ok_or_else(|| OpError::Shape(format!("target class {t} outside 0..{c}")))?;
            let w = weight.map_or(1.0, |w| w[class]);
            let (ni, d) = (i / inner.max(1), i % inner.max(1));
            Ok((-lp[(ni * c + class) * inner + d] * w, w))
        })
        .collect::<OpResult<Vec<_>>>()?
        .into_iter()
        .unzip();
    let sum = |v: &[f32]| v.iter().map(|&e| e as f64).sum::<f64>();
    let loss = match l.reduction {
        Reduction::None => Tensor::f32(target.shape.clone(), losses)?,
        Reduction::Sum => Tensor::scalar_f32(sum(&losses) as f32),
        Reduction::Mean => Tensor::scalar_f32((sum(&losses) / sum(&weights)) as f32),
    };
    Ok(vec![loss, log_prob])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_mean_skips_the_ignored_class_and_checks_targets() {
        let cx = Cx::new(1);
        let x = Tensor::f32(vec![2, 3], vec![-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]).unwrap();
        let w = Tensor::f32(vec![3], vec![1.0, 2.0, 3.0]).unwrap();
        let l = LossAttrs {
            softmax: false,
            reduction: Reduction::Mean,
            ignore_index: Some(0),
        };
        let t = Tensor::i64(vec![2], vec![2, 0]).unwrap();
        let out = loss(&cx, &l, &[Some(&x), Some(&t), Some(&w)]).unwrap();
        // Only the first: 3 * 3 / 3.
        assert_eq!(out[0].as_f32().unwrap(), &[3.0]);
        let bad = Tensor::i64(vec![2], vec![3, 1]).unwrap();
        assert!(loss(&cx, &l, &[Some(&x), Some(&bad), Some(&w)]).is_err());
        let short = Tensor::i64(vec![1], vec![1]).unwrap();
        assert!(loss(&cx, &l, &[Some(&x), Some(&short)]).is_err());
    }
}
