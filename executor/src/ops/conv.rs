//! Conv and ConvTranspose (1-D and 2-D, NCHW): attribute handling and output geometry; the
//! arithmetic is in `cotenant_kernels::conv`. More spatial axes go to `conv_nd`. Also Col2Im,
//! which sums columns back into an image of any rank.

use super::elementwise::{Binary, binary};
use super::index::each_index;
use super::{Activation, Cx, input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::ops::attrs::Attrs;
use crate::tensor::{DType, Data, MAX_ELEMENTS, Tensor, checked_numel};
use cotenant_kernels::conv::{Conv2d, Epilogue, conv_transpose2d, conv2d};
use cotenant_kernels::direct_conv::{self, PackedFilter, direct_conv};
use cotenant_kernels::few_pixels;
use cotenant_kernels::fused::{self, Stage};
use cotenant_kernels::inverted_residual::inverted_residual;
use cotenant_kernels::nhwc_conv::NhwcFilter;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Default)]
pub struct ConvAttrs {
    pub kernel_shape: Option<Vec<usize>>,
    pub strides: Option<Vec<usize>>,
    pub dilations: Option<Vec<usize>>,
    pub pads: Option<Vec<usize>>,
    pub auto_pad: String,
    pub group: usize,
    pub output_padding: Option<Vec<usize>>,
    pub output_shape: Option<Vec<usize>>,
    /// A residual `Add` fused in by the fusion pass: input 3 is added before the activation.
    pub residual: bool,
    /// Activation fused in by the fusion pass.
    pub act: Option<Activation>,
    /// The weights reordered for the direct convolution, where the plan found them constant and
    /// the convolution suits it (see `pack_filter`).
    pub packed: Option<Arc<PackedFilter>>,
    /// Set by the layout pass (`passes::nhwc`): the input, the residual and the output are NHWC
    /// (`[N, H, W, C]`), the weights still ONNX's `[M, C, kh, kw]`.
    pub nhwc: bool,
    /// The weights packed for the NHWC convolution, where the plan found them constant.
    pub nhwc_filter: Option<Arc<NhwcFilter>>,
}

impl ConvAttrs {
    pub fn parse(a: &Attrs) -> Result<ConvAttrs, String> {
        let group = a.int_or("group", 1)?;
        if group < 1 {
            return Err(format!("group {group} must be positive"));
        }
        let c = ConvAttrs {
            kernel_shape: a.usizes("kernel_shape")?,
            strides: a.usizes("strides")?,
            dilations: a.usizes("dilations")?,
            pads: a.usizes("pads")?,
            auto_pad: a.string_or("auto_pad", "NOTSET")?,
            group: group as usize,
            output_padding: a.usizes("output_padding")?,
            output_shape: a.usizes("output_shape")?,
            residual: false,
            act: None,
            packed: None,
            nhwc: false,
            nhwc_filter: None,
        };
        if c.strides
            .iter()
            .flatten()
            .chain(c.dilations.iter().flatten())
            .any(|&s| s == 0)
        {
            return Err("strides and dilations must be positive".into());
        }
        Ok(c)
    }
}

/// Spatial parameters resolved against the actual input, as 2-D (1-D convs get height 1).
pub(crate) struct Geometry {
    pub k: [usize; 2],
    pub s: [usize; 2],
    pub d: [usize; 2],
    pub begin: [usize; 2],
    pub end: [usize; 2],
}

impl Geometry {
    /// The kernel's parameters for an `n`×`c`×`hw` input giving `m`×`out_hw` outputs.
    fn conv2d(
        &self,
        n: usize,
        c: usize,
        hw: [usize; 2],
        m: usize,
        out_hw: [usize; 2],
        groups: usize,
    ) -> Conv2d {
        Conv2d {
            n,
            c,
            h: hw[0],
            w: hw[1],
            m,
            kh: self.k[0],
            kw: self.k[1],
            sh: self.s[0],
            sw: self.s[1],
            dh: self.d[0],
            dw: self.d[1],
            pt: self.begin[0],
            pl: self.begin[1],
            oh: out_hw[0],
            ow: out_hw[1],
            groups,
        }
    }
}

