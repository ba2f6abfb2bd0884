//! Conv and the fused 1x1 → depthwise (→ 1x1) of mobile nets. Ungrouped convolutions are GEMMs:
//! 1x1 directly on the input, others through im2col into the step's scratch; bias, activation and
//! a fused residual run in one epilogue. Depthwise and grouped convolutions have direct kernels.
//!
//! Pieces: images when the batch has at least two; with one image, output channels (rows of the
//! GEMM, after one shared im2col) or, for depthwise, input channels with their outputs. The fused
//! block splits along images only (its stages' channels do not line up).

use super::codes::{self, Act};
use super::elementwise::unary_range;
use super::{Cx, Decline, Lowered, Operand, decline, f32_in, opt_f32_in};
use crate::gpu::api::{DevPtr, Kernel};
use crate::gpu::blas::RowMajor;
use crate::gpu::launch::{Builder, grid_1d};
use crate::ops::conv::{ConvAttrs, PointwiseDepthwise, conv_geometry};
use crate::tensor::DType;
use cotenant_kernels::conv::Conv2d;
use cotenant_kernels::cuda::ActCode;

/// Bytes of im2col scratch one convolution may use; larger batches go through it in chunks.
const IM2COL_MAX_BYTES: usize = 256 << 20;

/// Scratch regions of a convolution step.
const COL: usize = 0;
const MID1: usize = 1;
const MID2: usize = 2;

/// One convolution resolved against its input: geometry, where everything is, what follows.
#[derive(Clone, Copy)]
struct Stage {
    g: Conv2d,
    x: DevPtr,
    w: DevPtr,
    y: DevPtr,
    bias: Option<DevPtr>,
    residual: Option<DevPtr>,
    act: Act,
    /// How it runs, fixed when resolved (a piece of a depthwise convolution with one channel
    /// still runs the depthwise kernel).
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Gemm,
    /// The depthwise kernel, each input channel giving this many outputs.
    Depthwise(usize),
    /// The direct kernel for other grouped convolutions.
    Grouped,
}

