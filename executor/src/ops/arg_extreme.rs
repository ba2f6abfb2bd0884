//! ArgMax and ArgMin of float32 as loops that vectorise: a tagger's or classifier's ArgMax over
//! its vocabulary reads millions of values a run, and the generic comparison (an ordering per
//! pair, NaN tested on both sides) takes ~2 ns a value.
//!
//! The result is the generic one's: NaN counts as beyond every number, and ties (NaN with NaN
//! included) go to the first position, or the last with `select_last_index`.

use cotenant_kernels::wide::wide;

/// Lanes of the per-row reduction.
const LANES: usize = 16;

/// The position along the middle axis of `[outer, n, inner]` values `v` of each extreme
/// (`max`, else the minimum), `outer × inner` of them. `n` must be at least 1.
pub(super) fn arg_positions_f32(
    v: &[f32],
    outer: usize,
    n: usize,
    inner: usize,
    max: bool,
    last: bool,
) -> Vec<i64> {
    let mut out = Vec::with_capacity(outer * inner);
    if outer * inner == 0 {
        return out;
    }
    for block in v.chunks_exact(n * inner).take(outer) {
        if inner == 1 {
            out.push(row_position(block, max, last) as i64);
        } else {
            columns(block, n, inner, max, last, &mut out);
        }
    }
    out
}

/// `a` beyond `b` in the direction sought, NaN beyond every number.
#[inline(always)]
fn beyond(a: f32, b: f32, max: bool) -> bool {
    (if max { a > b } else { a < b }) || (a.is_nan() && !b.is_nan())
}

/// Whether `a` takes the place of the best so far, `b`: beyond it, or equal with `last`.
#[inline(always)]
fn replaces(a: f32, b: f32, max: bool, last: bool) -> bool {
    beyond(a, b, max) || (last && (a == b || (a.is_nan() && b.is_nan())))
}

/// The position of the extreme of one contiguous row: its value by lanes (no NaN), then the
/// first or last position holding it. A row with a NaN takes the element by element walk.
fn row_position(row: &[f32], max: bool, last: bool) -> usize {
    let extreme = wide(
        #[inline(always)]
        || {
            let start = if max {
                f32::NEG_INFINITY
            } else {
                f32::INFINITY
            };
            let (mut best, mut nan) = ([start; LANES], [false; LANES]);
            let chunks = row.chunks_exact(LANES);
            let tail = chunks.remainder();
            for c in chunks {
                for l in 0..LANES {
                    let x = c[l];
                    best[l] = if (max && x > best[l]) || (!max && x < best[l]) {
                        x
                    } else {
                        best[l]
                    };
                    nan[l] |= x.is_nan();
                }
            }
            let mut m = start;
            for &x in best.iter().chain(tail) {
                m = if (max && x > m) || (!max && x < m) {
                    x
                } else {
                    m
                };
            }
            let nan = nan.iter().any(|&b| b) || tail.iter().any(|x| x.is_nan());
            (!nan).then_some(m)
        },
    );
    let Some(m) = extreme else {
        let mut best = 0;
        for (j, &x) in row.iter().enumerate().skip(1) {
            if replaces(x, row[best], max, last) {
                best = j;
            }
        }
        return best;
    };
    let at = match last {
        true => row.iter().rposition(|&x| x == m),
        false => row.iter().position(|&x| x == m),
    };
    at.unwrap_or(0)
}

/// The positions of the extremes of `inner` columns of `n` rows, appended to `out`: each row
/// against the best values so far, a lane per column.
fn columns(block: &[f32], n: usize, inner: usize, max: bool, last: bool, out: &mut Vec<i64>) {
    let mut best = block[..inner].to_vec();
    let mut at = vec![0i64; inner];
    wide(
        #[inline(always)]
        || {
            for (j, row) in block.chunks_exact(inner).enumerate().take(n).skip(1) {
                for ((b, a), &x) in best.iter_mut().zip(at.iter_mut()).zip(row) {
                    let take = replaces(x, *b, max, last);
                    *b = if take { x } else { *b };
                    *a = if take { j as i64 } else { *a };
                }
            }
        },
    );
    out.extend(at);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_positions_are_the_generic_ones_with_nans_and_ties() {
        let mut seed = 9u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            seed >> 8
        };
        // Few distinct values (ties), infinities, signed zeros and NaNs, in varying shares.
        let pool = [
            0.0,
            -0.0,
            1.5,
            -1.5,
            3.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for (outer, n, inner, nan_share) in [
            (3, 37, 1, 0),
            (2, 5, 1, 3),
            (4, 40, 1, 60),
            (2, 17, 5, 0),
            (3, 9, 33, 8),
            (1, 1, 7, 2),
            (5, 1, 1, 1),
            (2, 3, 0, 0),
            (0, 3, 2, 0),
        ] {
            let v: Vec<f32> = (0..outer * n * inner)
                .map(|_| match next() % 100 < nan_share {
                    true => f32::NAN,
                    false => pool[next() as usize % 7],
                })
                .collect();
            for (max, last) in [(true, false), (true, true), (false, false), (false, true)] {
                let want = super::super::index::arg_positions(&v, outer, n, inner, max, last);
                let got = arg_positions_f32(&v, outer, n, inner, max, last);
                assert_eq!(got, want, "{outer}x{n}x{inner}, max {max}, last {last}");
            }
        }
    }
}