/// `[n, m, spatial dims...]`: 1-D convolutions drop the height of 1 they were computed with.
fn output_shape(n: usize, m: usize, out_hw: [usize; 2], spatial: usize) -> Vec<usize> {
    let mut shape = vec![n, m];
    shape.extend(if spatial == 1 {
        &out_hw[1..]
    } else {
        &out_hw[..]
    });
    shape
}

/// The optional bias input, checked to have one value per output channel.
pub(crate) fn bias<'a>(b: Option<&'a Tensor>, m: usize, op: &str) -> OpResult<Option<&'a [f32]>> {
    match b {
        Some(b) if b.len() != m => {
            shape_err(format!("{op} bias has {} values for {m} channels", b.len()))
        }
        Some(b) => Ok(Some(b.as_f32()?)),
        None => Ok(None),
    }
}

/// The first two entries of a per-axis list, 1-D lists as height `default`.
pub(crate) fn two(v: &[usize], spatial: usize, default: usize) -> [usize; 2] {
    if spatial == 1 {
        [default, v.first().copied().unwrap_or(default)]
    } else {
        [
            v.first().copied().unwrap_or(default),
            v.get(1).copied().unwrap_or(default),
        ]
    }
}

pub(crate) fn geometry(
    c: &ConvAttrs,
    spatial: usize,
    kernel: &[usize],
    input: [usize; 2],
    transpose: bool,
) -> OpResult<Geometry> {
    let get = |v: &Option<Vec<usize>>, name: &str| -> OpResult<Vec<usize>> {
        match v {
            Some(v) if v.len() != spatial => shape_err(format!(
                "{name} has {} entries for {spatial} spatial axes",
                v.len()
            )),
            Some(v) => Ok(v.clone()),
            None => Ok(vec![1; spatial]),
        }
    };
    let ks = match &c.kernel_shape {
        Some(k) if k.as_slice() != kernel => {
            return shape_err(format!(
                "kernel_shape {k:?} does not match weights {kernel:?}"
            ));
        }
        _ => kernel.to_vec(),
    };
    let k = two(&ks, spatial, 1);
    let s = two(&get(&c.strides, "strides")?, spatial, 1);
    let d = two(&get(&c.dilations, "dilations")?, spatial, 1);
    let (mut begin, mut end) = ([0; 2], [0; 2]);
    match c.auto_pad.as_str() {
        "NOTSET" | "" => {
            if let Some(p) = &c.pads {
                if p.len() != 2 * spatial {
                    return shape_err(format!(
                        "pads has {} entries for {spatial} spatial axes",
                        p.len()
                    ));
                }
                begin = two(&p[..spatial], spatial, 0);
                end = two(&p[spatial..], spatial, 0);
            }
        }
        "VALID" => {}
        mode @ ("SAME_UPPER" | "SAME_LOWER") if !transpose => {
            for i in 0..2 {
                let out = input[i].div_ceil(s[i]);
                let total = (out.saturating_sub(1))
                    .saturating_mul(s[i])
                    .saturating_add(span(k[i], d[i])?)
                    .saturating_sub(input[i]);
                let small = total / 2;
                (begin[i], end[i]) = if mode == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
            }
        }
        "SAME_UPPER" | "SAME_LOWER" => {}
        other => return Err(OpError::Unsupported(format!("auto_pad {other:?}"))),
    }
    // A stride, dilation or pad past any tensor's size means nothing a model needs, and past
    // `isize` the kernels' index arithmetic would overflow.
    for (name, v) in [
        ("strides", s),
        ("dilations", d),
        ("pads", begin),
        ("pads", end),
    ] {
        if v.iter().any(|&v| v > MAX_ELEMENTS) {
            return shape_err(format!(
                "{name} {v:?} past the executor's limit of {MAX_ELEMENTS}"
            ));
        }
    }
    Ok(Geometry {
        k,
        s,
        d,
        begin,
        end,
    })
}

