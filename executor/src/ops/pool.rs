//! MaxPool and AveragePool (1-D/2-D on their kernels, more axes and MaxPool's Indices output
//! in `pool_nd`), LpPool, the global pools and MaxUnpool; MaxPool also of 8-bit integers.

use super::Cx;
use super::elementwise::cast;
use super::pool_nd::{Reduce, pool_nd};
use crate::error::{OpError, OpResult, shape_err};
use crate::ops::attrs::Attrs;
use crate::tensor::{DType, Data, Tensor, checked_numel};
use cotenant_kernels::pool::{
    Pool2d, avg_pool2d, max_pool2d, max_pool2d_nhwc, max_pool2d_nhwc_ord, max_pool2d_ord,
};

#[derive(Clone, Debug, PartialEq)]
pub struct PoolAttrs {
    pub max: bool,
    pub kernel_shape: Vec<usize>,
    pub strides: Option<Vec<usize>>,
    pub dilations: Option<Vec<usize>>,
    pub pads: Option<Vec<usize>>,
    pub auto_pad: String,
    pub ceil_mode: bool,
    pub count_include_pad: bool,
    /// MaxPool's Indices count within each channel column-major (`storage_order` 1).
    pub column_major: bool,
    /// The node has MaxPool's second output, Indices.
    pub indices: bool,
    /// Set by the layout passes (`passes::nhwc`, `passes::transposes`) on a 2-D MaxPool between
    /// NHWC convolutions: the input and output are `[N, H, W, C]`.
    pub nhwc: bool,
}

impl PoolAttrs {
    /// `outputs`: how many outputs the node has (MaxPool's second is Indices).
    pub fn parse(a: &Attrs, max: bool, outputs: usize) -> Result<PoolAttrs, String> {
        let p = PoolAttrs {
            max,
            kernel_shape: a
                .usizes("kernel_shape")?
                .ok_or("kernel_shape is required")?,
            strides: a.usizes("strides")?,
            dilations: a.usizes("dilations")?,
            pads: a.usizes("pads")?,
            auto_pad: a.string_or("auto_pad", "NOTSET")?,
            ceil_mode: a.int_or("ceil_mode", 0)? != 0,
            count_include_pad: a.int_or("count_include_pad", 0)? != 0,
            column_major: a.flag("storage_order", false)?,
            indices: max && outputs > 1,
            nhwc: false,
        };
        if p.kernel_shape.contains(&0)
            || p.strides
                .iter()
                .flatten()
                .chain(p.dilations.iter().flatten())
                .any(|&s| s == 0)
        {
            return Err("kernel, strides and dilations must be positive".into());
        }
        Ok(p)
    }
}

/// The geometry and output shape of a MaxPool the layout pass made NHWC: input `x` is
/// `[N, H, W, C]`, the output `[N, oh, ow, C]`.
pub(crate) fn nhwc_pool_geometry(p: &PoolAttrs, x: &[usize]) -> OpResult<(Pool2d, Vec<usize>)> {
    let &[n, h, w, c] = x else {
        return shape_err(format!(
            "NHWC MaxPool input must be [N, H, W, C], got {x:?}"
        ));
    };
    let (g, _) = pool2d_geometry(p, &[n, c, h, w])?;
    let shape = vec![n, g.oh, g.ow, c];
    Ok((Pool2d { planes: c, ..g }, shape))
}

fn max_pool_nhwc(cx: &Cx, p: &PoolAttrs, x: &Tensor) -> OpResult<Vec<Tensor>> {
    let (g, shape) = nhwc_pool_geometry(p, &x.shape)?;
    if !p.max || p.indices {
        return Err(OpError::Unsupported(
            "an NHWC pool other than MaxPool".into(),
        ));
    }
    let n = checked_numel(&shape)?;
    if n == 0 {
        return Ok(vec![Tensor::zeros(x.dtype(), shape)?]);
    }
    let data = match &x.data {
        Data::U8(v) => {
            let mut y = cx.take_u8(n);
            max_pool2d_nhwc_ord(&g, v, &mut y, u8::MIN, cx.threads);
            Data::U8(y)
        }
        Data::I8(v) => {
            let mut y = vec![0i8; n];
            max_pool2d_nhwc_ord(&g, v, &mut y, i8::MIN, cx.threads);
            Data::I8(y)
        }
        _ => {
            let mut y = cx.take_f32(n);
            max_pool2d_nhwc(&g, x.as_f32()?, &mut y, cx.threads);
            Data::F32(y)
        }
    };
    Ok(vec![Tensor::new(shape, data)?])
}

