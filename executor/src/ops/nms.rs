//! NonMaxSuppression: per batch and class, boxes in order of descending score, each kept unless
//! it overlaps a box already kept by more than the IoU threshold. How many boxes are kept
//! depends on the data, so the output's size is known only once the op has run; the CPU plan
//! sizes every value at run time, and [`max_selected`] bounds it beforehand.

use super::{input, opt_input};
use crate::error::{OpResult, shape_err};
use crate::tensor::{Data, Tensor, checked_numel};
use std::cmp::Ordering;

/// Batches, classes and boxes of the `boxes` [B, N, 4] and `scores` [B, C, N] operands.
fn dims(boxes: &Tensor, scores: &Tensor) -> OpResult<(usize, usize, usize)> {
    match (boxes.shape.as_slice(), scores.shape.as_slice()) {
        (&[b, n, 4], &[sb, c, sn]) if b == sb && n == sn => Ok((b, c, n)),
        (bs, ss) => shape_err(format!(
            "NonMaxSuppression needs boxes [B, N, 4] and scores [B, C, N], not {bs:?} and {ss:?}"
        )),
    }
}

/// The boxes kept per batch and class at most: `max_output_boxes_per_class` (none or negative:
/// 0), and never more than there are boxes.
fn per_class_limit(inputs: &[Option<&Tensor>], n: usize) -> OpResult<usize> {
    let Some(t) = opt_input(inputs, 2) else {
        return Ok(0);
    };
    match t.to_i64_vec()?.as_slice() {
        [] => Ok(0),
        [m] => Ok(usize::try_from(*m).unwrap_or(0).min(n)),
        v => shape_err(format!(
            "NonMaxSuppression max_output_boxes_per_class must hold one value, not {}",
            v.len()
        )),
    }
}

/// The most rows the output can have.
pub(crate) fn max_selected(inputs: &[Option<&Tensor>]) -> OpResult<usize> {
    let (b, c, n) = dims(input(inputs, 0)?, input(inputs, 1)?)?;
    let limit = per_class_limit(inputs, n)?;
    checked_numel(&[b, c, limit, 3])?;
    Ok(b * c * limit)
}

/// A float threshold input, when given and not empty.
fn threshold(inputs: &[Option<&Tensor>], i: usize) -> OpResult<Option<f32>> {
    let Some(t) = opt_input(inputs, i) else {
        return Ok(None);
    };
    match t.as_f32()? {
        [] => Ok(None),
        [v] => Ok(Some(*v)),
        v => shape_err(format!(
            "NonMaxSuppression threshold must hold one value, not {}",
            v.len()
        )),
    }
}

pub fn non_max_suppression(inputs: &[Option<&Tensor>], center: bool) -> OpResult<Tensor> {
    let (boxes, scores) = (input(inputs, 0)?, input(inputs, 1)?);
    let (nb, nc, n) = dims(boxes, scores)?;
    let limit = per_class_limit(inputs, n)?;
    max_selected(inputs)?;
    let iou = threshold(inputs, 3)?.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&iou) {
        return shape_err(format!(
            "NonMaxSuppression iou_threshold {iou} is outside [0, 1]"
        ));
    }
    let min_score = threshold(inputs, 4)?;
    let (bv, sv) = (boxes.as_f32()?, scores.as_f32()?);
    let mut rows: Vec<i64> = Vec::new();
    let mut candidates: Vec<(f32, usize)> = Vec::with_capacity(n);
    let mut kept: Vec<usize> = Vec::with_capacity(limit);
    for b in 0..nb {
        let corners = |i: usize| -> [f32; 4] {
            let at = (b * n + i) * 4;
            [bv[at], bv[at + 1], bv[at + 2], bv[at + 3]]
        };
        for c in 0..nc {
            if limit == 0 {
                break;
            }
            let class = &sv[(b * nc + c) * n..][..n];
            candidates.clear();
            // Strictly above the score threshold, as onnxruntime and the reference keep them.
            candidates.extend(
                class
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| min_score.is_none_or(|m| **s > m))
                    .map(|(i, &s)| (s, i)),
            );
            // Highest score first, the lower index first among equals; NaN last.
            candidates.sort_by(|x, y| {
                match (x.0.is_nan(), y.0.is_nan()) {
                    (true, true) => Ordering::Equal,
                    (true, false) => Ordering::Greater,
                    (false, true) => Ordering::Less,
                    _ => y.0.partial_cmp(&x.0).unwrap_or(Ordering::Equal),
                }
                .then(x.1.cmp(&y.1))
            });
            kept.clear();
            for &(_, i) in &candidates {
                if kept.len() >= limit {
                    break;
                }
                let this = corners(i);
                if !kept
                    .iter()
                    .any(|&k| overlaps(&this, &corners(k), center, iou))
                {
                    kept.push(i);
                    rows.extend([b as i64, c as i64, i as i64]);
                }
            }
        }
    }
    let count = rows.len() / 3;
    Tensor::new(vec![count, 3], Data::I64(rows))
}

