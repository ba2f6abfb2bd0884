//! The sliding window of a convolution or pooling over any number of spatial axes: kernel,
//! strides, dilations and padding resolved against an input's spatial extent, and the output
//! extent they give. The N-D convolutions and poolings (`conv_nd`, `pool_nd`) walk it.

use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::MAX_ELEMENTS;
use cotenant_kernels::pool;

/// A window resolved against one input: per spatial axis, the input's extent, the kernel's
/// taps, stride, dilation, padding before and after, and the output's extent.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Window {
    pub input: Vec<usize>,
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub begin: Vec<usize>,
    pub end: Vec<usize>,
    pub output: Vec<usize>,
}

/// The window's attributes as a node gives them (absent lists are the defaults).
pub(crate) struct WindowAttrs<'a> {
    pub strides: Option<&'a [usize]>,
    pub dilations: Option<&'a [usize]>,
    pub pads: Option<&'a [usize]>,
    pub auto_pad: &'a str,
    pub ceil_mode: bool,
}

/// `v`, checked to have `n` entries, or `n` copies of `default`.
pub(crate) fn listed(
    v: Option<&[usize]>,
    n: usize,
    default: usize,
    name: &str,
) -> OpResult<Vec<usize>> {
    match v {
        Some(v) if v.len() != n => shape_err(format!(
            "attribute \"{name}\" has {} entries for {} spatial axes",
            v.len(),
            if name == "pads" { n / 2 } else { n }
        )),
        Some(v) => Ok(v.to_vec()),
        None => Ok(vec![default; n]),
    }
}

/// How far a kernel of `k` taps `d` apart reaches: `(k - 1) * d + 1`.
pub(crate) fn span(k: usize, d: usize) -> OpResult<usize> {
    super::conv::span(k, d)
}

/// The output extent along one axis of windows spanning `eff`, `stride` apart, over an input of
/// `input` with `begin` padding before it and `padded` in all, rounded down or (ceil mode) up; in
/// ceil mode the last window must start inside the input or its leading padding. `None` when no
/// window fits. In ceil mode a window longer than the padded input still gives one output when
/// the stride reaches past it, as onnxruntime and PyTorch compute it (Hugging Face's EfficientNet
/// pools its last 7x7 map with a 1280-wide window).
pub(crate) fn extent(
    input: usize,
    begin: usize,
    padded: usize,
    eff: usize,
    stride: usize,
    ceil: bool,
) -> Option<usize> {
    if padded < eff {
        return (ceil && eff - padded < stride).then_some(usize::from(input + begin > 0));
    }
    if !ceil {
        return Some((padded - eff) / stride + 1);
    }
    let n = (padded - eff).div_ceil(stride) + 1;
    Some(if (n - 1) * stride >= input + begin {
        n - 1
    } else {
        n
    })
}