/// How far a kernel of `k` taps `d` apart reaches: `(k - 1) * d + 1`; a kernel with no taps or
/// a reach past `usize` is a shape error.
pub(crate) fn span(k: usize, d: usize) -> OpResult<usize> {
    k.checked_sub(1)
        .and_then(|k| k.checked_mul(d)?.checked_add(1))
        .ok_or_else(|| OpError::Shape(format!("kernel of {k} taps with dilation {d}")))
}

/// `a + b + c`, refusing overflow.
fn sum3(a: usize, b: usize, c: usize) -> OpResult<usize> {
    a.checked_add(b)
        .and_then(|s| s.checked_add(c))
        .ok_or(OpError::TooLarge(usize::MAX))
}

/// Splits `[N, C, spatial...]` into (n, c, [h, w]) with 1-D as height 1.
fn nchw(shape: &[usize], what: &str) -> OpResult<(usize, usize, [usize; 2])> {
    match shape {
        [n, c, w] => Ok((*n, *c, [1, *w])),
        [n, c, h, w] => Ok((*n, *c, [*h, *w])),
        s if s.len() > 4 => Err(OpError::Unsupported(format!(
            "{what} with {} spatial axes",
            s.len() - 2
        ))),
        s => shape_err(format!(
            "{what} input must be [N, C, spatial...], got {s:?}"
        )),
    }
}

/// The kernel geometry and output shape of Conv `c` on input shape `x` with weight shape `w`:
/// the one resolution of a convolution's window, used by the CPU op and the GPU lowering alike.
pub(crate) fn conv_geometry(
    c: &ConvAttrs,
    x: &[usize],
    w: &[usize],
) -> OpResult<(Conv2d, Vec<usize>)> {
    let (n, ch, hw) = nchw(x, "Conv")?;
    let spatial = x.len() - 2;
    if w.len() != x.len() {
        return shape_err(format!("Conv weight {w:?} does not match input {x:?}"));
    }
    let (m, cg) = (w[0], w[1]);
    if cg.checked_mul(c.group) != Some(ch) || !m.is_multiple_of(c.group) {
        return shape_err(format!(
            "Conv: input channels {ch}, weight {w:?}, group {}",
            c.group
        ));
    }
    let g = geometry(c, spatial, &w[2..], hw, false)?;
    let mut out_hw = [0; 2];
    for i in 0..2 {
        let eff = span(g.k[i], g.d[i])?;
        let padded = sum3(hw[i], g.begin[i], g.end[i])?;
        if padded < eff {
            return shape_err(format!(
                "Conv kernel {eff} larger than padded input {padded}"
            ));
        }
        out_hw[i] = (padded - eff) / g.s[i] + 1;
    }
    let p = g.conv2d(n, ch, hw, m, out_hw, c.group);
    let shape = output_shape(n, m, out_hw, spatial);
    checked_numel(&shape)?;
    Ok((p, shape))
}