/// The window of a 1-D or 2-D pooling over an input of shape `x` (kernel, strides, dilations,
/// explicit or automatic padding, ceil mode) and the output shape: the one resolution of a
/// pooling window, used by the CPU op and the GPU lowering alike.
pub(crate) fn pool2d_geometry(p: &PoolAttrs, x: &[usize]) -> OpResult<(Pool2d, Vec<usize>)> {
    let spatial = x.len().saturating_sub(2);
    if !(1..=2).contains(&spatial) {
        return Err(OpError::Unsupported(format!(
            "pooling over {spatial} spatial axes"
        )));
    }
    if p.kernel_shape.len() != spatial {
        return shape_err(format!(
            "kernel_shape {:?} for input {:?}",
            p.kernel_shape, x
        ));
    }
    let lift = |v: &[usize], d: usize| -> [usize; 2] {
        if spatial == 1 {
            [d, v[0]]
        } else {
            [v[0], v[1]]
        }
    };
    let listed = |v: &Option<Vec<usize>>, n: usize, d: usize| -> OpResult<Vec<usize>> {
        match v {
            Some(v) if v.len() != n => shape_err(format!(
                "pooling attribute has {} entries, expected {n}",
                v.len()
            )),
            Some(v) => Ok(v.clone()),
            None => Ok(vec![d; n]),
        }
    };
    let k = lift(&p.kernel_shape, 1);
    let s = lift(&listed(&p.strides, spatial, 1)?, 1);
    let d = lift(&listed(&p.dilations, spatial, 1)?, 1);
    let pads = listed(&p.pads, 2 * spatial, 0)?;
    // Past any tensor's size these mean nothing, and past `isize` the kernels would overflow.
    let limit = crate::tensor::MAX_ELEMENTS;
    if [&k[..], &s[..], &d[..], &pads[..]]
        .iter()
        .any(|v| v.iter().any(|&v| v > limit))
    {
        return shape_err(format!(
            "pooling kernel, strides, dilations or pads past the executor's limit of {limit}"
        ));
    }
    let (mut b, mut e) = (lift(&pads[..spatial], 0), lift(&pads[spatial..], 0));
    let hw = lift(&x[2..], 1);
    let mut out = [0; 2];
    for i in 0..2 {
        let eff = super::conv::span(k[i], d[i])?;
        match p.auto_pad.as_str() {
            "SAME_UPPER" | "SAME_LOWER" => {
                out[i] = hw[i].div_ceil(s[i]);
                let total = (out[i].saturating_sub(1).saturating_mul(s[i]))
                    .saturating_add(eff)
                    .saturating_sub(hw[i]);
                let small = total / 2;
                (b[i], e[i]) = if p.auto_pad == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
                continue;
            }
            "VALID" => (b[i], e[i]) = (0, 0),
            "NOTSET" | "" => {}
            other => return Err(OpError::Unsupported(format!("auto_pad {other:?}"))),
        }
        let padded = hw[i]
            .checked_add(b[i])
            .and_then(|p| p.checked_add(e[i]))
            .ok_or(OpError::TooLarge(usize::MAX))?;
        out[i] = super::window::extent(hw[i], b[i], padded, eff, s[i], p.ceil_mode).ok_or_else(
            || {
                OpError::Shape(format!(
                    "pooling window {eff} larger than padded input {padded}"
                ))
            },
        )?;
    }
    let planes = x[0]
        .checked_mul(x[1])
        .ok_or(OpError::TooLarge(usize::MAX))?;
    let g = Pool2d {
        planes,
        h: hw[0],
        w: hw[1],
        kh: k[0],
        kw: k[1],
        sh: s[0],
        sw: s[1],
        dh: d[0],
        dw: d[1],
        pt: b[0],
        pl: b[1],
        pb: e[0],
        pr: e[1],
        oh: out[0],
        ow: out[1],
    };
    let mut shape = x[..2].to_vec();
    shape.extend(if spatial == 1 { &out[1..] } else { &out[..] });
    checked_numel(&shape)?;
    Ok((g, shape))
}

