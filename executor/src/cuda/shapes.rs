//! Pure shape arithmetic for the CUDA launchers: convolution and pooling geometry, broadcast and
//! permuted strides, slice bounds, reduction plans, op and activation codes. No CUDA here, so all
//! of it is tested against the CPU ops on any machine. Each function mirrors the CPU op it
//! stands in for; `None` means "not this path" (the backend then runs the CPU op, which also
//! reports any shape error in its own words).

use crate::ops::Activation;
use crate::ops::conv::ConvAttrs;
use crate::ops::elementwise::{Binary, Unary};
use crate::ops::pool::PoolAttrs;
use crate::ops::reduce::ReduceKind;
use crate::tensor::strides;

/// `struct Dims6 { long long d[6]; }` of elementwise.cu and copy.cu, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dims6(pub [i64; 6]);

// SAFETY: a plain C struct of six 64-bit integers, the layout of the kernels' Dims6.
unsafe impl cudarc::driver::DeviceRepr for Dims6 {}

pub const MAX_RANK: usize = 6;

impl Dims6 {
    /// The first `v.len()` entries (at most 6), the rest 0.
    pub fn new(v: &[i64]) -> Option<Dims6> {
        if v.len() > MAX_RANK {
            return None;
        }
        let mut d = [0i64; 6];
        d[..v.len()].copy_from_slice(v);
        Some(Dims6(d))
    }
    pub fn from_usizes(v: &[usize]) -> Option<Dims6> {
        Dims6::new(&v.iter().map(|&x| x as i64).collect::<Vec<_>>())
    }
}

/// Element strides to read `shape` broadcast to `out` (0 on broadcast axes), out's rank.
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<i64> {
    let s = strides(shape);
    let off = out.len() - shape.len();
    (0..out.len())
        .map(|i| {
            if i < off || shape[i - off] == 1 {
                0
            } else {
                s[i - off] as i64
            }
        })
        .collect()
}

/// Source strides of a transpose: `src[d] = in_strides[perm[d]]`.
pub fn permuted_strides(shape: &[usize], perm: &[usize]) -> Vec<i64> {
    let s = strides(shape);
    perm.iter().map(|&p| s[p] as i64).collect()
}

/// Resolves a transpose's permutation (None: reversed axes); None when it is not a permutation.
pub fn transpose_perm(rank: usize, perm: Option<&[usize]>) -> Option<Vec<usize>> {
    let perm: Vec<usize> = perm.map_or_else(|| (0..rank).rev().collect(), <[usize]>::to_vec);
    let mut seen = vec![false; rank];
    if perm.len() != rank {
        return None;
    }
    for &p in &perm {
        if p >= rank || std::mem::replace(&mut seen[p], true) {
            return None;
        }
    }
    Some(perm)
}

/// A transpose that swaps only the last two axes: (batch, rows, cols) for the tiled kernel.
pub fn last_two_swap(shape: &[usize], perm: &[usize]) -> Option<(usize, usize, usize)> {
    let r = shape.len();
    if r < 2 || perm[r - 2] != r - 1 || perm[r - 1] != r - 2 {
        return None;
    }
    if perm[..r - 2].iter().enumerate().any(|(i, &p)| i != p) {
        return None;
    }
    Some((shape[..r - 2].iter().product(), shape[r - 2], shape[r - 1]))
}

/// Slice bounds exactly as the CPU Slice: (output shape, start per axis, step per axis).
pub fn slice_plan(
    shape: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Option<(Vec<usize>, Vec<i64>, Vec<i64>)> {
    crate::ops::shape::slice_plan(
        shape,
        starts,
        ends,
        axes.map(<[i64]>::to_vec),
        steps.map(<[i64]>::to_vec),
    )
    .ok()
}

/// A reduction over contiguous axes as [outer, axis_len, inner] plus the output shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReducePlan {
    pub outer: usize,
    pub axis_len: usize,
    pub inner: usize,
    pub out_shape: Vec<usize>,
}

