//! The additive mask of onnxruntime's `com.microsoft.Attention` from its `mask_index`, and of
//! its `MultiHeadAttention` from its `key_padding_mask`, in any of the formats those operators
//! take (they tell them apart by shape at run time, so no standard operator can): `[B]` valid
//! lengths (right padding), `[2B]` ends then starts (left padding), `[3B + 2]` lengths followed
//! by cumulative offsets (onnxruntime's CPU reads only the lengths), `[B, T]` or `[B, S, T]` raw
//! masks (non-zero: attend). Masked positions get `filter`, as in onnxruntime (-10000 by
//! default, so a row masked entirely attends uniformly); a causal mask adds `filter` above the
//! diagonal. The result is `[B, 1, S, T]`, for the standard Attention.

use crate::error::{OpResult, shape_err};
use crate::tensor::{Tensor, checked_numel};

#[derive(Clone, Debug, PartialEq)]
pub struct MaskIndexAttrs {
    pub filter: f32,
    pub causal: bool,
}

/// `[B, 1, S, T]`: the mask's shape for a query `[B, S, ...]` attending over `T` positions: its
/// own `S` without `keys`; with them, those of the key (`[B, L, hidden]` or `[B, heads, L, head
/// size]`) after those of the past keys (`[B, heads, P, head size]`), `T = P + L`.
pub fn mask_shape(
    query: &Tensor,
    keys: Option<&Tensor>,
    past_keys: Option<&Tensor>,
) -> OpResult<[usize; 4]> {
    let &[batch, seq, ..] = query.shape.as_slice() else {
        return shape_err(format!(
            "Attention's input is {:?}, not [batch, sequence, hidden]",
            query.shape
        ));
    };
    let total = match keys.map(|k| k.shape.as_slice()) {
        None => seq,
        Some(&[_, l, _]) | Some(&[_, _, l, _]) => l,
        Some(other) => {
            return shape_err(format!(
                "the key is {other:?}, not [batch, length, hidden] or [batch, heads, length, \
                 head size]"
            ));
        }
    };
    let past = past_keys.and_then(|p| p.shape.get(2)).copied().unwrap_or(0);
    let total = total
        .checked_add(past)
        .ok_or(crate::error::OpError::TooLarge(usize::MAX))?;
    checked_numel(&[batch, 1, seq, total])?;
    Ok([batch, 1, seq, total])
}

