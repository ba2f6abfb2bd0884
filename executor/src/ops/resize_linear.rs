//! Linear Resize over the two or three spatial axes at once, in onnxruntime's arithmetic.
//!
//! The separable two-tap resampling in `resize` gives the same values up to rounding; this
//! one rounds as onnxruntime's CPU kernels do (each output the sum, in corner order, of the
//! input corners times the product of their per-axis weights), so that a model which
//! re-quantizes a resized activation (`DynamicQuantizeLinear` after an upsampling) reads
//! the same integers. Which axes are interpolated follows onnxruntime too: both axes of a
//! 2-D tensor, all three of a 3-D one, the last two (or, channels last, the middle two) of a
//! 4-D tensor and the last three of a 5-D one, the others keeping their scale of 1.

use super::Cx;
use std::ops::Range;

/// The interpolated axes for a linear Resize with these per-axis scales, or `None` where
/// onnxruntime has no such kernel (another rank, or a scaled batch or channel axis).
pub(super) fn spatial_axes(scales: &[f64]) -> Option<Range<usize>> {
    let one = |a: usize| scales[a] == 1.0;
    match scales.len() {
        2 => Some(0..2),
        3 => Some(0..3),
        4 if one(0) && one(1) => Some(2..4),
        4 if one(0) && one(3) => Some(1..3),
        5 if one(0) && one(1) => Some(2..5),
        _ => None,
    }
}

/// One output position along an interpolated axis: the two input positions it reads and
/// their weights (the first's weight is the distance to the second, and the other way round).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Corners {
    pub first: usize,
    pub second: usize,
    pub first_weight: f32,
    pub second_weight: f32,
}

impl Corners {
    /// The corners around source coordinate `x` (clamped into the axis) of an axis `len` long.
    pub(super) fn around(x: f32, len: usize) -> Corners {
        let last = len.saturating_sub(1);
        let x = x.clamp(0.0, last as f32);
        let first = (x as usize).min(last);
        let second = (first + 1).min(last);
        if first == second {
            return Corners {
                first,
                second,
                first_weight: 0.5,
                second_weight: 0.5,
            };
        }
        Corners {
            first,
            second,
            first_weight: (x - second as f32).abs(),
            second_weight: (x - first as f32).abs(),
        }
    }
}

/// Resamples `src` (of `shape`) over the axes `spatial`, whose output positions `corners`
/// gives axis by axis; `out` is the output shape. Output rows (all positions of the innermost
/// interpolated axis) split across the threads.
pub(super) fn blend(
    cx: &Cx,
    src: &[f32],
    shape: &[usize],
    spatial: Range<usize>,
    corners: &[Vec<Corners>],
    out: &[usize],
) -> Vec<f32> {
    let inner: usize = shape[spatial.end..].iter().product();
    // Input strides of the interpolated axes, and of the planes they span.
    let mut strides = vec![0; spatial.len()];
    let mut plane = inner;
    for (k, ax) in spatial.clone().enumerate().rev() {
        strides[k] = plane;
        plane *= shape[ax];
    }
    let (row_axes, last) = corners.split_at(corners.len() - 1);
    let rows: usize = row_axes.iter().map(Vec::len).product();
    let row_len = last[0].len() * inner;
    let mut dst = cx.take_f32(out.iter().product());
    if row_len == 0 {
        return dst;
    }
    let rows_of = Rows {
        axes: row_axes,
        strides: &strides,
        last: &last[0],
        inner,
    };
    cx.in_pieces(&mut dst, row_len, |at, piece| {
        for (k, out_row) in piece.chunks_mut(row_len).enumerate() {
            let g = at / row_len + k;
            let plane = &src[g / rows * plane..(g / rows + 1) * plane];
            rows_of.blend(plane, g % rows, out_row);
        }
    });
    dst
}

