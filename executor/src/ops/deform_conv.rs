//! DeformConv (2-D): a convolution whose every tap reads the input at its regular position
//! moved by a learned offset (bilinear, zeros outside the image), weighted by an optional
//! mask; computed in f64 as columns and a product per group.

use super::attrs::Attrs;
use super::elementwise::cast;
use super::window::{listed, span};
use super::{input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{DType, Data, MAX_ELEMENTS, Tensor, checked_numel};

#[derive(Clone, Debug, PartialEq)]
pub struct DeformConvAttrs {
    pub kernel_shape: Option<Vec<usize>>,
    pub strides: Option<Vec<usize>>,
    pub dilations: Option<Vec<usize>>,
    pub pads: Option<Vec<usize>>,
    pub group: usize,
    pub offset_group: usize,
}

impl DeformConvAttrs {
    pub fn parse(a: &Attrs) -> Result<DeformConvAttrs, String> {
        let positive = |name: &str| -> Result<usize, String> {
            match a.int_or(name, 1)? {
                v if v >= 1 && v as u64 <= MAX_ELEMENTS as u64 => Ok(v as usize),
                v => Err(format!("attribute {name:?} is {v}, not positive")),
            }
        };
        Ok(DeformConvAttrs {
            kernel_shape: a.usizes("kernel_shape")?,
            strides: a.usizes("strides")?,
            dilations: a.usizes("dilations")?,
            pads: a.usizes("pads")?,
            group: positive("group")?,
            offset_group: positive("offset_group")?,
        })
    }
}

/// A deformable convolution's geometry over a 2-D image.
pub(crate) struct Deform {
    pub n: usize,
    pub c: usize,
    pub m: usize,
    pub hw: [usize; 2],
    pub k: [usize; 2],
    pub s: [usize; 2],
    pub d: [usize; 2],
    pub begin: [usize; 2],
    pub out: [usize; 2],
}

impl Deform {
    /// Elements of one image's columns: a row per input channel and tap.
    pub fn columns(&self) -> OpResult<usize> {
        checked_numel(&[self.c, self.k[0], self.k[1], self.out[0], self.out[1]])
    }
    pub fn shape(&self) -> Vec<usize> {
        vec![self.n, self.m, self.out[0], self.out[1]]
    }
}

pub(crate) fn deform_geometry(a: &DeformConvAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Deform> {
    let (x, w, offset) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    if x.rank() != 4 {
        return Err(OpError::Unsupported(format!(
            "DeformConv of {:?}: only 2-D images",
            x.shape
        )));
    }
    let (n, c, m) = (
        x.shape[0],
        x.shape[1],
        w.shape.first().copied().unwrap_or(0),
    );
    if w.rank() != 4 || w.shape[1].checked_mul(a.group) != Some(c) || !m.is_multiple_of(a.group) {
        return shape_err(format!(
            "DeformConv weight {:?} for input {:?} in {} groups",
            w.shape, x.shape, a.group
        ));
    }
    if !c.is_multiple_of(a.offset_group) {
        return shape_err(format!(
            "DeformConv: {c} channels in {} offset groups",
            a.offset_group
        ));
    }
    let k = [w.shape[2], w.shape[3]];
    if let Some(ks) = &a.kernel_shape
        && ks.as_slice() != k
    {
        return shape_err(format!("kernel_shape {ks:?} does not match weights {k:?}"));
    }
    let s = listed(a.strides.as_deref(), 2, 1, "strides")?;
    let d = listed(a.dilations.as_deref(), 2, 1, "dilations")?;
    let p = listed(a.pads.as_deref(), 4, 0, "pads")?;
    if s.contains(&0) || d.contains(&0) || k.contains(&0) {
        return shape_err("DeformConv kernel, strides and dilations must be positive");
    }
    if [&s[..], &d[..], &p[..]]
        .iter()
        .any(|v| v.iter().any(|&v| v > MAX_ELEMENTS))
    {
        return shape_err("DeformConv strides, dilations or pads past the executor's limit");
    }
    let hw = [x.shape[2], x.shape[3]];
    let mut out = [0; 2];
    for i in 0..2 {
        let (padded, eff) = (hw[i] + p[i] + p[i + 2], span(k[i], d[i])?);
        if padded < eff {
            return shape_err(format!(
                "DeformConv kernel {eff} larger than padded input {padded}"
            ));
        }
        out[i] = (padded - eff) / s[i] + 1;
    }
    let g = Deform {
        n,
        c,
        m,
        hw,
        k,
        s: [s[0], s[1]],
        d: [d[0], d[1]],
        begin: [p[0], p[1]],
        out,
    };
    let taps = k[0] * k[1];
    let want = [n, a.offset_group * taps * 2, out[0], out[1]];
    if offset.shape != want {
        return shape_err(format!(
            "DeformConv offset {:?}, expected {want:?}",
            offset.shape
        ));
    }
    if let Some(mask) = opt_input(inputs, 4) {
        let want = [n, a.offset_group * taps, out[0], out[1]];
        if mask.shape != want {
            return shape_err(format!(
                "DeformConv mask {:?}, expected {want:?}",
                mask.shape
            ));
        }
    }
    if let Some(b) = opt_input(inputs, 3)
        && b.len() != m
    {
        return shape_err(format!(
            "DeformConv bias has {} values for {m} channels",
            b.len()
        ));
    }
    checked_numel(&g.shape())?;
    g.columns()?;
    Ok(g)
}

/// The image `plane` (`h`×`w`) at `(y, x)`, bilinear, zeros outside.
fn bilinear(plane: &[f64], h: usize, w: usize, y: f64, x: f64) -> f64 {
    if !(y.is_finite() && x.is_finite()) || y <= -1.0 || x <= -1.0 || y >= h as f64 || x >= w as f64
    {
        return 0.0;
    }
    let (y0, x0) = (y.floor(), x.floor());
    let (ly, lx) = (y - y0, x - x0);
    let at = |yy: f64, xx: f64| {
        if yy < 0.0 || xx < 0.0 || yy >= h as f64 || xx >= w as f64 {
            0.0
        } else {
            plane[yy as usize * w + xx as usize]
        }
    };
    (1.0 - ly) * (1.0 - lx) * at(y0, x0)
        + (1.0 - ly) * lx * at(y0, x0 + 1.0)
        + ly * (1.0 - lx) * at(y0 + 1.0, x0)
        + ly * lx * at(y0 + 1.0, x0 + 1.0)
}

/// DeformConv of `X` `[N, C, H, W]` by `W` `[M, C/group, kH, kW]` with `offset`
/// `[N, offset_group·kH·kW·2, oH, oW]` (y then x per tap), optional bias `[M]` and mask
/// `[N, offset_group·kH·kW, oH, oW]`.
pub fn deform_conv(a: &DeformConvAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let g = deform_geometry(a, inputs)?;
    let x = input(inputs, 0)?;
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Err(OpError::DType(format!("DeformConv of {:?}", x.dtype())));
    }
    let (xv, wv) = (x.to_f64_vec(), input(inputs, 1)?.to_f64_vec());
    let offset = input(inputs, 2)?.to_f64_vec();
    let bias = opt_input(inputs, 3).map(Tensor::to_f64_vec);
    let mask = opt_input(inputs, 4).map(Tensor::to_f64_vec);
    let [h, w] = g.hw;
    let (taps, positions) = (g.k[0] * g.k[1], g.out[0] * g.out[1]);
    let (cg, mg, per_offset) = (g.c / a.group, g.m / a.group, g.c / a.offset_group);
    let mut y = vec![0.0f64; checked_numel(&g.shape())?];
    let mut columns = vec![0.0f64; g.columns()?];
    for n in 0..g.n {
        for ci in 0..g.c {
            let og = ci / per_offset;
            let plane = &xv[(n * g.c + ci) * h * w..][..h * w];
            for tap in 0..taps {
                let (ki, kj) = (tap / g.k[1], tap % g.k[1]);
                let shift = ((n * a.offset_group + og) * taps + tap) * 2 * positions;
                for pos in 0..positions {
                    let (i, j) = (pos / g.out[1], pos % g.out[1]);
                    let yy =
                        (i * g.s[0] + ki * g.d[0]) as f64 - g.begin[0] as f64 + offset[shift + pos];
                    let xx = (j * g.s[1] + kj * g.d[1]) as f64 - g.begin[1] as f64
                        + offset[shift + positions + pos];
                    let weight = mask.as_ref().map_or(1.0, |m| {
                        m[((n * a.offset_group + og) * taps + tap) * positions + pos]
                    });
                    columns[(ci * taps + tap) * positions + pos] =
                        weight * bilinear(plane, h, w, yy, xx);
                }
            }
        }
        for oc in 0..g.m {
            let group = oc / mg;
            let out = &mut y[(n * g.m + oc) * positions..][..positions];
            out.fill(bias.as_ref().map_or(0.0, |b| b[oc]));
            for k in 0..cg * taps {
                let wk = wv[oc * cg * taps + k];
                let col = &columns[(group * cg * taps + k) * positions..][..positions];
                for (o, &v) in out.iter_mut().zip(col) {
                    *o += wk * v;
                }
            }
        }
    }
    Ok(cast(&Tensor::new(g.shape(), Data::F64(y))?, x.dtype()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs() -> DeformConvAttrs {
        DeformConvAttrs {
            kernel_shape: None,
            strides: None,
            dilations: None,
            pads: None,
            group: 1,
            offset_group: 1,
        }
    }

    #[test]
    fn offsets_move_the_taps_and_malformed_offsets_are_refused() {
        let x = Tensor::f32(vec![1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let w = Tensor::f32(vec![1, 1, 1, 1], vec![1.0]).unwrap();
        // Zero offsets: a 1x1 convolution by 1 is the input.
        let zero = Tensor::f32(vec![1, 2, 2, 2], vec![0.0; 8]).unwrap();
        let y = deform_conv(&attrs(), &[Some(&x), Some(&w), Some(&zero)]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        // Every tap moved half a pixel right: between columns, zero past the edge.
        let right = Tensor::f32(vec![1, 2, 2, 2], [[0.0; 4], [0.5; 4]].concat()).unwrap();
        let y = deform_conv(&attrs(), &[Some(&x), Some(&w), Some(&right)]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[1.5, 1.0, 3.5, 2.0]);
        let short = Tensor::f32(vec![1, 2, 1, 2], vec![0.0; 4]).unwrap();
        assert!(deform_conv(&attrs(), &[Some(&x), Some(&w), Some(&short)]).is_err());
        let three_d = Tensor::f32(vec![1, 1, 1, 2, 2], vec![0.0; 4]).unwrap();
        assert!(deform_conv(&attrs(), &[Some(&three_d), Some(&w), Some(&zero)]).is_err());
    }
}