/// The mask of [`mask_shape`].
pub fn additive_mask(
    a: &MaskIndexAttrs,
    mask: Option<&Tensor>,
    query: &Tensor,
    keys: Option<&Tensor>,
    past_keys: Option<&Tensor>,
) -> OpResult<Tensor> {
    let [batch, _, seq, total] = mask_shape(query, keys, past_keys)?;
    let plane = seq * total;
    let mut out = vec![0f32; batch * plane];
    if out.is_empty() {
        return Tensor::f32(vec![batch, 1, seq, total], out);
    }
    if let Some(mask) = mask {
        let m = mask.to_i64_vec()?;
        let shape = mask.shape.as_slice();
        match *shape {
            [n] if n == batch || n == 2 * batch || n == 3 * batch + 2 => {
                for (b, rows) in out.chunks_exact_mut(plane).enumerate() {
                    let end = m[b].clamp(0, total as i64) as usize;
                    let start = match n == 2 * batch {
                        true => m[batch + b].clamp(0, total as i64) as usize,
                        false => 0,
                    };
                    for row in rows.chunks_exact_mut(total) {
                        for (j, v) in row.iter_mut().enumerate() {
                            if j < start || j >= end {
                                *v = a.filter;
                            }
                        }
                    }
                }
            }
            [b, t] if b == batch && t == total => {
                for (rows, raw) in out.chunks_exact_mut(plane).zip(m.chunks_exact(total)) {
                    for row in rows.chunks_exact_mut(total) {
                        for (v, &k) in row.iter_mut().zip(raw) {
                            if k <= 0 {
                                *v = a.filter;
                            }
                        }
                    }
                }
            }
            [b, s, t] if b == batch && s == seq && t == total => {
                for (v, &k) in out.iter_mut().zip(&m) {
                    if k <= 0 {
                        *v = a.filter;
                    }
                }
            }
            _ => {
                return shape_err(format!(
                    "Attention's mask is {shape:?}: for a batch of {batch}, {seq} queries and \
                     {total} keys it must be [{batch}] (lengths), [{}] (ends and starts), [{}] \
                     (lengths and offsets), [{batch}, {total}] or [{batch}, {seq}, {total}] \
                     (raw masks)",
                    2 * batch,
                    3 * batch + 2
                ));
            }
        }
    }
    if a.causal {
        for rows in out.chunks_exact_mut(plane) {
            for (s, row) in rows.chunks_exact_mut(total).enumerate() {
                for v in &mut row[s + 1..] {
                    *v += a.filter;
                }
            }
        }
    }
    Tensor::f32(vec![batch, 1, seq, total], out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Data;

    fn mask(shape: Vec<usize>, v: Vec<i32>) -> Tensor {
        Tensor::new(shape, Data::I32(v)).unwrap()
    }

    fn query(batch: usize, seq: usize) -> Tensor {
        Tensor::f32(vec![batch, seq, 1], vec![0.0; batch * seq]).unwrap()
    }

    const F: f32 = -10000.0;

    fn run(m: Option<&Tensor>, causal: bool) -> Vec<f32> {
        let a = MaskIndexAttrs { filter: F, causal };
        let t = additive_mask(&a, m, &query(2, 3), None, None).unwrap();
        assert_eq!(t.shape, [2, 1, 3, 3]);
        t.to_f64_vec().into_iter().map(|v| v as f32).collect()
    }

    #[test]
    fn every_format_masks_the_same_positions() {
        // Row 0 attends to positions 0..2, row 1 to 1..3.
        let want = [
            0., 0., F, 0., 0., F, 0., 0., F, F, 0., 0., F, 0., 0., F, 0., 0.,
        ];
        assert_eq!(run(Some(&mask(vec![4], vec![2, 3, 0, 1])), false), want);
        assert_eq!(
            run(Some(&mask(vec![2, 3], vec![1, 1, 0, 0, 1, 1])), false),
            want
        );
        let raw3: Vec<i32> = [[1, 1, 0]; 3]
            .into_iter()
            .chain([[0, 1, 1]; 3])
            .flatten()
            .collect();
        assert_eq!(run(Some(&mask(vec![2, 3, 3], raw3)), false), want);
        let lengths = run(Some(&mask(vec![2], vec![2, 3])), false);
        assert_eq!(&lengths[9..], &[0.; 9]);
    }

    #[test]
    fn causal_adds_the_filter_above_the_diagonal() {
        let one = [0., F, F, 0., 0., F, 0., 0., 0.];
        assert_eq!(run(None, true), [one, one].concat());
        let padded = run(Some(&mask(vec![2], vec![1, 3])), true);
        assert_eq!(&padded[..9], &[0., 2. * F, 2. * F, 0., F, 2. * F, 0., F, F]);
    }

    #[test]
    fn keys_and_past_keys_set_the_masks_length() {
        let a = MaskIndexAttrs {
            filter: F,
            causal: false,
        };
        let zeros =
            |shape: Vec<usize>| Tensor::f32(shape.clone(), vec![0.0; shape.iter().product()]);
        let (key3, key4, past) = (
            zeros(vec![2, 4, 6]).unwrap(),
            zeros(vec![2, 3, 4, 2]).unwrap(),
            zeros(vec![2, 3, 2, 2]).unwrap(),
        );
        // Lengths then cumulative offsets ([3B + 2]): only the lengths count.
        let m = mask(vec![8], vec![2, 6, 0, 3, 6, 0, 6, 12]);
        for (key, past, total) in [(&key3, None, 4), (&key4, None, 4), (&key3, Some(&past), 6)] {
            let t = additive_mask(&a, Some(&m), &query(2, 3), Some(key), past).unwrap();
            assert_eq!(t.shape, [2, 1, 3, total]);
            let v = t.to_f64_vec();
            let row0: Vec<f64> = (0..total)
                .map(|j| if j < 2 { 0.0 } else { F as f64 })
                .collect();
            assert_eq!(&v[..total], &row0[..]);
            assert!(v[3 * total..].iter().all(|&x| x == 0.0));
        }
        let raw = mask(vec![2, 6], vec![1; 12]);
        assert!(additive_mask(&a, Some(&raw), &query(2, 3), Some(&key3), None).is_err());
        assert!(additive_mask(&a, Some(&raw), &query(2, 3), Some(&key3), Some(&past)).is_ok());
    }

    #[test]
    fn a_mask_of_another_shape_is_an_error_naming_the_formats() {
        let a = MaskIndexAttrs {
            filter: F,
            causal: false,
        };
        for bad in [
            mask(vec![3], vec![1; 3]),
            mask(vec![2, 4], vec![1; 8]),
            mask(vec![2, 1, 3, 3], vec![1; 18]),
        ] {
            let e = additive_mask(&a, Some(&bad), &query(2, 3), None, None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("must be [2] (lengths)"), "{e}");
        }
    }
}
