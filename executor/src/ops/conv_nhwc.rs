//! Convolutions the layout pass made NHWC (`passes::nhwc`): `[N, H, W, C]` in, `[N, oh, ow, M]`
//! out, the residual in the output's layout; the arithmetic is in `cotenant_kernels`'
//! `nhwc_conv`, `nhwc_depthwise` and, for MobileNet's fused blocks, `nhwc_block`.

use super::conv::{
    ConvAttrs, PointwiseDepthwise, add_later, bias, conv_geometry, epilogue, one_by_one,
};
use super::{Cx, input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{Tensor, checked_numel};
use cotenant_kernels::conv::{Conv2d, Epilogue};
use cotenant_kernels::nhwc_block::{self, NhwcStage, inverted_residual_nhwc};
use cotenant_kernels::nhwc_conv::{self, NhwcFilter, conv_nhwc};
use cotenant_kernels::nhwc_depthwise::{self, depthwise_nhwc};

/// [`conv_geometry`] of a Conv the layout pass made NHWC: input `x` is `[N, H, W, C]`, the
/// output shape `[N, oh, ow, M]`.
pub(crate) fn nhwc_geometry(
    c: &ConvAttrs,
    x: &[usize],
    w: &[usize],
) -> OpResult<(Conv2d, Vec<usize>)> {
    let &[n, h, wd, ch] = x else {
        return shape_err(format!("NHWC Conv input must be [N, H, W, C], got {x:?}"));
    };
    let (p, _) = conv_geometry(c, &[n, ch, h, wd], w)?;
    Ok((p, vec![n, p.oh, p.ow, p.m]))
}

/// The weight shape of an NHWC Conv whose weight is input `k`: that input's, or, where the plan
/// freed that copy, its packed filter's.
pub(crate) fn nhwc_weight_shape(
    c: &ConvAttrs,
    inputs: &[Option<&Tensor>],
    k: usize,
) -> OpResult<Vec<usize>> {
    match (opt_input(inputs, k), &c.nhwc_filter) {
        (Some(w), _) => Ok(w.shape.clone()),
        (None, Some(f)) => Ok(f.shape().to_vec()),
        (None, None) => input(inputs, k).map(|w| w.shape.clone()),
    }
}

/// A Conv the layout pass made NHWC: `[N, H, W, C]` in, `[N, oh, ow, M]` out, the residual in
/// the output's layout.
pub(crate) fn conv_in_nhwc(cx: &Cx, c: &ConvAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let (x, b) = (input(inputs, 0)?, opt_input(inputs, 2));
    let (p, shape) = nhwc_geometry(c, &x.shape, &nhwc_weight_shape(c, inputs, 1)?)?;
    let depthwise = nhwc_depthwise::applies(&p) && nhwc_depthwise::available();
    if !(nhwc_conv::applies(&p) || depthwise) || !nhwc_conv::available() {
        return Err(OpError::Unsupported(format!("an NHWC Conv of {p:?}")));
    }
    let bias = bias(b, p.m, "Conv")?;
    if checked_numel(&shape)? == 0 {
        return Tensor::f32(shape, Vec::new());
    }
    let mut packed = None;
    let filter = filter(c, &p, inputs, 1, &mut packed)?;
    let (epi, later) = epilogue(c, inputs, &shape, bias)?;
    let mut out = cx.take_f32(checked_numel(&shape)?);
    let kernel = if depthwise { depthwise_nhwc } else { conv_nhwc };
    kernel(cx.threads, &p, x.as_f32()?, filter, epi, &mut out);
    add_later(cx, c, Tensor::f32(shape, out)?, later)
}

/// The packed weights of the NHWC convolution `p` (`c`'s weight is input `k`): the plan's, or
/// packed now into `slot`.
fn filter<'a>(
    c: &'a ConvAttrs,
    p: &Conv2d,
    inputs: &[Option<&Tensor>],
    k: usize,
    slot: &'a mut Option<NhwcFilter>,
) -> OpResult<&'a NhwcFilter> {
    if let Some(f) = c.nhwc_filter.as_deref().filter(|f| f.fits(p)) {
        return Ok(f);
    }
    let w = input(inputs, k)?.as_f32()?;
    Ok(slot.insert(NhwcFilter::new(w, p.m, p.c / p.groups, p.kh, p.kw)))
}

/// Convolution `c` of a fused block (weight input `k`, bias input `k + 1`) for the kernel.
fn stage<'a>(
    c: &'a ConvAttrs,
    p: &'a Conv2d,
    inputs: &[Option<&'a Tensor>],
    k: usize,
    slot: &'a mut Option<NhwcFilter>,
) -> OpResult<NhwcStage<'a>> {
    Ok(NhwcStage {
        p,
        filter: filter(c, p, inputs, k, slot)?,
        epi: Epilogue {
            bias: bias(opt_input(inputs, k + 1), p.m, "Conv")?,
            residual: None,
            act: c.act,
        },
    })
}