/// `axes` empty means all axes (the caller handles `noop_with_empty_axes`). None when the
/// axes are not one contiguous run or the reduced extent is empty.
pub fn reduce_plan(shape: &[usize], axes: &[i64], keepdims: bool) -> Option<ReducePlan> {
    let r = shape.len();
    let mut ax: Vec<usize> = if axes.is_empty() {
        (0..r).collect()
    } else {
        axes.iter()
            .map(|&a| crate::tensor::norm_axis(a, r).ok())
            .collect::<Option<_>>()?
    };
    ax.sort_unstable();
    ax.dedup();
    if r == 0 || ax.is_empty() || ax.windows(2).any(|w| w[1] != w[0] + 1) {
        return None;
    }
    let (first, last) = (ax[0], ax[ax.len() - 1]);
    let axis_len: usize = shape[first..=last].iter().product();
    if axis_len == 0 {
        return None;
    }
    let mut out_shape = Vec::with_capacity(r);
    for (i, &d) in shape.iter().enumerate() {
        if (first..=last).contains(&i) {
            if keepdims {
                out_shape.push(1);
            }
        } else {
            out_shape.push(d);
        }
    }
    Some(ReducePlan {
        outer: shape[..first].iter().product(),
        axis_len,
        inner: shape[last + 1..].iter().product(),
        out_shape,
    })
}

/// reduce.cu op codes.
pub fn reduce_code(k: ReduceKind) -> i32 {
    match k {
        ReduceKind::ReduceSum => 0,
        ReduceKind::ReduceMean => 1,
        ReduceKind::ReduceMax => 2,
        ReduceKind::ReduceMin => 3,
        ReduceKind::ReduceProd => 4,
        ReduceKind::ReduceSumSquare => 5,
        ReduceKind::ReduceL1 => 6,
        ReduceKind::ReduceL2 => 7,
    }
}

/// elementwise.cu binary op codes (f32 arithmetic only; comparisons and logic stay on the CPU).
pub fn binary_code(b: Binary) -> Option<i32> {
    Some(match b {
        Binary::Add => 0,
        Binary::Sub => 1,
        Binary::Mul => 2,
        Binary::Div => 3,
        Binary::Max => 4,
        Binary::Min => 5,
        Binary::Pow => 6,
        _ => return None,
    })
}

/// elementwise.cu unary (op, alpha, beta).
pub fn unary_code(u: Unary) -> Option<(i32, f32, f32)> {
    Some(match u {
        Unary::Relu => (1, 0.0, 0.0),
        Unary::Sigmoid => (2, 0.0, 0.0),
        Unary::Tanh => (3, 0.0, 0.0),
        Unary::Gelu(false) => (4, 0.0, 0.0),
        Unary::Gelu(true) => (5, 0.0, 0.0),
        Unary::Exp => (6, 0.0, 0.0),
        Unary::Log => (7, 0.0, 0.0),
        Unary::Sqrt => (8, 0.0, 0.0),
        Unary::Abs => (10, 0.0, 0.0),
        Unary::Neg => (11, 0.0, 0.0),
        Unary::Reciprocal => (12, 0.0, 0.0),
        Unary::LeakyRelu(a) => (13, a, 0.0),
        Unary::Elu(a) => (14, a, 0.0),
        Unary::HardSigmoid(a, b) => (16, a, b),
        Unary::HardSwish => (17, 0.0, 0.0),
        Unary::Softplus => (18, 0.0, 0.0),
        Unary::Erf => (20, 0.0, 0.0),
        Unary::Floor => (23, 0.0, 0.0),
        Unary::Ceil => (24, 0.0, 0.0),
        Unary::Selu(a, g) => (28, a, g),
        Unary::Not | Unary::Identity => return None,
    })
}

/// Unary code 15 (clip) bounds.
pub const UNARY_CLIP: i32 = 15;

/// An activation as (epilogue code, alpha, beta), or as a separate unary pass (HardSigmoid
/// has no epilogue code).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    Epilogue(i32, f32, f32),
    Unary(i32, f32, f32),
}