impl Window {
    /// Resolves `a` for a kernel of `kernel` taps over an input of spatial extent `input`:
    /// explicit or automatic (SAME_UPPER, SAME_LOWER, VALID) padding, floor or ceil rounding
    /// of the output (the last window must start inside the input or its leading padding).
    pub fn resolve(input: &[usize], kernel: &[usize], a: &WindowAttrs) -> OpResult<Window> {
        let n = input.len();
        if kernel.len() != n {
            return shape_err(format!(
                "a kernel of {} axes over {n} spatial axes",
                kernel.len()
            ));
        }
        let strides = listed(a.strides, n, 1, "strides")?;
        let dilations = listed(a.dilations, n, 1, "dilations")?;
        let pads = listed(a.pads, 2 * n, 0, "pads")?;
        // Past any tensor's size these mean nothing, and past `isize` offsets would overflow.
        for (name, v) in [
            ("kernel_shape", kernel),
            ("strides", &strides[..]),
            ("dilations", &dilations[..]),
            ("pads", &pads[..]),
        ] {
            if v.iter().any(|&v| v > MAX_ELEMENTS) {
                return shape_err(format!(
                    "attribute \"{name}\" {v:?} past the executor's limit of {MAX_ELEMENTS}"
                ));
            }
            if name != "pads" && v.contains(&0) {
                return shape_err(format!("attribute \"{name}\" {v:?} has a zero entry"));
            }
        }
        let (mut begin, mut end) = (pads[..n].to_vec(), pads[n..].to_vec());
        let mut output = vec![0; n];
        for i in 0..n {
            let eff = span(kernel[i], dilations[i])?;
            match a.auto_pad {
                "SAME_UPPER" | "SAME_LOWER" => {
                    output[i] = input[i].div_ceil(strides[i]);
                    let total =
                        (output[i].saturating_sub(1) * strides[i] + eff).saturating_sub(input[i]);
                    let small = total / 2;
                    (begin[i], end[i]) = if a.auto_pad == "SAME_UPPER" {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    };
                    continue;
                }
                "VALID" => (begin[i], end[i]) = (0, 0),
                "NOTSET" | "" => {}
                other => return Err(OpError::Unsupported(format!("auto_pad {other:?}"))),
            }
            let padded = input[i] + begin[i] + end[i];
            output[i] = extent(input[i], begin[i], padded, eff, strides[i], a.ceil_mode)
                .ok_or_else(|| {
                    OpError::Shape(format!(
                        "a window of {eff} along spatial axis {i} is larger than the padded \
                         input {padded}"
                    ))
                })?;
        }
        Ok(Window {
            input: input.to_vec(),
            kernel: kernel.to_vec(),
            strides,
            dilations,
            begin,
            end,
            output,
        })
    }

    /// Taps in one window.
    pub fn taps(&self) -> usize {
        self.kernel.iter().product()
    }

    /// Positions in the output (per channel).
    pub fn positions(&self) -> usize {
        self.output.iter().product()
    }

    /// Calls `f(position, tap, offset, inside)` for every output position and every tap of its
    /// window (positions and taps each row-major): `offset` is the flat offset within one
    /// channel of the input element the tap reads, `None` where it reads padding (or past
    /// the padded input, as ceil rounding may); `inside` says whether the tap lies within the
    /// padded extent (`begin` + input + `end`).
    pub fn visit(&self, mut f: impl FnMut(usize, usize, Option<usize>, bool)) {
        let n = self.input.len();
        let (taps, positions) = (self.taps(), self.positions());
        let mut o = vec![0; n];
        let mut t = vec![0; n];
        for pos in 0..positions {
            for tap in 0..taps {
                let mut off = Some(0usize);
                let mut inside = true;
                for i in 0..n {
                    let p = o[i] * self.strides[i] + t[i] * self.dilations[i];
                    inside &= p < self.begin[i] + self.input[i] + self.end[i];
                    let at = p.checked_sub(self.begin[i]).filter(|&p| p < self.input[i]);
                    off = off.zip(at).map(|(f, p)| f * self.input[i] + p);
                }
                f(pos, tap, off, inside);
                step(&mut t, &self.kernel);
            }
            step(&mut o, &self.output);
        }
    }

    /// Per spatial axis and output index, the taps of its window that read the input and how
    /// many lie within the padded extent: built once, then used for every channel.
    pub fn reads(&self) -> Reads<'_> {
        let axes = (0..self.input.len())
            .map(|i| {
                let (k, s, d, begin) = (
                    self.kernel[i],
                    self.strides[i],
                    self.dilations[i],
                    self.begin[i],
                );
                let padded = begin + self.input[i] + self.end[i];
                (0..self.output[i])
                    .map(|o| {
                        let (first, read) = pool::taps(o, s, d, begin, k, self.input[i]);
                        (first, read, pool::padded_taps(o, s, d, k, padded))
                    })
                    .collect()
            })
            .collect();
        Reads { window: self, axes }
    }
}

/// A window's reads along each axis (see [`Window::reads`]): per output index, the input
/// index of the first tap that reads the input, how many taps read it, and how many lie within
/// the padded extent (`begin` + input + `end`; ceil rounding may reach past it).
pub struct Reads<'a> {
    window: &'a Window,
    axes: Vec<Vec<(usize, usize, usize)>>,
}