pub fn pool(cx: &Cx, p: &PoolAttrs, x: &Tensor) -> OpResult<Vec<Tensor>> {
    if p.nhwc {
        return max_pool_nhwc(cx, p, x);
    }
    // 8-bit integers: a 2-D maximum directly; the others through f32, exact for them (a
    // maximum is one of the values it is taken over).
    if p.max && matches!(x.dtype(), DType::U8 | DType::I8) {
        if !p.indices && x.rank() <= 4 {
            let (g, shape) = pool2d_geometry(p, &x.shape)?;
            let n = checked_numel(&shape)?;
            let data = match &x.data {
                Data::U8(v) => {
                    let mut y = vec![0u8; n];
                    max_pool2d_ord(&g, v, &mut y, u8::MIN, cx.threads);
                    Data::U8(y)
                }
                Data::I8(v) => {
                    let mut y = vec![0i8; n];
                    max_pool2d_ord(&g, v, &mut y, i8::MIN, cx.threads);
                    Data::I8(y)
                }
                _ => unreachable!("the type is checked above"),
            };
            return Ok(vec![Tensor::new(shape, data)?]);
        }
        let mut y = pool(cx, p, &cast(x, DType::F32))?;
        y[0] = cast(&y[0], x.dtype());
        return Ok(y);
    }
    if p.indices || x.rank() > 4 || x.dtype() == DType::F64 {
        let reduce = if p.max { Reduce::Max } else { Reduce::Average };
        return pool_nd(p, reduce, x, p.indices);
    }
    let (g, shape) = pool2d_geometry(p, &x.shape)?;
    let mut y = cx.take_f32(checked_numel(&shape)?);
    if y.is_empty() {
        return Ok(vec![Tensor::f32(shape, y)?]);
    }
    if p.max {
        max_pool2d(&g, x.as_f32()?, &mut y, cx.threads);
    } else {
        avg_pool2d(&g, x.as_f32()?, &mut y, p.count_include_pad, cx.threads);
    }
    Ok(vec![Tensor::f32(shape, y)?])
}

/// MaxUnpool's window: what it takes to recover the shape a pooling came from.
#[derive(Clone, Debug, PartialEq)]
pub struct UnpoolAttrs {
    pub kernel_shape: Vec<usize>,
    pub strides: Option<Vec<usize>>,
    pub pads: Option<Vec<usize>>,
}

impl UnpoolAttrs {
    pub fn parse(a: &Attrs) -> Result<UnpoolAttrs, String> {
        let u = UnpoolAttrs {
            kernel_shape: a
                .usizes("kernel_shape")?
                .ok_or("attribute \"kernel_shape\" is required")?,
            strides: a.usizes("strides")?,
            pads: a.usizes("pads")?,
        };
        if u.kernel_shape.contains(&0) || u.strides.iter().flatten().any(|&s| s == 0) {
            return Err("attributes \"kernel_shape\" and \"strides\" must be positive".into());
        }
        Ok(u)
    }
}

