//! Conv and ConvTranspose over three or more spatial axes (NCDHW and beyond): im2col and a
//! GEMM per image and group for Conv; a GEMM and col2im per image and group for
//! ConvTranspose. The 1-D and 2-D convolutions keep their kernels (`conv`).

use super::conv::ConvAttrs;
use super::elementwise::{Binary, binary};
use super::window::{Window, WindowAttrs, listed, span};
use super::{Cx, input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{MAX_ELEMENTS, Tensor, checked_numel};
use cotenant_kernels::gemm::{Mat, sgemm};

/// A convolution over `x` (`[N, C, spatial...]`) with weight `w`: its window, the groups,
/// input channels per group and output channels per group.
pub(crate) struct ConvNd {
    pub window: Window,
    pub n: usize,
    pub c: usize,
    pub m: usize,
    pub groups: usize,
    /// The output shape `[N, M, spatial...]`.
    pub shape: Vec<usize>,
}

impl ConvNd {
    /// Elements of one group's im2col columns.
    pub fn columns(&self) -> OpResult<usize> {
        checked_numel(&[
            self.c / self.groups,
            self.window.taps(),
            self.window.positions(),
        ])
    }
}

fn attrs(c: &ConvAttrs, ceil_mode: bool) -> WindowAttrs<'_> {
    WindowAttrs {
        strides: c.strides.as_deref(),
        dilations: c.dilations.as_deref(),
        pads: c.pads.as_deref(),
        auto_pad: &c.auto_pad,
        ceil_mode,
    }
}

/// The geometry of Conv `c` on input shape `x` with weight shape `w`, any number of spatial
/// axes.
pub(crate) fn conv_nd_geometry(c: &ConvAttrs, x: &[usize], w: &[usize]) -> OpResult<ConvNd> {
    if x.len() < 3 || w.len() != x.len() {
        return shape_err(format!("Conv weight {w:?} does not match input {x:?}"));
    }
    let (n, ch, m, cg) = (x[0], x[1], w[0], w[1]);
    if cg.checked_mul(c.group) != Some(ch) || !m.is_multiple_of(c.group) {
        return shape_err(format!(
            "Conv: input channels {ch}, weight {w:?}, group {}",
            c.group
        ));
    }
    if let Some(k) = &c.kernel_shape
        && k.as_slice() != &w[2..]
    {
        return shape_err(format!(
            "kernel_shape {k:?} does not match weights {:?}",
            &w[2..]
        ));
    }
    let window = Window::resolve(&x[2..], &w[2..], &attrs(c, false))?;
    let mut shape = vec![n, m];
    shape.extend(&window.output);
    checked_numel(&shape)?;
    let g = ConvNd {
        window,
        n,
        c: ch,
        m,
        groups: c.group,
        shape,
    };
    g.columns()?;
    Ok(g)
}

/// Conv over any number of spatial axes: each image's and group's input unrolled into
/// columns (a row per input channel and tap), multiplied by the group's weights; then the
/// bias, a fused residual and a fused activation.
pub fn conv_nd(cx: &Cx, c: &ConvAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let (x, w, b) = (input(inputs, 0)?, input(inputs, 1)?, opt_input(inputs, 2));
    let g = conv_nd_geometry(c, &x.shape, &w.shape)?;
    let bias = bias(b, g.m, "Conv")?;
    let total = checked_numel(&g.shape)?;
    if total == 0 {
        return Tensor::f32(g.shape, Vec::new());
    }
    let (x, w) = (x.as_f32()?, w.as_f32()?);
    let (cg, mg) = (g.c / g.groups, g.m / g.groups);
    let (taps, positions) = (g.window.taps(), g.window.positions());
    let plane: usize = g.window.input.iter().product();
    let mut y = cx.take_f32(total);
    let mut columns = cx.scratch.borrow_mut();
    columns.clear();
    columns.resize(g.columns()?, 0.0);
    for n in 0..g.n {
        for group in 0..g.groups {
            let image = &x[(n * g.c + group * cg) * plane..][..cg * plane];
            g.window.visit(|pos, tap, off, _| {
                for ci in 0..cg {
                    columns[(ci * taps + tap) * positions + pos] =
                        off.map_or(0.0, |o| image[ci * plane + o]);
                }
            });
            let out = &mut y[(n * g.m + group * mg) * positions..][..mg * positions];
            for (k, row) in out.chunks_exact_mut(positions).enumerate() {
                row.fill(bias.map_or(0.0, |b| b[group * mg + k]));
            }
            sgemm(
                cx.threads,
                mg,
                positions,
                cg * taps,
                Mat::row_major(&w[group * mg * cg * taps..], cg * taps),
                Mat::row_major(&columns, positions),
                out,
                positions,
                true,
            );
        }
    }
    finish(cx, c, Tensor::f32(g.shape, y)?, opt_input(inputs, 3))
}