impl Reads<'_> {
    /// Calls `f(position, offset)` for every output position and every tap of its window that
    /// reads the input (positions and taps each row-major, as [`Window::visit`] orders them),
    /// with the flat offset within one channel of the element it reads. Taps in the padding
    /// are not visited, so the window's size costs nothing where it reads padding.
    pub fn visit(&self, mut f: impl FnMut(usize, usize)) {
        let w = self.window;
        let n = w.input.len();
        let (mut o, mut t) = (vec![0; n], vec![0; n]);
        // Per axis, for the current position: the first input index read, and how many.
        let (mut first, mut counts) = (vec![0; n], vec![0; n]);
        for pos in 0..w.positions() {
            for i in 0..n {
                (first[i], counts[i], _) = self.axes[i][o[i]];
            }
            for _ in 0..counts.iter().product::<usize>() {
                let off = (0..n).fold(0, |f, i| f * w.input[i] + first[i] + t[i] * w.dilations[i]);
                f(pos, off);
                step(&mut t, &counts);
            }
            step(&mut o, &w.output);
        }
    }

    /// For every output position, how many taps of its window lie within the padded extent:
    /// the divisor of an average that counts the padding. In f64, as windows of three or more
    /// axes may hold more taps than a `usize` counts.
    pub fn padded_taps(&self) -> Vec<f64> {
        let w = self.window;
        let mut o = vec![0; w.input.len()];
        (0..w.positions())
            .map(|_| {
                let taps = self
                    .axes
                    .iter()
                    .zip(&o)
                    .map(|(a, &i)| a[i].2 as f64)
                    .product();
                step(&mut o, &w.output);
                taps
            })
            .collect()
    }
}