/// MaxUnpool's shapes: the one its pooling came from (each spatial axis grown back to
/// `(in - 1) * stride + kernel - pads`), which its indices address, and the output's, which is
/// input 2 when given (at least as large: the unpooled tensor sits in its leading corner).
pub(crate) fn max_unpool_shape(
    u: &UnpoolAttrs,
    x: &[usize],
    output_shape: Option<&Tensor>,
) -> OpResult<(Vec<usize>, Vec<usize>)> {
    let spatial = x.len().saturating_sub(2);
    let listed = |v: &Option<Vec<usize>>, n: usize, d: usize| match v {
        Some(v) if v.len() != n => shape_err(format!(
            "MaxUnpool attribute has {} entries, expected {n}",
            v.len()
        )),
        Some(v) => Ok(v.clone()),
        None => Ok(vec![d; n]),
    };
    if spatial == 0 || u.kernel_shape.len() != spatial {
        return shape_err(format!(
            "MaxUnpool kernel_shape {:?} for an input {x:?}",
            u.kernel_shape
        ));
    }
    let strides = listed(&u.strides, spatial, 1)?;
    let pads = listed(&u.pads, 2 * spatial, 0)?;
    let mut unpooled = x[..2].to_vec();
    for i in 0..spatial {
        let grown = x[i + 2]
            .saturating_sub(1)
            .checked_mul(strides[i])
            .and_then(|v| v.checked_add(u.kernel_shape[i]))
            .ok_or(OpError::TooLarge(usize::MAX))?;
        let d = grown
            .checked_sub(pads[i].saturating_add(pads[i + spatial]))
            .ok_or_else(|| OpError::Shape("MaxUnpool pads larger than its window".into()))?;
        unpooled.push(d);
    }
    checked_numel(&unpooled)?;
    let out = match output_shape {
        None => unpooled.clone(),
        Some(t) => {
            let dims = super::shape::to_dims(&t.to_i64_vec()?)?;
            if dims.len() != x.len() || dims.iter().zip(&unpooled).any(|(o, u)| o < u) {
                return shape_err(format!(
                    "MaxUnpool output shape {dims:?} cannot hold the unpooled {unpooled:?}"
                ));
            }
            checked_numel(&dims)?;
            dims
        }
    };
    Ok((unpooled, out))
}

/// MaxUnpool: zeros with each element of `x` at the flat position its index (as MaxPool's
/// Indices output gives them) names in the unpooled shape, in the leading corner of the output.
pub fn max_unpool(
    u: &UnpoolAttrs,
    x: &Tensor,
    indices: &Tensor,
    output_shape: Option<&Tensor>,
) -> OpResult<Tensor> {
    let (unpooled, out) = max_unpool_shape(u, &x.shape, output_shape)?;
    if indices.shape != x.shape {
        return shape_err(format!(
            "MaxUnpool indices {:?} for an input {:?}",
            indices.shape, x.shape
        ));
    }
    let n = checked_numel(&unpooled)?;
    // Every element reads the input, or the zero placed after it.
    let mut from = vec![x.len(); n];
    for (k, &i) in indices.to_i64_vec()?.iter().enumerate() {
        let at = usize::try_from(i).ok().filter(|&i| i < n).ok_or_else(|| {
            OpError::Shape(format!(
                "MaxUnpool index {i} outside an unpooled tensor of {n}"
            ))
        })?;
        from[at] = k;
    }
    let mut all = x.data.clone();
    all.extend_from(&Data::zeros(x.dtype(), 1), 0..1);
    let y = Tensor::new(unpooled, all.gather(&from))?;
    if y.shape == out {
        return Ok(y);
    }
    let corner: Vec<Vec<Option<usize>>> = (0..out.len())
        .map(|a| (0..out[a]).map(|i| (i < y.shape[a]).then_some(i)).collect())
        .collect();
    super::shape::gather_or_fill(&y, out, &corner, 0.0)
}

/// LpPool: the `p`-norm of every window, padding counting as zeros; computed in f64.
pub fn lp_pool(pool: &PoolAttrs, p: u32, x: &Tensor) -> OpResult<Tensor> {
    Ok(pool_nd(pool, Reduce::Lp(p), x, false)?.remove(0))
}

pub fn global_pool(x: &Tensor, max: bool) -> OpResult<Tensor> {
    if x.rank() < 2 {
        return shape_err(format!(
            "global pooling needs [N, C, ...], got {:?}",
            x.shape
        ));
    }
    let plane: usize = x.shape[2..].iter().product();
    let v = x.as_f32()?;
    let out: Vec<f32> = if plane == 0 {
        vec![0.0; x.shape[0] * x.shape[1]]
    } else {
        v.chunks(plane)
            .map(|c| {
                if max {
                    c.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
                } else {
                    c.iter().sum::<f32>() / plane as f32
                }
            })
            .collect()
    };
    let mut shape = x.shape[..2].to_vec();
    shape.extend(std::iter::repeat_n(1, x.rank() - 2));
    Tensor::f32(shape, out)
}