/// The fused residual (input 3) and activation, applied to a convolution's output.
fn finish(cx: &Cx, c: &ConvAttrs, y: Tensor, residual: Option<&Tensor>) -> OpResult<Tensor> {
    let mut y = match residual.filter(|_| c.residual) {
        Some(r) => binary(Binary::Add, &y, r)?,
        None => y,
    };
    if let Some(a) = c.act {
        a.apply_slice(cx.threads, y.as_f32_mut()?);
    }
    Ok(y)
}

/// The optional bias input, checked to have one value per output channel.
fn bias<'a>(b: Option<&'a Tensor>, m: usize, op: &str) -> OpResult<Option<&'a [f32]>> {
    match b {
        Some(b) if b.len() != m => {
            shape_err(format!("{op} bias has {} values for {m} channels", b.len()))
        }
        Some(b) => Ok(Some(b.as_f32()?)),
        None => Ok(None),
    }
}

/// The geometry of ConvTranspose `c` on input shape `x` with weight shape `w` (`[C, M/group,
/// kernel...]`), any number of spatial axes: the window is that of the convolution it is the
/// transpose of, read from output to input (`window.output` is the transposed input's extent,
/// `window.input` the output's).
pub(crate) fn conv_transpose_nd_geometry(
    c: &ConvAttrs,
    x: &[usize],
    w: &[usize],
) -> OpResult<ConvNd> {
    if x.len() < 3 || w.len() != x.len() || w[0] != x[1] {
        return shape_err(format!(
            "ConvTranspose weight {w:?} does not match input {x:?}"
        ));
    }
    let (n, ch) = (x[0], x[1]);
    let spatial = x.len() - 2;
    let m = w[1]
        .checked_mul(c.group)
        .ok_or(OpError::TooLarge(usize::MAX))?;
    if !ch.is_multiple_of(c.group) {
        return shape_err(format!("ConvTranspose: {ch} channels, group {}", c.group));
    }
    if let Some(k) = &c.kernel_shape
        && k.as_slice() != &w[2..]
    {
        return shape_err(format!(
            "kernel_shape {k:?} does not match weights {:?}",
            &w[2..]
        ));
    }
    let kernel = w[2..].to_vec();
    let strides = listed(c.strides.as_deref(), spatial, 1, "strides")?;
    let dilations = listed(c.dilations.as_deref(), spatial, 1, "dilations")?;
    let pads = listed(c.pads.as_deref(), 2 * spatial, 0, "pads")?;
    let extra = listed(c.output_padding.as_deref(), spatial, 0, "output_padding")?;
    for v in [&kernel, &strides, &dilations, &pads, &extra] {
        if v.iter().any(|&v| v > MAX_ELEMENTS) {
            return shape_err(format!(
                "ConvTranspose attribute {v:?} past the executor's limit"
            ));
        }
    }
    if strides.contains(&0) || dilations.contains(&0) || kernel.contains(&0) {
        return shape_err("ConvTranspose strides, dilations and kernel must be positive");
    }
    let target: Option<Vec<usize>> = match &c.output_shape {
        Some(v) if v.len() >= spatial => Some(v[v.len() - spatial..].to_vec()),
        Some(_) => return shape_err("attribute \"output_shape\" has too few entries"),
        None if c.auto_pad.starts_with("SAME") => {
            Some(x[2..].iter().zip(&strides).map(|(i, s)| i * s).collect())
        }
        None => None,
    };
    if !matches!(
        c.auto_pad.as_str(),
        "NOTSET" | "" | "VALID" | "SAME_UPPER" | "SAME_LOWER"
    ) {
        return Err(OpError::Unsupported(format!("auto_pad {:?}", c.auto_pad)));
    }
    let (mut begin, mut end) = (pads[..spatial].to_vec(), pads[spatial..].to_vec());
    if c.auto_pad == "VALID" {
        (begin, end) = (vec![0; spatial], vec![0; spatial]);
    }
    let mut out = vec![0; spatial];
    for i in 0..spatial {
        let full =
            x[i + 2].saturating_sub(1) * strides[i] + extra[i] + span(kernel[i], dilations[i])?;
        match &target {
            Some(t) => {
                let total = full.saturating_sub(t[i]);
                begin[i] = if c.auto_pad == "SAME_UPPER" {
                    total / 2
                } else {
                    total - total / 2
                };
                end[i] = total - begin[i];
                out[i] = t[i];
            }
            None => {
                if full < begin[i] + end[i] {
                    return shape_err("ConvTranspose pads exceed the output");
                }
                out[i] = full - begin[i] - end[i];
            }
        }
    }
    let mut shape = vec![n, m];
    shape.extend(&out);
    checked_numel(&shape)?;
    let window = Window {
        input: out,
        kernel,
        strides,
        dilations,
        begin,
        end,
        output: x[2..].to_vec(),
    };
    let g = ConvNd {
        window,
        n,
        c: ch,
        m,
        groups: c.group,
        shape,
    };
    // The columns of the transposed product: output channels per group, taps, input positions.
    checked_numel(&[m / c.group, g.window.taps(), g.window.positions()])?;
    Ok(g)
}

