//! MaxPool, AveragePool and LpPool over any number of spatial axes, computed in f64 window by
//! window; MaxPool's Indices output (row- or column-major) comes from here too. The 1-D and 2-D
//! MaxPool and AveragePool without indices keep their kernels (`pool`).

use super::elementwise::cast;
use super::pool::PoolAttrs;
use super::window::{Window, WindowAttrs};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{DType, Data, Tensor, checked_numel};

/// What a window reduces to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reduce {
    Max,
    Average,
    /// The `p`-norm; padding counts as zeros.
    Lp(u32),
}

/// The window of pooling `p` over an input of shape `x` (`[N, C, spatial...]`), and the output
/// shape.
pub(crate) fn pool_nd_geometry(p: &PoolAttrs, x: &[usize]) -> OpResult<(Window, Vec<usize>)> {
    if x.len() < 3 {
        return shape_err(format!("pooling needs [N, C, spatial...], got {x:?}"));
    }
    if p.kernel_shape.len() != x.len() - 2 {
        return shape_err(format!("kernel_shape {:?} for input {x:?}", p.kernel_shape));
    }
    let w = Window::resolve(
        &x[2..],
        &p.kernel_shape,
        &WindowAttrs {
            strides: p.strides.as_deref(),
            dilations: p.dilations.as_deref(),
            pads: p.pads.as_deref(),
            auto_pad: &p.auto_pad,
            ceil_mode: p.ceil_mode,
        },
    )?;
    let mut shape = x[..2].to_vec();
    shape.extend(&w.output);
    checked_numel(&shape)?;
    Ok((w, shape))
}

/// Pools `x` by `reduce` over the windows of `p`; with `indices` also the flat index of each
/// maximum in `x` (row-major, or within each channel column-major with `p.column_major`).
pub fn pool_nd(p: &PoolAttrs, reduce: Reduce, x: &Tensor, indices: bool) -> OpResult<Vec<Tensor>> {
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Err(OpError::DType(format!("pooling of {:?}", x.dtype())));
    }
    let (w, shape) = pool_nd_geometry(p, &x.shape)?;
    let total = checked_numel(&shape)?;
    let planes = shape[0] * shape[1];
    let (plane_in, plane_out) = (w.input.iter().product::<usize>(), w.positions());
    let v = x.to_f64_vec();
    let mut y = vec![0.0f64; total];
    let mut at = vec![0i64; if indices { total } else { 0 }];
    if total == 0 {
        let y = Tensor::zeros(x.dtype(), shape.clone())?;
        let i = Tensor::zeros(DType::I64, shape)?;
        return Ok(if indices { vec![y, i] } else { vec![y] });
    }
    let reads = w.reads();
    let padded = reads.padded_taps();
    for c in 0..planes {
        let src = &v[c * plane_in..][..plane_in];
        let out = &mut y[c * plane_out..][..plane_out];
        // Per output position: running value, taps read, and the offset of the maximum.
        let mut acc = vec![(f64::NAN, 0usize, None::<usize>); plane_out];
        reads.visit(|pos, o| {
            let a = &mut acc[pos];
            let v = src[o];
            match reduce {
                Reduce::Max => {
                    if a.2.is_none() || v > a.0 {
                        (a.0, a.2) = (v, Some(o));
                    }
                }
                Reduce::Average => a.0 = if a.1 == 0 { v } else { a.0 + v },
                Reduce::Lp(p) => {
                    let t = v.abs().powi(p as i32);
                    a.0 = if a.1 == 0 { t } else { a.0 + t };
                }
            }
            a.1 += 1;
        });
        for (k, (value, count, arg)) in acc.into_iter().enumerate() {
            out[k] = match reduce {
                Reduce::Max => value,
                Reduce::Average => {
                    let div = if p.count_include_pad {
                        padded[k]
                    } else {
                        count as f64
                    };
                    if count == 0 || div == 0.0 {
                        0.0
                    } else {
                        value / div
                    }
                }
                Reduce::Lp(_) if count == 0 => 0.0,
                Reduce::Lp(p) => value.powf(1.0 / f64::from(p)),
            };
            if indices {
                let within = arg.map_or(0, |o| {
                    if p.column_major {
                        col_major(o, &w.input)
                    } else {
                        o
                    }
                });
                at[c * plane_out + k] = (c * plane_in + within) as i64;
            }
        }
    }
    let y = cast(&Tensor::new(shape.clone(), Data::F64(y))?, x.dtype());
    if indices {
        return Ok(vec![y, Tensor::i64(shape, at)?]);
    }
    Ok(vec![y])
}

/// The column-major position (first axis fastest) of the row-major offset `off` in `dims`.
fn col_major(mut off: usize, dims: &[usize]) -> usize {
    let mut digits = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        digits[a] = off % dims[a];
        off /= dims[a];
    }
    let (mut col, mut stride) = (0, 1);
    for (a, &d) in digits.iter().enumerate() {
        col += d * stride;
        stride *= dims[a];
    }
    col
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(kernel: Vec<usize>) -> PoolAttrs {
        PoolAttrs {
            max: true,
            kernel_shape: kernel,
            strides: None,
            dilations: None,
            pads: None,
            auto_pad: "NOTSET".into(),
            ceil_mode: false,
            count_include_pad: false,
            column_major: false,
            indices: true,
            nhwc: false,
        }
    }

    #[test]
    fn pooling_reduces_each_window_and_finds_the_maximum() {
        let x = Tensor::f32(vec![1, 1, 2, 3], vec![1.0, 6.0, 3.0, 4.0, 5.0, 2.0]).unwrap();
        let p = attrs(vec![2, 2]);
        let out = pool_nd(&p, Reduce::Max, &x, true).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[6.0, 6.0]);
        assert_eq!(out[1].to_i64_vec().unwrap(), vec![1, 1]);
        let cols = PoolAttrs {
            column_major: true,
            ..p.clone()
        };
        let out = pool_nd(&cols, Reduce::Max, &x, true).unwrap();
        // (0, 1) in a 2x3 channel, first axis fastest: 0 + 1 * 2.
        assert_eq!(out[1].to_i64_vec().unwrap(), vec![2, 2]);
        let avg = pool_nd(&p, Reduce::Average, &x, false).unwrap();
        assert_eq!(avg[0].as_f32().unwrap(), &[4.0, 4.0]);
        let lp = pool_nd(&p, Reduce::Lp(1), &x, false).unwrap();
        assert_eq!(lp[0].as_f32().unwrap(), &[16.0, 16.0]);
        assert_eq!(col_major(5, &[2, 3]), 5);
        assert!(pool_nd(&attrs(vec![3, 3]), Reduce::Max, &x, false).is_err());
        assert!(pool_nd(&attrs(vec![2]), Reduce::Max, &x, false).is_err());
    }
}