pub fn conv(cx: &Cx, c: &ConvAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    if c.nhwc {
        return super::conv_nhwc::conv_in_nhwc(cx, c, inputs);
    }
    let (x, w, b) = (input(inputs, 0)?, input(inputs, 1)?, opt_input(inputs, 2));
    if x.rank() > 4 {
        return super::conv_nd::conv_nd(cx, c, inputs);
    }
    let (p, shape) = conv_geometry(c, &x.shape, &w.shape)?;
    let bias = bias(b, p.m, "Conv")?;
    // Nothing to compute (a batch of 0, no output channels); the kernels assume work.
    if checked_numel(&shape)? == 0 {
        return Tensor::f32(shape, Vec::new());
    }
    let (epi, later) = epilogue(c, inputs, &shape, bias)?;
    let mut out = cx.take_f32(checked_numel(&shape)?);
    let (x, scratch) = (x.as_f32()?, &mut cx.scratch.borrow_mut());
    // The direct convolution splits the input into strides² phase planes: past the kernel's
    // size a stride only skips input, and a hostile one (2^40) would ask for 2^40 planes.
    let sane_strides = p.sh <= p.kh && p.sw <= p.kw;
    match &c.packed {
        Some(f)
            if sane_strides
                && direct_conv::applies(&p)
                && f.fits(&p)
                && !few_pixels::applies(&p) =>
        {
            direct_conv(&p, x, f, epi, &mut out, scratch, cx.threads)
        }
        _ => conv2d(&p, x, w.as_f32()?, epi, &mut out, scratch, cx.threads),
    }
    add_later(cx, c, Tensor::f32(shape, out)?, later)
}

/// What the kernel adds and applies on the way out: the bias, a fused residual of the output's
/// shape and the activation. A residual of another shape (a broadcast Add) comes back apart, to
/// add after the kernel with [`add_later`], the activation with it.
pub(crate) fn epilogue<'a>(
    c: &ConvAttrs,
    inputs: &[Option<&'a Tensor>],
    shape: &[usize],
    bias: Option<&'a [f32]>,
) -> OpResult<(Epilogue<'a>, Option<&'a Tensor>)> {
    let (residual, later) = match opt_input(inputs, 3).filter(|_| c.residual) {
        Some(r) if r.shape == shape => (Some(r.as_f32()?), None),
        Some(r) => (None, Some(r)),
        None => (None, None),
    };
    let act = if later.is_some() { None } else { c.act };
    Ok((
        Epilogue {
            bias,
            residual,
            act,
        },
        later,
    ))
}

/// `act(y + r)` for a residual `r` the kernel did not add.
pub(crate) fn add_later(
    cx: &Cx,
    c: &ConvAttrs,
    y: Tensor,
    later: Option<&Tensor>,
) -> OpResult<Tensor> {
    match later {
        None => Ok(y),
        Some(r) => {
            let mut sum = binary(Binary::Add, &y, r)?;
            if let Some(a) = c.act {
                a.apply_slice(cx.threads, sum.as_f32_mut()?);
            }
            Ok(sum)
        }
    }
}

/// The convolutions op `op` holds, each with the input its weight is: a Conv's, or a fused
/// block's two or three.
pub fn weighted_convs(op: &mut super::Op) -> Vec<(&mut ConvAttrs, usize)> {
    match op {
        super::Op::Conv(c) => vec![(c, 1)],
        super::Op::PointwiseDepthwise(f) => {
            let f = &mut **f;
            let mut v = vec![(&mut f.pointwise, 1), (&mut f.depthwise, 3)];
            v.extend(f.project.as_mut().map(|p| (p, 5)));
            v
        }
        _ => Vec::new(),
    }
}

/// Reorders a Conv's constant `weight` once: for the NHWC convolution where the layout pass
/// chose NHWC, else for the direct convolution where this CPU runs that convolution directly
/// (2-D, ungrouped, undilated, larger than 1x1, AVX-512).
pub fn pack_filter(c: &mut ConvAttrs, weight: &Tensor) {
    let (&[m, cg, kh, kw], Ok(w)) = (weight.shape.as_slice(), weight.as_f32()) else {
        return;
    };
    let dilation = match c.dilations.as_deref() {
        None => [1, 1],
        Some(&[dh, dw]) => [dh, dw],
        Some(_) => return,
    };
    if c.nhwc {
        if c.group == 1 || (cg == 1 && c.group == m) {
            // Stride 1: the 3x3 layers with enough positions run by Winograd.
            let stride_one = c.strides.as_deref().is_none_or(|s| s == [1, 1]);
            let filter = match c.group == 1 && stride_one && dilation == [1, 1] {
                true => NhwcFilter::with_winograd(w, m, cg, kh, kw),
                false => NhwcFilter::new(w, m, cg, kh, kw),
            };
            c.nhwc_filter = Some(Arc::new(filter));
        }
    } else if direct_conv::suits([kh, kw], dilation, c.group) {
        c.packed = Some(Arc::new(PackedFilter::new(w, m, cg, kh, kw)));
    }
}