/// [`global_pool`] of `[N, spatial.., C]`: `[N, 1.., C]`, each channel's sum or maximum taken
/// pixel by pixel, a whole row of channels at a time.
pub fn global_pool_nhwc(x: &Tensor, max: bool) -> OpResult<Tensor> {
    if x.rank() < 3 {
        return shape_err(format!(
            "NHWC global pooling needs [N, H, W, C], got {:?}",
            x.shape
        ));
    }
    let (n, c) = (x.shape[0], x.shape[x.rank() - 1]);
    let plane: usize = x.shape[1..x.rank() - 1].iter().product();
    let v = x.as_f32()?;
    let mut out = vec![if max { f32::NEG_INFINITY } else { 0.0 }; n * c];
    if plane == 0 || c == 0 {
        out.fill(0.0);
    } else {
        for (o, image) in out.chunks_mut(c).zip(v.chunks(plane * c)) {
            for pixel in image.chunks(c) {
                for (o, &p) in o.iter_mut().zip(pixel) {
                    *o = if max { o.max(p) } else { *o + p };
                }
            }
            if !max {
                o.iter_mut().for_each(|o| *o /= plane as f32);
            }
        }
    }
    let mut shape = vec![1; x.rank()];
    (shape[0], shape[x.rank() - 1]) = (n, c);
    Tensor::f32(shape, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unpool_places_values_and_checks_indices_and_shapes() {
        let u = UnpoolAttrs {
            kernel_shape: vec![2],
            strides: Some(vec![2]),
            pads: None,
        };
        let x = Tensor::f32(vec![1, 1, 2], vec![5.0, 7.0]).unwrap();
        let at = |v: Vec<i64>| Tensor::i64(vec![1, 1, 2], v).unwrap();
        let y = max_unpool(&u, &x, &at(vec![1, 2]), None).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[0.0, 5.0, 7.0, 0.0]);
        let shape = |v: Vec<i64>| Tensor::i64(vec![3], v).unwrap();
        let wide = max_unpool(&u, &x, &at(vec![1, 2]), Some(&shape(vec![1, 1, 5]))).unwrap();
        assert_eq!(wide.as_f32().unwrap(), &[0.0, 5.0, 7.0, 0.0, 0.0]);
        assert!(max_unpool(&u, &x, &at(vec![1, 4]), None).is_err());
        assert!(max_unpool(&u, &x, &at(vec![1, 2]), Some(&shape(vec![1, 1, 3]))).is_err());
        assert!(max_unpool(&u, &x, &at(vec![1, 2]), Some(&shape(vec![1 << 40, 1, 4]))).is_err());
    }

    #[test]
    fn global_pools_of_nhwc_images_match_the_nchw_ones() {
        let x: Vec<f32> = (0..2 * 3 * 4 * 5)
            .map(|i| ((i * 37) % 23) as f32 / 7.0 - 1.5)
            .collect();
        let nchw = Tensor::f32(vec![2, 3, 4, 5], x).unwrap();
        let nhwc = crate::ops::shape::transpose(&nchw, Some(&[0, 2, 3, 1])).unwrap();
        for max in [false, true] {
            let (a, b) = (
                global_pool(&nchw, max).unwrap(),
                global_pool_nhwc(&nhwc, max).unwrap(),
            );
            assert_eq!(
                (a.shape.as_slice(), b.shape.as_slice()),
                (&[2, 3, 1, 1][..], &[2, 1, 1, 3][..])
            );
            for (p, q) in a.as_f32().unwrap().iter().zip(b.as_f32().unwrap()) {
                assert!((p - q).abs() <= 1e-6, "{p} vs {q}");
            }
        }
        // No pixels: zeros, as the NCHW pool gives; no channels dimension: an error.
        let empty = Tensor::f32(vec![1, 0, 4, 3], vec![]).unwrap();
        let pooled = global_pool_nhwc(&empty, true).unwrap();
        assert_eq!(pooled.as_f32().unwrap(), &[0.0; 3]);
        assert!(global_pool_nhwc(&Tensor::f32(vec![2, 3], vec![0.0; 6]).unwrap(), false).is_err());
    }
}