/// ConvTranspose over any number of spatial axes: per image and group, the weights' product
/// with the input gives every output channel's contribution of every tap at every input
/// position, summed into the output positions they land on; then the bias and a fused
/// activation.
pub fn conv_transpose_nd(cx: &Cx, c: &ConvAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let (x, w, b) = (input(inputs, 0)?, input(inputs, 1)?, opt_input(inputs, 2));
    let g = conv_transpose_nd_geometry(c, &x.shape, &w.shape)?;
    let bias = bias(b, g.m, "ConvTranspose")?;
    let total = checked_numel(&g.shape)?;
    if total == 0 {
        return Tensor::f32(g.shape, Vec::new());
    }
    let (x, w) = (x.as_f32()?, w.as_f32()?);
    let (cg, mg) = (g.c / g.groups, g.m / g.groups);
    let (taps, positions) = (g.window.taps(), g.window.positions());
    let plane: usize = g.window.input.iter().product();
    let mut y = vec![0.0f32; total];
    for (k, out) in y.chunks_exact_mut(plane).enumerate() {
        out.fill(bias.map_or(0.0, |b| b[k % g.m]));
    }
    let mut columns = cx.scratch.borrow_mut();
    columns.clear();
    columns.resize(mg * taps * positions, 0.0);
    for n in 0..g.n {
        for group in 0..g.groups {
            let image = &x[(n * g.c + group * cg) * positions..][..cg * positions];
            sgemm(
                cx.threads,
                mg * taps,
                positions,
                cg,
                Mat::transposed(&w[group * cg * mg * taps..], mg * taps),
                Mat::row_major(image, positions),
                &mut columns,
                positions,
                false,
            );
            let out = &mut y[(n * g.m + group * mg) * plane..][..mg * plane];
            // `visit` walks the convolution this transposes: its "output" is our input.
            g.window.visit(|pos, tap, off, _| {
                if let Some(o) = off {
                    for co in 0..mg {
                        out[co * plane + o] += columns[(co * taps + tap) * positions + pos];
                    }
                }
            });
        }
    }
    finish(cx, c, Tensor::f32(g.shape, y)?, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs() -> ConvAttrs {
        ConvAttrs {
            group: 1,
            auto_pad: "NOTSET".into(),
            ..ConvAttrs::default()
        }
    }

    /// A 3-D convolution of a 1x1x1 kernel is the input scaled; a 2x2x2 kernel of ones sums
    /// each 2x2x2 block; ConvTranspose of ones spreads each input over its block.
    #[test]
    fn three_d_convolutions_sum_their_windows() {
        let cx = Cx::new(1);
        let x = Tensor::f32(vec![1, 1, 2, 2, 2], (1..=8).map(|v| v as f32).collect()).unwrap();
        let w = Tensor::f32(vec![1, 1, 2, 2, 2], vec![1.0; 8]).unwrap();
        let y = conv_nd(&cx, &attrs(), &[Some(&x), Some(&w)]).unwrap();
        assert_eq!(
            (y.shape.clone(), y.as_f32().unwrap()),
            (vec![1, 1, 1, 1, 1], &[36.0][..])
        );
        let one = Tensor::f32(vec![1, 1, 1, 1, 1], vec![1.0]).unwrap();
        let t = conv_transpose_nd(&cx, &attrs(), &[Some(&one), Some(&w)]).unwrap();
        assert_eq!(t.shape, vec![1, 1, 2, 2, 2]);
        assert_eq!(t.as_f32().unwrap(), &[1.0; 8]);
        // Mismatched channels and a kernel larger than the input are shape errors.
        let w2 = Tensor::f32(vec![1, 2, 1, 1, 1], vec![1.0; 2]).unwrap();
        assert!(conv_nd(&cx, &attrs(), &[Some(&x), Some(&w2)]).is_err());
        let big = Tensor::f32(vec![1, 1, 3, 1, 1], vec![1.0; 3]).unwrap();
        assert!(conv_nd(&cx, &attrs(), &[Some(&x), Some(&big)]).is_err());
    }
}