/// A 1x1 Conv and the depthwise Conv reading its output, fused by the fusion pass, and with
/// `project` also the 1x1 Conv reading the depthwise output (MobileNet's whole inverted residual
/// block). Inputs are `[x, pointwise weight, pointwise bias, depthwise weight, depthwise bias,
/// projection weight, projection bias, residual]` (biases and residual optional).
#[derive(Clone, Debug, PartialEq)]
pub struct PointwiseDepthwise {
    pub pointwise: ConvAttrs,
    pub depthwise: ConvAttrs,
    pub project: Option<ConvAttrs>,
}

/// Fewest output rows for which the whole block runs fused. The fused kernel gives each thread
/// a range of rows; on smaller images (mobilenet_v2's 7x7 blocks) the rows two ranges share and
/// the narrow products leave the second thread nothing to gain (a 160-960-160 block: 0.33 ms on
/// one thread and on two). There the pair runs fused and the projection apart, both split by
/// channels (mobilenet_v2 batch 1, two threads: 5.55 -> 5.15 ms). The choice depends on the
/// image alone, never on the batch or the threads, so every image is computed alike.
const MIN_FUSED_ROWS: usize = 8;

pub fn pointwise_depthwise(
    cx: &Cx,
    f: &PointwiseDepthwise,
    inputs: &[Option<&Tensor>],
) -> OpResult<Tensor> {
    if f.pointwise.nhwc {
        return super::conv_nhwc::pointwise_depthwise_nhwc(cx, f, inputs);
    }
    let x = input(inputs, 0)?;
    let (w1, b1) = (input(inputs, 1)?, opt_input(inputs, 2));
    let (w2, b2) = (input(inputs, 3)?, opt_input(inputs, 4));
    let (p1, mid) = conv_geometry(&f.pointwise, &x.shape, &w1.shape)?;
    let (p2, shape) = conv_geometry(&f.depthwise, &mid, &w2.shape)?;
    if checked_numel(&mid)? == 0 || checked_numel(&shape)? == 0 {
        // Nothing for the fused kernels to do; the plain path handles empty tensors.
        return one_by_one(cx, f, inputs);
    }
    let fusable = p1.is_pointwise() && p1.groups == 1 && p2.is_depthwise() && p1.c > 0;
    let Some(pr) = &f.project else {
        if !fusable {
            // Shapes the fused kernel does not cover: the two convolutions one after the other.
            let y = conv(cx, &f.pointwise, &[Some(x), Some(w1), b1])?;
            return conv(cx, &f.depthwise, &[Some(&y), Some(w2), b2]);
        }
        let mut out = cx.take_f32(checked_numel(&shape)?);
        fused::pointwise_depthwise(
            stage(&p1, w1, b1, f.pointwise.act)?,
            stage(&p2, w2, b2, f.depthwise.act)?,
            x.as_f32()?,
            &mut out,
            cx.threads,
        );
        return Tensor::f32(shape, out);
    };
    let (w3, b3) = (input(inputs, 5)?, opt_input(inputs, 6));
    let residual = opt_input(inputs, 7).filter(|_| pr.residual);
    let (p3, out_shape) = conv_geometry(pr, &shape, &w3.shape)?;
    if !(fusable && p3.is_pointwise() && p3.groups == 1)
        || residual.is_some_and(|r| r.shape != out_shape)
        || p2.oh < MIN_FUSED_ROWS
    {
        // The three convolutions one after the other (the first two still fused if they can).
        let pair = PointwiseDepthwise {
            project: None,
            ..f.clone()
        };
        let y = pointwise_depthwise(cx, &pair, &inputs[..inputs.len().min(5)])?;
        return conv(cx, pr, &[Some(&y), Some(w3), b3, residual]);
    }
    let mut out = cx.take_f32(checked_numel(&out_shape)?);
    let mut project = stage(&p3, w3, b3, pr.act)?;
    project.epi.residual = residual.map(Tensor::as_f32).transpose()?;
    inverted_residual(
        stage(&p1, w1, b1, f.pointwise.act)?,
        stage(&p2, w2, b2, f.depthwise.act)?,
        project,
        x.as_f32()?,
        &mut out,
        cx.threads,
    );
    Tensor::f32(out_shape, out)
}