pub fn act_code(a: Option<Activation>) -> Act {
    match a {
        None => Act::Epilogue(0, 0.0, 0.0),
        Some(Activation::Relu) => Act::Epilogue(1, 0.0, 0.0),
        Some(Activation::LeakyRelu(al)) => Act::Epilogue(3, al, 0.0),
        Some(Activation::Sigmoid) => Act::Epilogue(4, 0.0, 0.0),
        Some(Activation::Gelu) => Act::Epilogue(5, 0.0, 0.0),
        Some(Activation::Tanh) => Act::Epilogue(7, 0.0, 0.0),
        Some(Activation::HardSwish) => Act::Epilogue(8, 0.0, 0.0),
        Some(Activation::Clip(lo, hi)) => Act::Epilogue(9, lo, hi),
        Some(Activation::HardSigmoid(al, be)) => Act::Unary(16, al, be),
    }
}

/// Convolution geometry resolved against the input, 1-D as height 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvGeom {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub m: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub pad: [usize; 2],
    pub stride: [usize; 2],
    pub dil: [usize; 2],
    pub groups: usize,
    pub out_shape: Vec<usize>,
}

impl ConvGeom {
    pub fn is_pointwise(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.pad == [0, 0]
            && self.stride == [1, 1]
            && self.groups == 1
    }
    /// groups == C, one input channel per group, M a multiple of C.
    pub fn is_depthwise(&self) -> bool {
        self.groups > 1 && self.groups == self.c && self.m.is_multiple_of(self.c)
    }
}

/// As `ops::conv::conv` computes it (forward convolution only).
pub fn conv_geometry(a: &ConvAttrs, x: &[usize], w: &[usize]) -> Option<ConvGeom> {
    let (n, c, hw) = match x {
        [n, c, w] => (*n, *c, [1, *w]),
        [n, c, h, w] => (*n, *c, [*h, *w]),
        _ => return None,
    };
    let spatial = x.len() - 2;
    if w.len() != x.len() || a.group == 0 {
        return None;
    }
    let (m, cg) = (w[0], w[1]);
    if cg * a.group != c || m % a.group != 0 {
        return None;
    }
    let kernel = &w[2..];
    let crate::ops::conv::Geometry {
        k,
        s,
        d,
        begin,
        end,
    } = crate::ops::conv::geometry(a, spatial, kernel, hw, false).ok()?;
    if s.contains(&0) || d.contains(&0) {
        return None;
    }
    let mut o = [0usize; 2];
    for i in 0..2 {
        let eff = (k[i] - 1) * d[i] + 1;
        let padded = hw[i] + begin[i] + end[i];
        if padded < eff {
            return None;
        }
        o[i] = (padded - eff) / s[i] + 1;
    }
    let mut out_shape = vec![n, m];
    out_shape.extend(if spatial == 1 { &o[1..] } else { &o[..] });
    Some(ConvGeom {
        n,
        c,
        h: hw[0],
        w: hw[1],
        m,
        kh: k[0],
        kw: k[1],
        oh: o[0],
        ow: o[1],
        pad: begin,
        stride: s,
        dil: d,
        groups: a.group,
        out_shape,
    })
}

/// Pooling geometry as `ops::pool::pool` computes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolGeom {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub k: [usize; 2],
    pub s: [usize; 2],
    pub d: [usize; 2],
    pub begin: [usize; 2],
    pub end: [usize; 2],
    pub out: [usize; 2],
    pub out_shape: Vec<usize>,
}

pub fn pool_geometry(p: &PoolAttrs, x: &[usize]) -> Option<PoolGeom> {
    let (g, out_shape) = crate::ops::pool::pool2d_geometry(p, x).ok()?;
    Some(PoolGeom {
        planes: g.planes,
        h: g.h,
        w: g.w,
        k: [g.kh, g.kw],
        s: [g.sh, g.sw],
        d: [g.dh, g.dw],
        begin: [g.pt, g.pl],
        end: [g.pb, g.pr],
        out: [g.oh, g.ow],
        out_shape,
    })
}