impl Stage {
    /// The convolution `c` on an input of shape `x_shape`: geometry, and the checks on bias and
    /// residual. The output pointer is filled in by the caller.
    fn resolve(
        c: &ConvAttrs,
        x_shape: &[usize],
        ins: &[Option<Operand<'_>>],
        x: DevPtr,
        first_input: usize,
    ) -> Lowered<(Stage, Vec<usize>)> {
        let (w, pw) = f32_in(ins, first_input + 1)?;
        let (g, out_shape) =
            conv_geometry(c, x_shape, w.shape).map_err(|e| Decline(e.to_string()))?;
        let bias = opt_f32_in(ins, first_input + 2)?;
        if bias.is_some_and(|(b, _)| b.len() != g.m) {
            return decline("bias length is not the output channels");
        }
        // A fused residual of another shape (a broadcast Add) is left to the host.
        let residual = match opt_f32_in(ins, first_input + 3)?.filter(|_| c.residual) {
            Some((r, _)) if r.shape != out_shape.as_slice() => {
                return decline("a broadcast residual");
            }
            r => r.map(|(_, p)| p),
        };
        let kind = match depth_multiplier(&g) {
            _ if g.groups == 1 => Kind::Gemm,
            Some(mult) => Kind::Depthwise(mult),
            None => Kind::Grouped,
        };
        let stage = Stage {
            g,
            x,
            w: pw,
            y: x, // placeholder until the caller places the output
            bias: bias.map(|(_, p)| p),
            residual,
            act: codes::act(c.act)?,
            kind,
        };
        Ok((stage, out_shape))
    }

    fn plane_in(&self) -> usize {
        self.g.c * self.g.h * self.g.w
    }
    fn plane_out(&self) -> usize {
        self.g.m * self.g.oh * self.g.ow
    }
    fn col_bytes(&self) -> usize {
        if self.kind != Kind::Gemm || self.g.is_pointwise() {
            return 0;
        }
        let per_image = self.g.c * self.g.kh * self.g.kw * self.g.oh * self.g.ow;
        chunk(per_image, self.g.n) * per_image * 4
    }

    /// The same stage on images `r` of the batch.
    fn images(&self, r: std::ops::Range<usize>) -> Stage {
        Stage {
            g: Conv2d {
                n: r.len(),
                ..self.g
            },
            x: self.x.at(r.start * self.plane_in(), 4),
            y: self.y.at(r.start * self.plane_out(), 4),
            residual: self.residual.map(|p| p.at(r.start * self.plane_out(), 4)),
            ..*self
        }
    }
}

/// Images per im2col chunk: as many as fit in [`IM2COL_MAX_BYTES`].
fn chunk(per_image: usize, n: usize) -> usize {
    (IM2COL_MAX_BYTES / (per_image * 4).max(1)).clamp(1, n.max(1))
}

pub fn conv(c: &ConvAttrs, ins: &[Option<Operand<'_>>], cx: &mut Cx<'_>) -> Lowered<()> {
    if c.nhwc {
        return decline("an NHWC convolution (the CPU's layout)");
    }
    let (x, px) = f32_in(ins, 0)?;
    let (mut s, out_shape) = Stage::resolve(c, x.shape, ins, px, 0)?;
    s.y = cx.output(0, DType::F32, out_shape)?;
    let col = match s.col_bytes() {
        0 => None,
        b => Some(cx.scratch(COL, b as u64)?),
    };
    if s.g.n * s.plane_out() == 0 {
        cx.whole();
        return Ok(());
    }
    if s.g.n > 1 {
        for r in cx.ranges(s.g.n) {
            cx.piece();
            run(&s.images(r), col, cx)?;
        }
        return Ok(());
    }
    one_image_in_pieces(&s, col, cx)
}

/// One image split along its output channels (ungrouped, depthwise) or whole (grouped).
fn one_image_in_pieces(s: &Stage, col: Option<DevPtr>, cx: &mut Cx<'_>) -> Lowered<()> {
    let g = &s.g;
    let hw = g.oh * g.ow;
    if s.kind == Kind::Gemm {
        let b = match col {
            None => s.x,
            Some(col) => {
                cx.piece();
                im2col(cx, g, s.x, col)?;
                col
            }
        };
        for (i, r) in cx.ranges(g.m).into_iter().enumerate() {
            if i > 0 || col.is_none() {
                cx.piece();
            }
            cx.gemm(product(s, b, 0).rows(r.start, r.end).gemm());
            finish(s, cx, r.start * hw, r.len() * hw, r.start, r.len(), false)?;
        }
        return Ok(());
    }
    if let Kind::Depthwise(mult) = s.kind {
        for r in cx.ranges(g.c) {
            cx.piece();
            let sub = Stage {
                g: Conv2d {
                    c: r.len(),
                    groups: r.len(),
                    m: r.len() * mult,
                    ..*g
                },
                x: s.x.at(r.start * g.h * g.w, 4),
                w: s.w.at(r.start * mult * g.kh * g.kw, 4),
                y: s.y.at(r.start * mult * hw, 4),
                bias: s.bias.map(|b| b.at(r.start * mult, 4)),
                residual: s.residual.map(|p| p.at(r.start * mult * hw, 4)),
                ..*s
            };
            run(&sub, None, cx)?;
        }
        return Ok(());
    }
    cx.whole();
    cx.piece();
    run(s, col, cx)
}

/// Lowers a whole stage (all its images) into the current piece.
fn run(s: &Stage, col: Option<DevPtr>, cx: &mut Cx<'_>) -> Lowered<()> {
    let g = &s.g;
    let len = g.n * s.plane_out();
    if len == 0 {
        return Ok(());
    }
    if s.kind == Kind::Gemm {
        let per_image = g.c * g.kh * g.kw * g.oh * g.ow;
        let step = chunk(per_image, g.n);
        let mut n0 = 0;
        while n0 < g.n {
            let n1 = (n0 + step).min(g.n);
            let part = s.images(n0..n1);
            match col {
                Some(col) if !g.is_pointwise() => {
                    im2col(cx, &part.g, part.x, col)?;
                    cx.gemm(product(&part, col, per_image).gemm());
                }
                _ => cx.gemm(product(&part, part.x, s.plane_in()).gemm()),
            }
            n0 = n1;
        }
        return finish(s, cx, 0, len, 0, g.m, false);
    }
    let kernel_act = if s.residual.is_some() {
        Act::NONE
    } else {
        s.act
    };
    let (act, al, be) = kernel_act.epilogue();
    let launch = match s.kind {
        Kind::Depthwise(mult) => conv_args(
            Builder::new(Kernel::DepthwiseConv2d, grid_1d(len as u64))
                .ptr(s.x)
                .ptr(s.w)
                .opt(s.bias)
                .ptr(s.y),
            g,
            mult,
        ),
        _ => conv_args(
            Builder::new(Kernel::Conv2dDirect, grid_1d(len as u64))
                .ptr(s.x)
                .ptr(s.w)
                .opt(s.bias)
                .ptr(s.y),
            g,
            g.m,
        )
        .int(g.groups),
    };
    cx.launch(launch.code(act as i32).float(al).float(be).finish())?;
    finish(s, cx, 0, len, 0, g.m, true)
}

/// y[n] (M × OH·OW) = W (M × K) · b[n], images of the stage, `b` advancing `stride_b` per image.
fn product(s: &Stage, b: DevPtr, stride_b: usize) -> RowMajor {
    let g = &s.g;
    let kdim = (g.c / g.groups.max(1)) * g.kh * g.kw;
    RowMajor::dense(g.m, g.oh * g.ow, kdim, false, false, s.w, b, s.y).batched(
        g.n,
        0,
        stride_b as i64,
        s.plane_out() as i64,
    )
}

/// The depthwise case the kernel covers: one input channel per group, each giving `mult`
/// output channels.
fn depth_multiplier(g: &Conv2d) -> Option<usize> {
    (g.groups > 1 && g.groups == g.c && g.m.is_multiple_of(g.c)).then(|| g.m / g.c)
}

/// conv.cu's geometry arguments after the pointers: N, C, H, W, then `m` (output channels, or
/// the depthwise multiplier), KH .. dil_w.
fn conv_args(b: Builder, g: &Conv2d, m: usize) -> Builder {
    b.int(g.n)
        .int(g.c)
        .int(g.h)
        .int(g.w)
        .int(m)
        .int(g.kh)
        .int(g.kw)
        .int(g.oh)
        .int(g.ow)
        .int(g.pt)
        .int(g.pl)
        .int(g.sh)
        .int(g.sw)
        .int(g.dh)
        .int(g.dw)
}

/// im2col of the stage's images into `col` ([N, C·KH·KW, OH·OW]).
fn im2col(cx: &mut Cx<'_>, g: &Conv2d, x: DevPtr, col: DevPtr) -> Lowered<()> {
    let total = g.n * g.c * g.kh * g.kw * g.oh * g.ow;
    // im2col_nchw_f32 has no M argument.
    cx.launch(
        Builder::new(Kernel::Im2col, grid_1d(total as u64))
            .ptr(x)
            .ptr(col)
            .int(g.n)
            .int(g.c)
            .int(g.h)
            .int(g.w)
            .int(g.kh)
            .int(g.kw)
            .int(g.oh)
            .int(g.ow)
            .int(g.pt)
            .int(g.pl)
            .int(g.sh)
            .int(g.sw)
            .int(g.dh)
            .int(g.dw)
            .finish(),
    )
}

/// What the product did not apply, to `len` elements of the stage's output from element `at`,
/// which hold channels `c0 .. c0 + chans` (repeating over images): bias, residual, activation.
/// `fused`: the kernel already added the bias and, without a residual, applied the activation.
#[allow(clippy::too_many_arguments)]
fn finish(
    s: &Stage,
    cx: &mut Cx<'_>,
    at: usize,
    len: usize,
    c0: usize,
    chans: usize,
    fused: bool,
) -> Lowered<()> {
    if len == 0 {
        return Ok(());
    }
    let inner = (s.g.oh * s.g.ow).max(1);
    let bias = if fused {
        None
    } else {
        s.bias.map(|b| b.at(c0, 4))
    };
    let y = s.y.at(at, 4);
    let (act, al, be) = s.act.epilogue();
    if let Some(r) = s.residual {
        cx.launch(
            Builder::new(Kernel::EpilogueBiasResidualAct, grid_1d(len as u64))
                .ptr(y)
                .opt(bias)
                .ptr(r.at(at, 4))
                .epilogue(len, chans, inner, (act as i32, al, be))
                .finish(),
        )?;
    } else if !fused && (bias.is_some() || act != ActCode::None) {
        cx.launch(
            Builder::new(Kernel::EpilogueBiasAct, grid_1d(len as u64))
                .ptr(y)
                .opt(bias)
                .epilogue(len, chans, inner, (act as i32, al, be))
                .finish(),
        )?;
    }
    if let Act::Unary(code, a, b) = s.act {
        unary_range(cx, y, y, len, code, a, b)?;
    }
    Ok(())
}

/// A 1x1 convolution feeding a depthwise one (and maybe a 1x1 projection), as the fusion pass
/// made it for the CPU: here the stages run one after another through the step's scratch, and
/// pieces are ranges of images running all stages.
pub fn pointwise_depthwise(
    f: &PointwiseDepthwise,
    ins: &[Option<Operand<'_>>],
    cx: &mut Cx<'_>,
) -> Lowered<()> {
    let (x, px) = f32_in(ins, 0)?;
    let (mut s1, shape1) = Stage::resolve(&f.pointwise, x.shape, &ins[..ins.len().min(3)], px, 0)?;
    // Stage 2 reads inputs 3, 4 (weight, bias); stage 3 reads 5, 6, 7 (weight, bias, residual).
    let shifted = |first: usize| -> Vec<Option<Operand<'_>>> {
        let mut v = vec![None];
        v.extend((first..first + 3).map(|i| ins.get(i).copied().flatten()));
        v
    };
    let ins2 = shifted(3);
    let (mut s2, shape2) = Stage::resolve(&f.depthwise, &shape1, &ins2, px, 0)?;
    let mut stages = vec![];
    let out_shape = match &f.project {
        None => shape2,
        Some(p) => {
            let ins3 = shifted(5);
            let (s3, shape3) = Stage::resolve(p, &shape2, &ins3, px, 0)?;
            stages.push(s3);
            shape3
        }
    };
    let y = cx.output(0, DType::F32, out_shape)?;
    let mid1 = cx.scratch(MID1, (s1.g.n * s1.plane_out() * 4) as u64)?;
    s1.y = mid1;
    s2.x = mid1;
    match stages.first_mut() {
        None => s2.y = y,
        Some(s3) => {
            let mid2 = cx.scratch(MID2, (s2.g.n * s2.plane_out() * 4) as u64)?;
            s2.y = mid2;
            s3.x = mid2;
            s3.y = y;
        }
    }
    let all: Vec<Stage> = [s1, s2].into_iter().chain(stages).collect();
    let col_bytes = all.iter().map(Stage::col_bytes).max().unwrap_or(0);
    let col = match col_bytes {
        0 => None,
        b => Some(cx.scratch(COL, b as u64)?),
    };
    let n = all[0].g.n;
    if n == 0 {
        cx.whole();
        return Ok(());
    }
    for r in cx.ranges(n) {
        cx.piece();
        for s in &all {
            run(&s.images(r.clone()), col, cx)?;
        }
    }
    Ok(())
}