/// The interpolated axes of one input plane: the outer ones (at most two), whose positions
/// make the rows, and the last.
struct Rows<'a> {
    axes: &'a [Vec<Corners>],
    strides: &'a [usize],
    last: &'a [Corners],
    /// Elements per position of the last axis (the channels of a channels-last layout).
    inner: usize,
}

impl Rows<'_> {
    /// Writes output row `row` of `plane` into `out`.
    fn blend(&self, plane: &[f32], row: usize, out: &mut [f32]) {
        let (axes, inner) = (self.axes.len(), self.inner);
        let mut position = [0usize; 2];
        let mut rest = row;
        for k in (0..axes).rev() {
            position[k] = rest % self.axes[k].len();
            rest /= self.axes[k].len();
        }
        // The corners of the row, the innermost row axis varying fastest: each one's input
        // offset and its weights from the innermost axis outwards.
        let mut offsets = [0usize; 4];
        let mut weights = [[1.0f32; 2]; 4];
        for rc in 0..1 << axes {
            for k in 0..axes {
                let c = self.axes[k][position[k]];
                let (i, w) = if rc >> (axes - 1 - k) & 1 == 1 {
                    (c.second, c.second_weight)
                } else {
                    (c.first, c.first_weight)
                };
                offsets[rc] += i * self.strides[k];
                weights[rc][axes - 1 - k] = w;
            }
        }
        if axes == 1 && inner == 1 {
            // Two axes, the last one contiguous: the common upsampling of NCHW maps.
            let (wa, wb) = (weights[0][0], weights[1][0]);
            let (ra, rb) = (&plane[offsets[0]..], &plane[offsets[1]..]);
            for (o, c) in out.iter_mut().zip(self.last) {
                *o = c.first_weight * wa * ra[c.first]
                    + c.second_weight * wa * ra[c.second]
                    + c.first_weight * wb * rb[c.first]
                    + c.second_weight * wb * rb[c.second];
            }
            return;
        }
        let mut terms = [(0usize, 0.0f32); 8];
        let corners = 2 << axes;
        for (c, out) in self.last.iter().zip(out.chunks_mut(inner)) {
            for rc in 0..1 << axes {
                for (t, (i, w)) in [(c.first, c.first_weight), (c.second, c.second_weight)]
                    .into_iter()
                    .enumerate()
                {
                    let weight = weights[rc][..axes].iter().fold(w, |p, &q| p * q);
                    terms[2 * rc + t] = (offsets[rc] + i * inner, weight);
                }
            }
            // Term by term over the inner elements, each sum in corner order.
            let (at, weight) = terms[0];
            for (o, &v) in out.iter_mut().zip(&plane[at..at + inner]) {
                *o = weight * v;
            }
            for &(at, weight) in &terms[1..corners] {
                for (o, &v) in out.iter_mut().zip(&plane[at..at + inner]) {
                    *o += weight * v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_split_their_weight_and_interior_positions_weigh_by_distance() {
        assert_eq!(
            Corners::around(3.7, 4),
            Corners {
                first: 3,
                second: 3,
                first_weight: 0.5,
                second_weight: 0.5
            }
        );
        let c = Corners::around(1.25, 4);
        assert_eq!((c.first, c.second), (1, 2));
        assert_eq!((c.first_weight, c.second_weight), (0.75, 0.25));
        assert_eq!(Corners::around(-0.5, 4).first_weight, 1.0);
    }

    #[test]
    fn spatial_axes_follow_the_layouts_with_unscaled_batch_and_channels() {
        assert_eq!(spatial_axes(&[1.0, 1.0, 2.0, 2.0]), Some(2..4));
        assert_eq!(spatial_axes(&[1.0, 2.0, 2.0, 1.0]), Some(1..3));
        assert_eq!(spatial_axes(&[2.0, 1.0, 1.0, 1.0]), None);
        assert_eq!(spatial_axes(&[1.0, 1.0, 2.0]), Some(0..3));
        assert_eq!(spatial_axes(&[2.0]), None);
    }
}