/// The fused convolutions one after the other, each as the plain Conv runs it.
pub(crate) fn one_by_one(
    cx: &Cx,
    f: &PointwiseDepthwise,
    inputs: &[Option<&Tensor>],
) -> OpResult<Tensor> {
    let at = |k: usize| inputs.get(k).copied().flatten();
    let y = conv(cx, &f.pointwise, &[at(0), at(1), at(2)])?;
    let y = conv(cx, &f.depthwise, &[Some(&y), at(3), at(4)])?;
    match &f.project {
        Some(pr) => conv(
            cx,
            pr,
            &[Some(&y), at(5), at(6), at(7).filter(|_| pr.residual)],
        ),
        None => Ok(y),
    }
}

fn stage<'a>(
    p: &'a Conv2d,
    w: &'a Tensor,
    b: Option<&'a Tensor>,
    act: Option<Activation>,
) -> OpResult<Stage<'a>> {
    Ok(Stage {
        p,
        weight: w.as_f32()?,
        epi: Epilogue {
            bias: bias(b, p.m, "Conv")?,
            residual: None,
            act,
        },
    })
}

/// The kernel geometry and output shape of ConvTranspose `c` on input shape `x` with weight
/// shape `w`.
pub(crate) fn conv_transpose_geometry(
    c: &ConvAttrs,
    x: &[usize],
    w: &[usize],
) -> OpResult<(Conv2d, Vec<usize>)> {
    let (n, ch, hw) = nchw(x, "ConvTranspose")?;
    let spatial = x.len() - 2;
    if w.len() != x.len() || w[0] != ch {
        return shape_err(format!(
            "ConvTranspose weight {w:?} does not match input {x:?}"
        ));
    }
    let m = w[1]
        .checked_mul(c.group)
        .ok_or(OpError::TooLarge(usize::MAX))?;
    if !ch.is_multiple_of(c.group) {
        return shape_err(format!("ConvTranspose: {ch} channels, group {}", c.group));
    }
    let mut g = geometry(c, spatial, &w[2..], hw, true)?;
    let op = match &c.output_padding {
        Some(v) if v.len() != spatial => return shape_err("output_padding length"),
        Some(v) if v.iter().any(|&p| p > MAX_ELEMENTS) => {
            return shape_err(format!("output_padding {v:?} past the executor's limit"));
        }
        Some(v) => two(v, spatial, 0),
        None => [0, 0],
    };
    let mut out_hw = [0; 2];
    let target = match &c.output_shape {
        Some(v) if v.len() >= spatial => Some(two(&v[v.len() - spatial..], spatial, 1)),
        Some(_) => return shape_err("output_shape length"),
        None if c.auto_pad.starts_with("SAME") => {
            Some([hw[0].saturating_mul(g.s[0]), hw[1].saturating_mul(g.s[1])])
        }
        None => None,
    };
    for i in 0..2 {
        let full = sum3(
            hw[i].saturating_sub(1).saturating_mul(g.s[i]),
            op[i],
            span(g.k[i], g.d[i])?,
        )?;
        match target {
            Some(t) => {
                let total = full.saturating_sub(t[i]);
                g.begin[i] = if c.auto_pad == "SAME_UPPER" {
                    total / 2
                } else {
                    total - total / 2
                };
                out_hw[i] = t[i];
            }
            None => {
                let pads = g.begin[i].saturating_add(g.end[i]);
                if full < pads {
                    return shape_err("ConvTranspose pads exceed the output");
                }
                out_hw[i] = full - pads;
            }
        }
    }
    let p = g.conv2d(n, ch, hw, m, out_hw, c.group);
    let shape = output_shape(n, m, out_hw, spatial);
    checked_numel(&shape)?;
    Ok((p, shape))
}