/// Whether two boxes overlap by more than `iou` (intersection over union), as onnxruntime
/// computes it in f32; boxes are `[y1, x1, y2, x2]` corners in any order, or `[x, y, w, h]`
/// around a centre. A box of no area suppresses nothing and is suppressed by nothing.
fn overlaps(a: &[f32; 4], b: &[f32; 4], center: bool, iou: f32) -> bool {
    let span = |p: f32, q: f32| if p <= q { (p, q) } else { (q, p) };
    let ((ax0, ax1), (ay0, ay1), (bx0, bx1), (by0, by1)) = if center {
        let c = |m: f32, len: f32| (m - len / 2.0, m + len / 2.0);
        (c(a[0], a[2]), c(a[1], a[3]), c(b[0], b[2]), c(b[1], b[3]))
    } else {
        (
            span(a[1], a[3]),
            span(a[0], a[2]),
            span(b[1], b[3]),
            span(b[0], b[2]),
        )
    };
    let (ix0, ix1) = (ax0.max(bx0), ax1.min(bx1));
    let (iy0, iy1) = (ay0.max(by0), ay1.min(by1));
    // Written so that NaN coordinates overlap nothing.
    if !(ix1 > ix0 && iy1 > iy0) {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    let area_a = (ax1 - ax0) * (ay1 - ay0);
    let area_b = (bx1 - bx0) * (by1 - by0);
    let union = area_a + area_b - inter;
    if !(inter > 0.0 && area_a > 0.0 && area_b > 0.0 && union > 0.0) {
        return false;
    }
    inter / union > iou
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::f32(shape.to_vec(), v.to_vec()).unwrap()
    }

    fn nms(
        boxes: &Tensor,
        scores: &Tensor,
        max: i64,
        iou: f32,
        score: Option<f32>,
    ) -> OpResult<Tensor> {
        let max = Tensor::i64(vec![1], vec![max]).unwrap();
        let iou = f32s(&[1], &[iou]);
        let score = score.map(|s| f32s(&[1], &[s]));
        let ins = [
            Some(boxes),
            Some(scores),
            Some(&max),
            Some(&iou),
            score.as_ref(),
        ];
        non_max_suppression(&ins, false)
    }

    #[test]
    fn keeps_the_best_box_of_each_overlapping_group() {
        // Two near-identical boxes, one far apart, one overlapping the best by less than the
        // threshold.
        let boxes = f32s(
            &[1, 4, 4],
            &[
                0., 0., 1., 1., //
                0., 0.1, 1., 1.1, //
                0., 10., 1., 11., //
                0., 0.5, 1., 1.5,
            ],
        );
        let scores = f32s(&[1, 1, 4], &[0.9, 0.95, 0.3, 0.8]);
        let out = nms(&boxes, &scores, 10, 0.5, None).unwrap();
        assert_eq!(out.shape, vec![3, 3]);
        assert_eq!(out.to_i64_vec().unwrap(), vec![0, 0, 1, 0, 0, 3, 0, 0, 2]);
        // The limit per class, and the score threshold (strict).
        let out = nms(&boxes, &scores, 1, 0.5, None).unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![0, 0, 1]);
        let out = nms(&boxes, &scores, 10, 0.5, Some(0.8)).unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![0, 0, 1]);
        // No limit given, or a negative one: nothing is selected.
        assert_eq!(
            nms(&boxes, &scores, -5, 0.5, None).unwrap().shape,
            vec![0, 3]
        );
        let none = non_max_suppression(&[Some(&boxes), Some(&scores)], false).unwrap();
        assert_eq!(none.shape, vec![0, 3]);
    }

    #[test]
    fn refuses_mismatched_shapes_and_thresholds() {
        let boxes = f32s(&[1, 2, 4], &[0.; 8]);
        let scores = f32s(&[1, 1, 3], &[0.; 3]);
        assert!(nms(&boxes, &scores, 1, 0.5, None).is_err());
        let scores = f32s(&[1, 1, 2], &[1., 1.]);
        for iou in [-0.1, 1.5, f32::NAN] {
            assert!(nms(&boxes, &scores, 1, iou, None).is_err(), "{iou}");
        }
        // A huge limit is capped by the number of boxes.
        let out = nms(&boxes, &scores, i64::MAX, 0.5, None).unwrap();
        assert_eq!(out.shape, vec![2, 3]);
        assert_eq!(
            max_selected(&[
                Some(&boxes),
                Some(&scores),
                Some(&Tensor::i64(vec![], vec![i64::MAX]).unwrap())
            ]),
            Ok(2)
        );
    }
}