/// The next multi-index after `i` within `dims`, row-major (wrapping to zeros at the end).
pub(crate) fn step(i: &mut [usize], dims: &[usize]) {
    for a in (0..i.len()).rev() {
        i[a] += 1;
        if i[a] < dims[a] {
            return;
        }
        i[a] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs<'a>(pads: Option<&'a [usize]>, auto_pad: &'a str, ceil: bool) -> WindowAttrs<'a> {
        WindowAttrs {
            strides: Some(&[2, 2, 2]),
            dilations: None,
            pads,
            auto_pad,
            ceil_mode: ceil,
        }
    }

    #[test]
    fn a_window_past_the_padded_input_fits_only_in_ceil_mode_within_one_stride() {
        // extent(input, begin, padded, eff, stride, ceil)
        assert_eq!(extent(7, 0, 7, 1280, 1280, true), Some(1));
        assert_eq!(extent(7, 0, 7, 1280, 1280, false), None);
        assert_eq!(extent(7, 0, 7, 9, 2, true), None);
        assert_eq!(extent(7, 0, 7, 8, 2, true), Some(1));
        assert_eq!(extent(0, 0, 0, 3, 4, true), Some(0));
        // Ordinary windows: floor, ceil, and a last window that would start in the end padding.
        assert_eq!(extent(5, 0, 5, 2, 2, false), Some(2));
        assert_eq!(extent(5, 0, 5, 2, 2, true), Some(3));
        assert_eq!(extent(4, 0, 6, 2, 2, true), Some(2));
    }

    #[test]
    fn windows_resolve_padding_and_rounding_per_axis() {
        let w = Window::resolve(&[5, 6, 7], &[3, 3, 3], &attrs(None, "NOTSET", false)).unwrap();
        assert_eq!(w.output, vec![2, 2, 3]);
        let w = Window::resolve(&[5, 6, 7], &[3, 3, 3], &attrs(None, "NOTSET", true)).unwrap();
        assert_eq!(w.output, vec![2, 3, 3]);
        let w = Window::resolve(&[5, 6, 7], &[3, 3, 3], &attrs(None, "SAME_UPPER", false)).unwrap();
        assert_eq!(
            (w.output, w.begin, w.end),
            (vec![3, 3, 4], vec![1, 0, 1], vec![1, 1, 1])
        );
        let pads: &[usize] = &[1, 0, 0, 1, 0, 0];
        let w = Window::resolve(&[1, 1, 1], &[3, 1, 1], &attrs(Some(pads), "", false)).unwrap();
        assert_eq!(w.output, vec![1, 1, 1]);
        let mut offs = Vec::new();
        w.visit(|o, t, off, inside| offs.push((o, t, off, inside)));
        assert_eq!(
            offs,
            vec![
                (0, 0, None, true),
                (0, 1, Some(0), true),
                (0, 2, None, true)
            ]
        );
        // Too large a kernel, wrong list lengths, absurd strides and unknown modes are errors.
        assert!(Window::resolve(&[2, 2, 2], &[3, 1, 1], &attrs(None, "", false)).is_err());
        assert!(Window::resolve(&[2, 2], &[1, 1, 1], &attrs(None, "", false)).is_err());
        let short: &[usize] = &[1, 1];
        assert!(Window::resolve(&[2, 2, 2], &[1, 1, 1], &attrs(Some(short), "", false)).is_err());
        let huge = WindowAttrs {
            strides: Some(&[1 << 40, 1, 1]),
            ..attrs(None, "", false)
        };
        assert!(Window::resolve(&[2, 2, 2], &[1, 1, 1], &huge).is_err());
        assert!(Window::resolve(&[2, 2, 2], &[1, 1, 1], &attrs(None, "SAME", false)).is_err());
    }

    #[test]
    fn reads_are_the_taps_that_read_the_input_and_padding_costs_nothing() {
        // (Input, kernel, strides), dilations, pads, ceil mode.
        type Case = (&'static [usize], &'static [usize], &'static [usize]);
        let cases: [(Case, &[usize], &[usize], bool); 4] = [
            (
                (&[5, 6, 7], &[3, 3, 3], &[2, 2, 2]),
                &[1, 1, 1],
                &[1, 0, 2, 1, 2, 0],
                true,
            ),
            ((&[4, 9], &[2, 3], &[1, 2]), &[3, 2], &[2, 3, 0, 4], false),
            ((&[3], &[5], &[3]), &[1], &[4, 4], true),
            ((&[2, 2], &[1, 1], &[1, 1]), &[1, 1], &[0, 0, 0, 0], false),
        ];
        for ((input, kernel, strides), dilations, pads, ceil) in cases {
            let a = WindowAttrs {
                strides: Some(strides),
                dilations: Some(dilations),
                pads: Some(pads),
                auto_pad: "NOTSET",
                ceil_mode: ceil,
            };
            let w = Window::resolve(input, kernel, &a).unwrap();
            let (mut want, mut want_padded) = (Vec::new(), vec![0.0; w.positions()]);
            w.visit(|pos, _, off, inside| {
                want.extend(off.map(|o| (pos, o)));
                want_padded[pos] += f64::from(u8::from(inside));
            });
            let (reads, mut got) = (w.reads(), Vec::new());
            reads.visit(|pos, o| got.push((pos, o)));
            assert_eq!(got, want, "{w:?}");
            assert_eq!(reads.padded_taps(), want_padded, "{w:?}");
        }
        // A billion taps a side over a 2x2 input: four reads, one per window.
        let huge = 1 << 30;
        let a = WindowAttrs {
            strides: Some(&[huge, huge]),
            dilations: None,
            pads: Some(&[huge - 1, huge - 1, huge - 1, huge - 1]),
            auto_pad: "NOTSET",
            ceil_mode: false,
        };
        let w = Window::resolve(&[2, 2], &[huge, huge], &a).unwrap();
        let (reads, mut got) = (w.reads(), Vec::new());
        reads.visit(|pos, o| got.push((pos, o)));
        assert_eq!(got, vec![(0, 0), (1, 1), (2, 2), (3, 3)]);
        assert_eq!(reads.padded_taps(), vec![(huge * huge) as f64; 4]);
    }
}