pub fn conv_transpose(cx: &Cx, c: &ConvAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let (x, w, b) = (input(inputs, 0)?, input(inputs, 1)?, opt_input(inputs, 2));
    if x.rank() > 4 {
        return super::conv_nd::conv_transpose_nd(cx, c, inputs);
    }
    let (p, shape) = conv_transpose_geometry(c, &x.shape, &w.shape)?;
    let bias = bias(b, p.m, "ConvTranspose")?;
    if checked_numel(&shape)? == 0 {
        return Tensor::f32(shape, Vec::new());
    }
    let mut out = cx.take_f32(checked_numel(&shape)?);
    let mut scratch = cx.scratch.borrow_mut();
    conv_transpose2d(
        &p,
        x.as_f32()?,
        w.as_f32()?,
        bias,
        &mut out,
        &mut scratch,
        cx.threads,
    );
    if let Some(a) = c.act {
        a.apply_slice(cx.threads, &mut out);
    }
    Tensor::f32(shape, out)
}
/// Col2Im's window along each image axis; absent lists mean dilation 1, no padding, stride 1.
#[derive(Clone, Debug, PartialEq)]
pub struct Col2ImAttrs {
    pub dilations: Option<Vec<usize>>,
    pub pads: Option<Vec<usize>>,
    pub strides: Option<Vec<usize>>,
}

impl Col2ImAttrs {
    pub fn parse(a: &Attrs) -> Result<Col2ImAttrs, String> {
        let c = Col2ImAttrs {
            dilations: a.usizes("dilations")?,
            pads: a.usizes("pads")?,
            strides: a.usizes("strides")?,
        };
        if c.dilations
            .iter()
            .chain(&c.strides)
            .flatten()
            .any(|&v| v == 0)
        {
            return Err("attributes \"dilations\" and \"strides\" must be positive".into());
        }
        Ok(c)
    }
}

/// Where Col2Im puts its columns: the output shape `[N, C, image...]`, and per image axis the
/// block size, the number of block positions, stride, dilation and padding before.
pub(crate) struct Col2Im {
    pub out: Vec<usize>,
    block: Vec<usize>,
    blocks: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    before: Vec<usize>,
}