/// i32 for a kernel's `int` argument; None when it does not fit.
pub fn int(v: usize) -> Option<i32> {
    i32::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::shape::ShapeOp;
    use crate::ops::{Cx, Op};
    use crate::tensor::Tensor;

    /// Lcg floats in [-1, 1).
    pub(crate) fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed
            .wrapping_mul(2862933555777941757)
            .wrapping_add(3037000493);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// What strided_copy_f32 computes, on the host.
    fn emulate_strided_copy(
        src: &[f32],
        dst: &mut [f32],
        shape: &[usize],
        src_strides: &[i64],
        src_offset: i64,
        dst_strides: &[i64],
        dst_offset: i64,
    ) {
        let n: usize = shape.iter().product();
        for i in 0..n {
            let (mut rem, mut so, mut doff) = (i, src_offset, dst_offset);
            for d in (0..shape.len()).rev() {
                let idx = (rem % shape[d]) as i64;
                rem /= shape[d];
                so += idx * src_strides[d];
                doff += idx * dst_strides[d];
            }
            dst[doff as usize] = src[so as usize];
        }
    }

    fn contiguous(shape: &[usize]) -> Vec<i64> {
        strides(shape).iter().map(|&s| s as i64).collect()
    }

    fn cpu(op: Op, inputs: &[&Tensor]) -> Tensor {
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        op.eval(&Cx::new(1), &refs).unwrap().remove(0)
    }

    #[test]
    fn transpose_strides_match_the_cpu_transpose() {
        let shape = [2usize, 3, 4, 5];
        let x = Tensor::f32(shape.to_vec(), rand_vec(120, 1)).unwrap();
        for perm in [
            vec![0, 2, 1, 3],
            vec![3, 2, 1, 0],
            vec![1, 0, 3, 2],
            vec![0, 1, 3, 2],
        ] {
            let want = cpu(
                Op::Shape(ShapeOp::Transpose {
                    perm: Some(perm.clone()),
                }),
                &[&x],
            );
            let p = transpose_perm(4, Some(&perm)).unwrap();
            let out_shape: Vec<usize> = p.iter().map(|&i| shape[i]).collect();
            assert_eq!(out_shape, want.shape);
            let mut got = vec![0.0; 120];
            emulate_strided_copy(
                x.as_f32().unwrap(),
                &mut got,
                &out_shape,
                &permuted_strides(&shape, &p),
                0,
                &contiguous(&out_shape),
                0,
            );
            assert_eq!(got, want.as_f32().unwrap(), "perm {perm:?}");
        }
        assert_eq!(last_two_swap(&shape, &[0, 1, 3, 2]), Some((6, 4, 5)));
        assert_eq!(last_two_swap(&shape, &[1, 0, 3, 2]), None);
        assert_eq!(transpose_perm(3, None), Some(vec![2, 1, 0]));
        assert_eq!(transpose_perm(3, Some(&[0, 0, 1])), None);
    }

    #[test]
    fn slice_plans_match_the_cpu_slice() {
        let shape = [4usize, 7, 5];
        let x = Tensor::f32(shape.to_vec(), rand_vec(140, 2)).unwrap();
        type Case = (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>);
        let cases: Vec<Case> = vec![
            (vec![1], vec![3], vec![0], vec![1]),
            (vec![0, -1], vec![7, -100], vec![1, 2], vec![2, -1]),
            (vec![-3], vec![i64::MAX], vec![-1], vec![1]),
            (vec![6, 3], vec![0, 0], vec![1, 0], vec![-2, -1]),
            (vec![2], vec![2], vec![1], vec![1]),
            (vec![10], vec![-10], vec![2], vec![-3]),
        ];
        for (st, en, ax, sp) in cases {
            let t = |v: &Vec<i64>| Tensor::i64(vec![v.len()], v.clone()).unwrap();
            let want = cpu(
                Op::Shape(ShapeOp::Slice { attrs: None }),
                &[&x, &t(&st), &t(&en), &t(&ax), &t(&sp)],
            );
            let (out, start, step) = slice_plan(&shape, &st, &en, Some(&ax), Some(&sp)).unwrap();
            assert_eq!(out, want.shape, "{st:?} {en:?} {ax:?} {sp:?}");
            let xs = contiguous(&shape);
            let off: i64 = start.iter().zip(&xs).map(|(a, b)| a * b).sum();
            let src_strides: Vec<i64> = step.iter().zip(&xs).map(|(a, b)| a * b).collect();
            let mut got = vec![0.0; out.iter().product()];
            if !got.is_empty() {
                emulate_strided_copy(
                    x.as_f32().unwrap(),
                    &mut got,
                    &out,
                    &src_strides,
                    off,
                    &contiguous(&out),
                    0,
                );
            }
            assert_eq!(got, want.as_f32().unwrap());
        }
    }

    #[test]
    fn concat_offsets_and_broadcast_strides_match_the_cpu() {
        let a = Tensor::f32(vec![2, 3, 4], rand_vec(24, 3)).unwrap();
        let b = Tensor::f32(vec![2, 1, 4], rand_vec(8, 4)).unwrap();
        let want = cpu(Op::Shape(ShapeOp::Concat { axis: 1 }), &[&a, &b]);
        let out_shape = [2usize, 4, 4];
        let os = contiguous(&out_shape);
        let mut got = vec![0.0; 32];
        let mut at = 0i64;
        for t in [&a, &b] {
            emulate_strided_copy(
                t.as_f32().unwrap(),
                &mut got,
                &t.shape,
                &contiguous(&t.shape),
                0,
                &os,
                at * os[1],
            );
            at += t.shape[1] as i64;
        }
        assert_eq!(got, want.as_f32().unwrap());

        // ew_binary_bcast: out[i] = a[sum idx*a_str] + b[sum idx*b_str].
        let x = Tensor::f32(vec![3, 1, 5], rand_vec(15, 5)).unwrap();
        let y = Tensor::f32(vec![4, 1], rand_vec(4, 6)).unwrap();
        let want = cpu(Op::Binary(Binary::Sub), &[&x, &y]);
        let out = [3usize, 4, 5];
        let (xs, ys) = (
            broadcast_strides(&x.shape, &out),
            broadcast_strides(&y.shape, &out),
        );
        let mut got = vec![0.0; 60];
        let mut ia = vec![0.0; 60];
        let mut ib = vec![0.0; 60];
        emulate_strided_copy(
            x.as_f32().unwrap(),
            &mut ia,
            &out,
            &xs,
            0,
            &contiguous(&out),
            0,
        );
        emulate_strided_copy(
            y.as_f32().unwrap(),
            &mut ib,
            &out,
            &ys,
            0,
            &contiguous(&out),
            0,
        );
        for i in 0..60 {
            got[i] = ia[i] - ib[i];
        }
        assert_eq!(got, want.as_f32().unwrap());
    }

    #[test]
    fn conv_and_pool_geometry_match_the_cpu_shapes() {
        let x = Tensor::f32(vec![2, 6, 9, 7], rand_vec(2 * 6 * 63, 7)).unwrap();
        let cases = [
            (
                vec![4, 6, 3, 3],
                Some(vec![1, 1, 1, 1]),
                None,
                None,
                1,
                "NOTSET",
            ),
            (
                vec![4, 3, 3, 2],
                None,
                Some(vec![2, 1]),
                Some(vec![1, 2]),
                2,
                "NOTSET",
            ),
            (
                vec![12, 1, 3, 3],
                None,
                Some(vec![2, 2]),
                None,
                6,
                "SAME_UPPER",
            ),
            (vec![5, 6, 1, 1], None, None, None, 1, "NOTSET"),
            (
                vec![6, 1, 5, 5],
                Some(vec![2, 1, 0, 3]),
                Some(vec![3, 2]),
                None,
                6,
                "SAME_LOWER",
            ),
        ];
        for (w, pads, strides_, dil, group, auto) in cases {
            let a = ConvAttrs {
                pads: pads.clone(),
                strides: strides_.clone(),
                dilations: dil.clone(),
                group,
                auto_pad: auto.into(),
                ..Default::default()
            };
            let wt = Tensor::f32(w.clone(), rand_vec(w.iter().product(), 8)).unwrap();
            let want = cpu(Op::Conv(a.clone()), &[&x, &wt]);
            let g = conv_geometry(&a, &x.shape, &w).unwrap();
            assert_eq!(g.out_shape, want.shape, "{w:?} {pads:?} {auto}");
        }
        let g = conv_geometry(
            &ConvAttrs {
                group: 6,
                ..Default::default()
            },
            &x.shape,
            &[12, 1, 3, 3],
        )
        .unwrap();
        assert!(g.is_depthwise() && !g.is_pointwise());
        let g = conv_geometry(
            &ConvAttrs {
                group: 1,
                ..Default::default()
            },
            &x.shape,
            &[3, 6, 1, 1],
        )
        .unwrap();
        assert!(g.is_pointwise());

        for (k, s, pads, ceil, auto) in [
            (
                vec![3, 3],
                Some(vec![2, 2]),
                Some(vec![1, 1, 1, 1]),
                false,
                "NOTSET",
            ),
            (vec![3, 2], Some(vec![2, 2]), None, true, "NOTSET"),
            (vec![2, 2], None, None, false, "SAME_UPPER"),
            (
                vec![3, 3],
                Some(vec![2, 3]),
                Some(vec![0, 1, 1, 0]),
                true,
                "NOTSET",
            ),
        ] {
            for max in [true, false] {
                let p = PoolAttrs {
                    max,
                    kernel_shape: k.clone(),
                    strides: s.clone(),
                    dilations: None,
                    pads: pads.clone(),
                    auto_pad: auto.into(),
                    ceil_mode: ceil,
                    count_include_pad: false,
                };
                let want = cpu(Op::Pool(p.clone()), &[&x]);
                assert_eq!(pool_geometry(&p, &x.shape).unwrap().out_shape, want.shape);
            }
        }
    }

    #[test]
    fn reduce_plans_match_the_cpu_shapes() {
        let x = Tensor::f32(vec![2, 3, 4, 5], rand_vec(120, 9)).unwrap();
        use crate::ops::reduce::ReduceAttrs;
        for (axes, keep) in [
            (vec![1i64, 2], true),
            (vec![-1], false),
            (vec![], true),
            (vec![0], false),
        ] {
            let r = ReduceAttrs {
                kind: ReduceKind::ReduceSum,
                axes: Some(axes.clone()),
                keepdims: keep,
                noop_with_empty_axes: false,
            };
            let want = cpu(Op::Reduce(r), &[&x]);
            let p = reduce_plan(&x.shape, &axes, keep).unwrap();
            assert_eq!(p.out_shape, want.shape, "{axes:?}");
            assert_eq!(p.outer * p.axis_len * p.inner, 120);
            // The [outer, axis, inner] sum reproduces the CPU numbers.
            let v = x.as_f32().unwrap();
            let mut got = vec![0.0f32; p.outer * p.inner];
            for o in 0..p.outer {
                for a in 0..p.axis_len {
                    for k in 0..p.inner {
                        got[o * p.inner + k] += v[(o * p.axis_len + a) * p.inner + k];
                    }
                }
            }
            for (g, w) in got.iter().zip(want.as_f32().unwrap()) {
                assert!((g - w).abs() < 1e-5);
            }
        }
        assert_eq!(
            reduce_plan(&[2, 3, 4], &[0, 2], true),
            None,
            "not contiguous"
        );
    }

    #[test]
    fn codes_follow_the_kernel_headers() {
        assert_eq!(unary_code(Unary::Relu), Some((1, 0.0, 0.0)));
        assert_eq!(unary_code(Unary::Selu(1.5, 2.0)), Some((28, 1.5, 2.0)));
        assert_eq!(unary_code(Unary::Identity), None);
        assert_eq!(binary_code(Binary::Pow), Some(6));
        assert_eq!(binary_code(Binary::Equal), None);
        assert_eq!(
            act_code(Some(Activation::Clip(0.0, 6.0))),
            Act::Epilogue(9, 0.0, 6.0)
        );
        assert_eq!(
            act_code(Some(Activation::HardSigmoid(0.2, 0.5))),
            Act::Unary(16, 0.2, 0.5)
        );
        assert_eq!(reduce_code(ReduceKind::ReduceL2), 7);
        assert_eq!(Dims6::new(&[1, 2]).unwrap().0, [1, 2, 0, 0, 0, 0]);
        assert!(Dims6::new(&[1; 7]).is_none());
        assert_eq!(std::mem::size_of::<Dims6>(), 48);
    }
}