/// A fused expansion → depthwise (→ projection) block made NHWC: one pass, band by band, where
/// the kernel covers its shapes, else the convolutions one after the other.
pub(crate) fn pointwise_depthwise_nhwc(
    cx: &Cx,
    f: &PointwiseDepthwise,
    inputs: &[Option<&Tensor>],
) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let (p1, mid) = nhwc_geometry(
        &f.pointwise,
        &x.shape,
        &nhwc_weight_shape(&f.pointwise, inputs, 1)?,
    )?;
    let (p2, shape) = nhwc_geometry(
        &f.depthwise,
        &mid,
        &nhwc_weight_shape(&f.depthwise, inputs, 3)?,
    )?;
    let project = match &f.project {
        Some(pr) => Some((
            pr,
            nhwc_geometry(pr, &shape, &nhwc_weight_shape(pr, inputs, 5)?)?,
        )),
        None => None,
    };
    let out_shape = project.as_ref().map_or(&shape, |(_, (_, s))| s).clone();
    let residual = opt_input(inputs, 7).filter(|_| f.project.as_ref().is_some_and(|p| p.residual));
    if checked_numel(&mid)? == 0
        || checked_numel(&out_shape)? == 0
        || residual.is_some_and(|r| r.shape != out_shape)
        || !nhwc_depthwise::available()
    {
        return one_by_one(cx, f, inputs);
    }
    let mut packed = (None, None, None);
    let ex = stage(&f.pointwise, &p1, inputs, 1, &mut packed.0)?;
    let dw = stage(&f.depthwise, &p2, inputs, 3, &mut packed.1)?;
    let pr = match &project {
        Some((pr, (p3, _))) => {
            let mut s = stage(pr, p3, inputs, 5, &mut packed.2)?;
            s.epi.residual = residual.map(Tensor::as_f32).transpose()?;
            Some(s)
        }
        None => None,
    };
    if !nhwc_block::applies(&ex, &dw, pr.as_ref()) {
        return one_by_one(cx, f, inputs);
    }
    let mut out = cx.take_f32(checked_numel(&out_shape)?);
    inverted_residual_nhwc(ex, dw, pr, x.as_f32()?, &mut out, cx.threads);
    Tensor::f32(out_shape, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Activation;
    use crate::ops::conv::{conv, pack_filter};

    /// An NHWC Conv computes what the NCHW one does, in its layout, packed weights or not; an
    /// input that is not `[N, H, W, C]` with the weights' channels is a shape error.
    #[test]
    fn nhwc_convs_match_nchw_and_refuse_other_inputs() {
        if !nhwc_conv::available() {
            eprintln!(
                "skipped: this CPU lacks AVX-512F and AVX2, one of which the NHWC convolution needs"
            );
            return;
        }
        let cx = Cx::new(1);
        let nchw = ConvAttrs {
            group: 1,
            auto_pad: "NOTSET".into(),
            pads: Some(vec![1, 0, 0, 1]),
            strides: Some(vec![2, 1]),
            act: Some(Activation::Relu),
            ..ConvAttrs::default()
        };
        let mut nhwc = ConvAttrs {
            nhwc: true,
            ..nchw.clone()
        };
        let values = |n: usize, k: usize| (0..n).map(move |i| ((i * k) % 13) as f32 / 6.0 - 1.0);
        let x = Tensor::f32(vec![2, 8, 5, 6], values(480, 7).collect()).unwrap();
        let w = Tensor::f32(vec![32, 8, 3, 3], values(32 * 72, 5).collect()).unwrap();
        let b = Tensor::f32(vec![32], values(32, 3).collect()).unwrap();
        let want = conv(&cx, &nchw, &[Some(&x), Some(&w), Some(&b)]).unwrap();
        let to_nhwc = |t: &Tensor| super::super::shape::transpose(t, Some(&[0, 2, 3, 1])).unwrap();
        let want = to_nhwc(&want);
        let xt = to_nhwc(&x);
        for packed in [false, true] {
            if packed {
                pack_filter(&mut nhwc, &w);
                assert!(nhwc.nhwc_filter.is_some() && nhwc.packed.is_none());
            }
            let got = conv(&cx, &nhwc, &[Some(&xt), Some(&w), Some(&b)]).unwrap();
            assert_eq!(got.shape, want.shape);
            let (g, e) = (got.as_f32().unwrap(), want.as_f32().unwrap());
            assert!(
                g.iter()
                    .zip(e)
                    .all(|(g, e)| (g - e).abs() <= 1e-4 * (1.0 + e.abs()))
            );
        }
        let rank3 = Tensor::f32(vec![8, 5, 6], vec![0.0; 240]).unwrap();
        let e = conv(&cx, &nhwc, &[Some(&rank3), Some(&w), Some(&b)]).unwrap_err();
        assert!(
            e.to_string()
                .contains("NHWC Conv input must be [N, H, W, C]"),
            "{e}"
        );
        // The NCHW input given as if NHWC: 6 channels against the weights' 8.
        let e = conv(&cx, &nhwc, &[Some(&x), Some(&w), Some(&b)]).unwrap_err();
        assert!(e.to_string().contains("input channels 6"), "{e}");
    }

    /// A fused block made NHWC computes what the NCHW one does, packed or not, and with a
    /// residual of another shape (a broadcast Add) one convolution after the other; an input
    /// that is not `[N, H, W, C]` is a shape error.
    #[test]
    fn nhwc_blocks_match_nchw() {
        if !nhwc_depthwise::available() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2 + FMA");
            return;
        }
        use crate::ops::conv::pointwise_depthwise;
        let cx = Cx::new(2);
        let attrs = |group: usize, pad: usize, stride: usize, act| ConvAttrs {
            group,
            auto_pad: "NOTSET".into(),
            pads: Some(vec![pad; 4]),
            strides: Some(vec![stride; 2]),
            act,
            ..ConvAttrs::default()
        };
        let relu6 = Some(Activation::Clip(0.0, 6.0));
        let nchw = PointwiseDepthwise {
            pointwise: attrs(1, 0, 1, relu6),
            depthwise: attrs(24, 1, 2, relu6),
            project: Some(ConvAttrs {
                residual: true,
                ..attrs(1, 0, 1, None)
            }),
        };
        let nhwc = |c: &ConvAttrs| ConvAttrs {
            nhwc: true,
            ..c.clone()
        };
        let mut fused = PointwiseDepthwise {
            pointwise: nhwc(&nchw.pointwise),
            depthwise: nhwc(&nchw.depthwise),
            project: nchw.project.as_ref().map(nhwc),
        };
        let values = |n: usize, k: usize| (0..n).map(move |i| ((i * k) % 13) as f32 / 6.0 - 1.0);
        let t = |shape: Vec<usize>, k| {
            let n = shape.iter().product();
            Tensor::f32(shape, values(n, k).collect()).unwrap()
        };
        let (x, w1, b1) = (
            t(vec![2, 8, 9, 7], 7),
            t(vec![24, 8, 1, 1], 5),
            t(vec![24], 3),
        );
        let (w2, b2) = (t(vec![24, 1, 3, 3], 2), t(vec![24], 4));
        let (w3, b3) = (t(vec![16, 24, 1, 1], 6), t(vec![16], 8));
        let to_nhwc = |t: &Tensor| super::super::shape::transpose(t, Some(&[0, 2, 3, 1])).unwrap();
        for residual in [t(vec![2, 16, 5, 4], 9), t(vec![1, 16, 1, 1], 9)] {
            let inputs = |x, r| {
                [
                    Some(x),
                    Some(&w1),
                    Some(&b1),
                    Some(&w2),
                    Some(&b2),
                    Some(&w3),
                    Some(&b3),
                    Some(r),
                ]
            };
            let want = pointwise_depthwise(&cx, &nchw, &inputs(&x, &residual)).unwrap();
            let want = to_nhwc(&want);
            let (xt, rt) = (to_nhwc(&x), to_nhwc(&residual));
            for packed in [false, true] {
                if packed {
                    pack_filter(&mut fused.pointwise, &w1);
                    pack_filter(&mut fused.depthwise, &w2);
                    pack_filter(fused.project.as_mut().unwrap(), &w3);
                }
                let got = pointwise_depthwise(&cx, &fused, &inputs(&xt, &rt)).unwrap();
                assert_eq!(got.shape, want.shape);
                let (g, e) = (got.as_f32().unwrap(), want.as_f32().unwrap());
                for (g, e) in g.iter().zip(e) {
                    assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
                }
            }
        }
        let rank3 = Tensor::f32(vec![8, 9, 7], vec![0.0; 504]).unwrap();
        let inputs = [Some(&rank3), Some(&w1), Some(&b1), Some(&w2), Some(&b2)];
        let pair = PointwiseDepthwise {
            project: None,
            ..fused.clone()
        };
        let e = pointwise_depthwise(&cx, &pair, &inputs).unwrap_err();
        assert!(
            e.to_string()
                .contains("NHWC Conv input must be [N, H, W, C]"),
            "{e}"
        );
    }
}