pub(crate) fn col2im_geometry(
    a: &Col2ImAttrs,
    x: &[usize],
    image: &Tensor,
    block: &Tensor,
) -> OpResult<Col2Im> {
    let image = super::shape::to_dims(&image.to_i64_vec()?)?;
    let block = super::shape::to_dims(&block.to_i64_vec()?)?;
    let s = image.len();
    if s == 0 || block.len() != s || x.len() != 3 {
        return shape_err(format!(
            "Col2Im of {x:?} into an image {image:?} by blocks {block:?}"
        ));
    }
    let listed = |v: &Option<Vec<usize>>, n: usize, d: usize| match v {
        Some(v) if v.len() != n => shape_err(format!(
            "Col2Im attribute has {} entries, expected {n}",
            v.len()
        )),
        Some(v) => Ok(v.clone()),
        None => Ok(vec![d; n]),
    };
    let (dilations, pads, strides) = (
        listed(&a.dilations, s, 1)?,
        listed(&a.pads, 2 * s, 0)?,
        listed(&a.strides, s, 1)?,
    );
    let k = checked_numel(&block)?;
    if k == 0 || !x[1].is_multiple_of(k) {
        return shape_err(format!("Col2Im of {} channels by blocks {block:?}", x[1]));
    }
    let mut blocks = Vec::with_capacity(s);
    for i in 0..s {
        let eff = span(block[i], dilations[i])?;
        let padded = sum3(image[i], pads[i], pads[i + s])?;
        if padded < eff {
            return shape_err(format!(
                "Col2Im block {eff} larger than padded image {padded}"
            ));
        }
        blocks.push((padded - eff) / strides[i] + 1);
    }
    if checked_numel(&blocks)? != x[2] {
        return shape_err(format!(
            "Col2Im of {} columns where the image has {blocks:?} block positions",
            x[2]
        ));
    }
    let mut out = vec![x[0], x[1] / k];
    out.extend(&image);
    checked_numel(&out)?;
    Ok(Col2Im {
        out,
        block,
        blocks,
        strides,
        dilations,
        before: pads[..s].to_vec(),
    })
}

/// Col2Im: every column of `[N, C * block, L]` summed back into the image positions its
/// block covers (padding dropped); computed in f64.
pub fn col2im(a: &Col2ImAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Err(OpError::DType(format!("Col2Im of {:?}", x.dtype())));
    }
    let g = col2im_geometry(a, &x.shape, input(inputs, 1)?, input(inputs, 2)?)?;
    let image = &g.out[2..];
    let plane: usize = image.iter().product();
    let (k, l) = (x.shape[1] / g.out[1], x.shape[2]);
    let v = x.to_f64_vec();
    let mut y = vec![0.0; checked_numel(&g.out)?];
    for (nc, out) in y
        .chunks_exact_mut(plane.max(1))
        .enumerate()
        .take(g.out[0] * g.out[1])
    {
        let columns = &v[nc * k * l..][..k * l];
        let mut kf = 0;
        each_index(&g.block, |tap| {
            let mut lf = 0;
            each_index(&g.blocks, |at| {
                let mut off = Some(0);
                for i in 0..image.len() {
                    let p = (at[i] * g.strides[i] + tap[i] * g.dilations[i])
                        .checked_sub(g.before[i])
                        .filter(|&p| p < image[i]);
                    off = off.zip(p).map(|(o, p)| o * image[i] + p);
                }
                if let Some(o) = off {
                    out[o] += columns[kf * l + lf];
                }
                lf += 1;
                Ok(())
            })?;
            kf += 1;
            Ok(())
        })?;
    }
    Ok(super::elementwise::cast(
        &Tensor::new(g.out, Data::F64(y))?,
        x.dtype(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn col2im_sums_overlapping_blocks_and_checks_its_geometry() {
        let a = Col2ImAttrs {
            dilations: None,
            pads: None,
            strides: None,
        };
        let dims = |v: Vec<i64>| Tensor::i64(vec![v.len()], v).unwrap();
        // One channel, blocks of 2 over an image of 3: two positions overlapping at the middle.
        let x = Tensor::f32(vec![1, 2, 2], vec![1.0, 2.0, 10.0, 20.0]).unwrap();
        let run = |image: Vec<i64>, block: Vec<i64>| {
            let (i, b) = (dims(image), dims(block));
            col2im(&a, &[Some(&x), Some(&i), Some(&b)])
        };
        assert_eq!(
            run(vec![3], vec![2]).unwrap().as_f32().unwrap(),
            &[1.0, 12.0, 20.0]
        );
        assert!(run(vec![4], vec![2]).is_err());
        assert!(run(vec![1 << 40], vec![2]).is_err());
        assert!(run(vec![3], vec![0]).is_err());
        assert!(run(vec![3, 1], vec![2]).is_err());
    }
}
