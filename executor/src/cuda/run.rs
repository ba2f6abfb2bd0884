//! Runs one op on the device: host tensors in (weights already resident), host tensors out.
//! Every path first checks what it needs (dtype, rank, geometry) and answers
//! [`Fail::Decline`] before touching the device when the op is not its case; the backend then
//! runs the CPU op, which also reports shape errors in its usual words.

use super::blas::{self, BatchStrides, RowMajor};
use super::launch::{ConvArgs, Launcher, PoolArgs};
use super::memory::{AllocError, Block, DevicePool, OverBudget};
use super::shapes::{self, Act, Dims6};
use crate::ops::elementwise::broadcast_shape;
use crate::ops::shape::ShapeOp;
use crate::ops::{Op, input, opt_input};
use crate::tensor::{DType, Data, Tensor, checked_numel, norm_axis, strides};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use std::collections::HashMap;
use std::sync::Arc;

/// Why an op did not run on the device.
#[derive(Debug)]
pub enum Fail {
    /// Not a case the CUDA path handles: run the CPU op.
    Decline,
    OverBudget(OverBudget),
    Device(String),
}

impl From<String> for Fail {
    fn from(s: String) -> Fail {
        Fail::Device(s)
    }
}
impl From<&str> for Fail {
    fn from(s: &str) -> Fail {
        Fail::Device(s.to_string())
    }
}
impl From<AllocError> for Fail {
    fn from(e: AllocError) -> Fail {
        match e {
            AllocError::OverBudget(o) => Fail::OverBudget(o),
            AllocError::Driver(d) => Fail::Device(d.to_string()),
        }
    }
}
impl From<cudarc::driver::DriverError> for Fail {
    fn from(e: cudarc::driver::DriverError) -> Fail {
        Fail::Device(e.to_string())
    }
}

pub type R<T> = Result<T, Fail>;

/// A constant uploaded once and kept on the device.
pub enum ResidentData {
    F32(CudaSlice<f32>),
    I64(CudaSlice<i64>),
}

pub struct Resident {
    /// Held so the tensor's address stays this constant's key for as long as it is cached.
    pub _keep: Arc<Tensor>,
    pub data: ResidentData,
    pub bytes: u64,
}

/// Key of a resident constant: the address of the `Tensor` inside its `Arc`.
pub fn key_of(t: &Tensor) -> usize {
    t as *const Tensor as usize
}

/// An f32 operand on the device: a resident weight or a temporary upload.
pub enum Arg<'w> {
    W(&'w CudaSlice<f32>),
    T(Block),
}

impl Arg<'_> {
    pub fn view(&self) -> CudaView<'_, f32> {
        match self {
            Arg::W(s) => s.as_view(),
            Arg::T(b) => b.view(),
        }
    }
}

/// What one op needs while it runs.
pub struct Dev<'a> {
    pub l: Launcher<'a>,
    pub blas: &'a CudaBlas,
    pub stream: &'a Arc<CudaStream>,
    pub pool: &'a mut DevicePool,
    pub weights: &'a HashMap<usize, Resident>,
}

fn f32_in<'t>(inputs: &[Option<&'t Tensor>], i: usize) -> R<&'t Tensor> {
    match input(inputs, i) {
        Ok(t) if t.dtype() == DType::F32 => Ok(t),
        _ => Err(Fail::Decline),
    }
}

fn opt_f32_in<'t>(inputs: &[Option<&'t Tensor>], i: usize) -> R<Option<&'t Tensor>> {
    match opt_input(inputs, i) {
        Some(t) if t.dtype() == DType::F32 => Ok(Some(t)),
        Some(_) => Err(Fail::Decline),
        None => Ok(None),
    }
}

fn i64_of(v: usize) -> i64 {
    v as i64
}

fn int(v: usize) -> R<i32> {
    shapes::int(v).ok_or(Fail::Decline)
}

fn dims(v: &[i64]) -> R<Dims6> {
    Dims6::new(v).ok_or(Fail::Decline)
}

fn udims(v: &[usize]) -> R<Dims6> {
    Dims6::from_usizes(v).ok_or(Fail::Decline)
}

impl<'a> Dev<'a> {
    pub fn alloc(&mut self, n: usize) -> R<Block> {
        Ok(self.pool.alloc(n)?)
    }

    pub fn upload_slice(&mut self, v: &[f32]) -> R<Block> {
        let mut b = self.alloc(v.len())?;
        if !v.is_empty() {
            self.stream.memcpy_htod(v, &mut b.view_mut())?;
        }
        Ok(b)
    }

    /// An f32 tensor on the device: resident when it is a registered constant.
    pub fn upload(&mut self, t: &Tensor) -> R<Arg<'a>> {
        let weights: &'a HashMap<usize, Resident> = self.weights;
        if let Some(Resident {
            data: ResidentData::F32(s),
            ..
        }) = weights.get(&key_of(t))
        {
            return Ok(Arg::W(s));
        }
        Ok(Arg::T(
            self.upload_slice(t.as_f32().map_err(|_| Fail::Decline)?)?,
        ))
    }

    pub fn release(&mut self, a: Arg<'_>) {
        if let Arg::T(b) = a {
            self.pool.free(b);
        }
    }

    pub fn release_opt(&mut self, a: Option<Arg<'_>>) {
        if let Some(a) = a {
            self.release(a);
        }
    }

    /// Copies a block back into a host tensor of `shape` and returns the block to the pool.
    pub fn download(&mut self, b: Block, shape: Vec<usize>) -> R<Tensor> {
        let mut v = vec![0.0f32; b.len];
        if !v.is_empty() {
            self.stream.memcpy_dtoh(&b.view(), &mut v)?;
        }
        self.stream.synchronize()?;
        self.pool.free(b);
        Tensor::f32(shape, v).map_err(|e| Fail::Device(e.to_string()))
    }

    fn act_after(&self, y: &mut Block, n: usize, act: Act) -> R<()> {
        if let Act::Unary(code, a, b) = act {
            self.l
                .ew_unary_inplace(&mut y.view_mut(), i64_of(n), code, a, b)?;
        }
        Ok(())
    }
}

/// The epilogue (code, alpha, beta) of an activation, none for a separate unary pass.
fn epi(act: Act) -> (i32, f32, f32) {
    match act {
        Act::Epilogue(c, a, b) => (c, a, b),
        Act::Unary(..) => (0, 0.0, 0.0),
    }
}

/// Runs `op` on the device.
pub fn run_op(d: &mut Dev<'_>, op: &Op, inputs: &[Option<&Tensor>]) -> R<Vec<Tensor>> {
    let one = |t: R<Tensor>| t.map(|t| vec![t]);
    match op {
        Op::Unary(u) => {
            let (code, a, b) = shapes::unary_code(*u).ok_or(Fail::Decline)?;
            one(unary(d, f32_in(inputs, 0)?, code, a, b))
        }
        Op::Clip { min, max } => {
            let x = f32_in(inputs, 0)?;
            let scalar =
                |i: usize| opt_input(inputs, i).and_then(|t| t.to_f64_vec().first().copied());
            let lo = scalar(1)
                .map(|v| v as f32)
                .or(*min)
                .unwrap_or(f32::NEG_INFINITY);
            let hi = scalar(2)
                .map(|v| v as f32)
                .or(*max)
                .unwrap_or(f32::INFINITY);
            one(unary(d, x, shapes::UNARY_CLIP, lo, hi))
        }
        Op::Binary(b) => {
            let code = shapes::binary_code(*b).ok_or(Fail::Decline)?;
            one(binary(d, f32_in(inputs, 0)?, f32_in(inputs, 1)?, code))
        }
        Op::Conv(c) => one(conv(d, c, inputs)),
        Op::PointwiseDepthwise(f) => {
            // The CPU's fusion keeps the expanded tensor in cache; here the convolutions run
            // one after the other.
            let mid = conv(d, &f.pointwise, &inputs[..inputs.len().min(3)])?;
            let rest = [Some(&mid), opt_input(inputs, 3), opt_input(inputs, 4)];
            let y = conv(d, &f.depthwise, &rest)?;
            match &f.project {
                None => one(Ok(y)),
                Some(p) => {
                    let at = |i| opt_input(inputs, i);
                    one(conv(d, p, &[Some(&y), at(5), at(6), at(7)]))
                }
            }
        }
        Op::BatchNorm { eps } => one(batch_norm(d, inputs, *eps)),
        Op::Gemm(g) => one(gemm(d, g, inputs)),
        Op::MatMul { act } => one(matmul(d, inputs, *act)),
        Op::Pool(p) => one(pool(d, p, f32_in(inputs, 0)?)),
        Op::GlobalPool { max } => one(global_pool(d, f32_in(inputs, 0)?, *max)),
        Op::Softmax { axis, log, legacy } => {
            one(softmax(d, f32_in(inputs, 0)?, *axis, *log, *legacy))
        }
        // The kernel writes only the normalised output.
        Op::LayerNorm {
            axis,
            eps,
            stats: false,
        } => one(layer_norm(d, inputs, *axis, *eps)),
        Op::Reduce(r) => {
            let x = f32_in(inputs, 0)?;
            let axes = match (&r.axes, opt_input(inputs, 1)) {
                (Some(a), _) => a.clone(),
                (None, Some(t)) => t.to_i64_vec().map_err(|_| Fail::Decline)?,
                (None, None) => vec![],
            };
            if axes.is_empty() && r.noop_with_empty_axes {
                return Err(Fail::Decline);
            }
            let p = shapes::reduce_plan(&x.shape, &axes, r.keepdims).ok_or(Fail::Decline)?;
            one(reduce(d, x, &p, shapes::reduce_code(r.kind)))
        }
        Op::Shape(ShapeOp::Transpose { perm }) => {
            one(transpose(d, f32_in(inputs, 0)?, perm.as_deref()))
        }
        Op::Shape(ShapeOp::Concat { axis }) => one(concat(d, inputs, *axis)),
        Op::Shape(ShapeOp::Slice { attrs }) => one(slice(d, inputs, attrs.as_ref())),
        Op::Shape(ShapeOp::Gather { axis }) => one(gather(d, inputs, *axis)),
        Op::Shape(ShapeOp::Pad { mode, pads, value }) => {
            one(pad(d, inputs, mode, pads.as_deref(), *value))
        }
        _ => Err(Fail::Decline),
    }
}

fn unary(d: &mut Dev<'_>, x: &Tensor, code: i32, a: f32, b: f32) -> R<Tensor> {
    let n = x.len();
    let xin = d.upload(x)?;
    let mut y = d.alloc(n)?;
    d.l.ew_unary(&xin.view(), &mut y.view_mut(), i64_of(n), code, a, b)?;
    d.release(xin);
    d.download(y, x.shape.clone())
}

fn binary(d: &mut Dev<'_>, a: &Tensor, b: &Tensor, code: i32) -> R<Tensor> {
    let out = broadcast_shape(&a.shape, &b.shape).map_err(|_| Fail::Decline)?;
    if out.len() > shapes::MAX_RANK {
        return Err(Fail::Decline);
    }
    let n = checked_numel(&out).map_err(|_| Fail::Decline)?;
    let (ain, bin) = (d.upload(a)?, d.upload(b)?);
    let mut y = d.alloc(n)?;
    if a.shape == b.shape {
        d.l.ew_binary(&ain.view(), &bin.view(), &mut y.view_mut(), i64_of(n), code)?;
    } else if b.len() == 1 && a.len() == n {
        let s = b.as_f32().map_err(|_| Fail::Decline)?[0];
        d.l.ew_scalar(&ain.view(), s, &mut y.view_mut(), i64_of(n), code, 0)?;
    } else if a.len() == 1 && b.len() == n {
        let s = a.as_f32().map_err(|_| Fail::Decline)?[0];
        d.l.ew_scalar(&bin.view(), s, &mut y.view_mut(), i64_of(n), code, 1)?;
    } else {
        let (sa, sb) = (
            shapes::broadcast_strides(&a.shape, &out),
            shapes::broadcast_strides(&b.shape, &out),
        );
        d.l.ew_binary_bcast(
            &ain.view(),
            &bin.view(),
            &mut y.view_mut(),
            i64_of(n),
            out.len() as i32,
            udims(&out)?,
            dims(&sa)?,
            dims(&sb)?,
            code,
        )?;
    }
    d.release(ain);
    d.release(bin);
    d.download(y, out)
}

/// Bytes of im2col scratch one convolution may use; larger batches are done in chunks.
const IM2COL_MAX_BYTES: usize = 256 << 20;

fn conv(d: &mut Dev<'_>, c: &crate::ops::conv::ConvAttrs, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let (x, w) = (f32_in(inputs, 0)?, f32_in(inputs, 1)?);
    let bias = opt_f32_in(inputs, 2)?;
    let g = shapes::conv_geometry(c, &x.shape, &w.shape).ok_or(Fail::Decline)?;
    if bias.is_some_and(|b| b.len() != g.m) {
        return Err(Fail::Decline);
    }
    // A fused residual Add of another shape (broadcast) is left to the CPU path.
    let residual = match opt_f32_in(inputs, 3)?.filter(|_| c.residual) {
        Some(r) if r.shape != g.out_shape => return Err(Fail::Decline),
        r => r,
    };
    let p = ConvArgs::from_geom(&g).ok_or(Fail::Decline)?;
    let act = shapes::act_code(c.act);
    // With a residual the kernels below skip the activation; the residual epilogue applies it.
    let kernel_act = if residual.is_some() {
        Act::Epilogue(0, 0.0, 0.0)
    } else {
        act
    };
    let n_out = checked_numel(&g.out_shape).map_err(|_| Fail::Decline)?;
    let plane_in = g.c * g.h * g.w;
    let plane_out = g.m * g.oh * g.ow;
    let kdim = (g.c / g.groups) * g.kh * g.kw;

    let xin = d.upload(x)?;
    let win = d.upload(w)?;
    let bin = match bias {
        Some(b) => Some(d.upload(b)?),
        None => None,
    };
    let mut y = d.alloc(n_out)?;
    if g.groups == 1 && n_out > 0 {
        let gemm = RowMajor {
            m: g.m,
            n: g.oh * g.ow,
            k: kdim,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
        };
        if g.is_pointwise() {
            // y[n] (M × HW) = W (M × C) · x[n] (C × HW), W shared across the batch.
            let s = BatchStrides {
                a: 0,
                b: i64_of(plane_in),
                c: i64_of(plane_out),
            };
            blas::sgemm_batched(
                d.blas,
                &gemm,
                g.n,
                s,
                &win.view(),
                &xin.view(),
                &mut y.view_mut(),
            )?;
        } else {
            let per_image = kdim * g.oh * g.ow;
            let chunk = (IM2COL_MAX_BYTES / (per_image * 4).max(1)).clamp(1, g.n);
            let mut col = d.alloc(chunk * per_image)?;
            let mut n0 = 0;
            while n0 < g.n {
                let nb = chunk.min(g.n - n0);
                let xv = xin.view();
                let xs = xv.slice(n0 * plane_in..(n0 + nb) * plane_in);
                let pc = ConvArgs { n: int(nb)?, ..p };
                let mut colv = col.slice.slice_mut(0..nb * per_image);
                d.l.im2col(&xs, &mut colv, &pc)?;
                let s = BatchStrides {
                    a: 0,
                    b: i64_of(per_image),
                    c: i64_of(plane_out),
                };
                let mut ys = y.slice.slice_mut(n0 * plane_out..(n0 + nb) * plane_out);
                blas::sgemm_batched(d.blas, &gemm, nb, s, &win.view(), &colv, &mut ys)?;
                n0 += nb;
            }
            d.pool.free(col);
        }
        let (code, a, b) = epi(kernel_act);
        let bias_view = bin.as_ref().map(|b| b.view());
        if bias_view.is_some() || code != 0 {
            d.l.epilogue_bias_act(
                &mut y.view_mut(),
                bias_view.as_ref(),
                i64_of(n_out),
                int(g.m)?,
                i64_of(g.oh * g.ow),
                code,
                a,
                b,
            )?;
        }
    } else if g.is_depthwise() {
        let bias_view = bin.as_ref().map(|b| b.view());
        d.l.depthwise_conv2d(
            &xin.view(),
            &win.view(),
            bias_view.as_ref(),
            &mut y.view_mut(),
            &p,
            epi(kernel_act),
        )?;
    } else {
        let bias_view = bin.as_ref().map(|b| b.view());
        d.l.conv2d_direct(
            &xin.view(),
            &win.view(),
            bias_view.as_ref(),
            &mut y.view_mut(),
            &p,
            int(g.groups)?,
            epi(kernel_act),
        )?;
    }
    if let Some(r) = residual {
        let rin = d.upload(r)?;
        let (code, a, b) = epi(act);
        d.l.epilogue_bias_residual_act(
            &mut y.view_mut(),
            None,
            &rin.view(),
            i64_of(n_out),
            int(g.m)?,
            i64_of(g.oh * g.ow),
            code,
            a,
            b,
        )?;
        d.release(rin);
    }
    d.act_after(&mut y, n_out, act)?;
    d.release(xin);
    d.release(win);
    d.release_opt(bin);
    d.download(y, g.out_shape)
}

fn batch_norm(d: &mut Dev<'_>, inputs: &[Option<&Tensor>], eps: f32) -> R<Tensor> {
    let x = f32_in(inputs, 0)?;
    if x.rank() < 2 {
        return Err(Fail::Decline);
    }
    let ch = x.shape[1];
    let mut p = Vec::with_capacity(4);
    for i in 1..5 {
        let t = f32_in(inputs, i)?;
        if t.len() != ch {
            return Err(Fail::Decline);
        }
        p.push(t.as_f32().map_err(|_| Fail::Decline)?);
    }
    let (gamma, beta, mean, var) = (p[0], p[1], p[2], p[3]);
    // The CPU's formula: (x - mean) / sqrt(var + eps) * gamma + beta, as scale and shift.
    let scale: Vec<f32> = (0..ch).map(|c| gamma[c] / (var[c] + eps).sqrt()).collect();
    let shift: Vec<f32> = (0..ch).map(|c| beta[c] - mean[c] * scale[c]).collect();
    let inner: usize = x.shape[2..].iter().product();
    let n = x.len();
    let mut y = d.upload_slice(x.as_f32().map_err(|_| Fail::Decline)?)?;
    let (sc, sh) = (d.upload_slice(&scale)?, d.upload_slice(&shift)?);
    d.l.epilogue_scale_shift_act(
        &mut y.view_mut(),
        Some(&sc.view()),
        Some(&sh.view()),
        i64_of(n),
        int(ch)?,
        i64_of(inner),
        0,
        0.0,
        0.0,
    )?;
    d.pool.free(sc);
    d.pool.free(sh);
    d.download(y, x.shape.clone())
}

fn gemm(
    d: &mut Dev<'_>,
    g: &crate::ops::matmul::GemmAttrs,
    inputs: &[Option<&Tensor>],
) -> R<Tensor> {
    let (a, b) = (f32_in(inputs, 0)?, f32_in(inputs, 1)?);
    let c = opt_f32_in(inputs, 2)?;
    if a.rank() != 2 || b.rank() != 2 {
        return Err(Fail::Decline);
    }
    let (m, k) = if g.trans_a {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (kb, n) = if g.trans_b {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != kb || k == 0 {
        return Err(Fail::Decline);
    }
    // How C enters: a full [m, n] matrix (cuBLAS beta), or a bias per column / per row.
    enum Bias {
        None,
        Full,
        Cols(Vec<f32>),
        Rows(Vec<f32>),
    }
    let bias = match c {
        Some(c) if g.beta != 0.0 => {
            if broadcast_shape(&c.shape, &[m, n]).ok().as_deref() != Some(&[m, n][..]) {
                return Err(Fail::Decline);
            }
            let cv = c.as_f32().map_err(|_| Fail::Decline)?;
            let scaled = |v: &[f32]| v.iter().map(|x| x * g.beta).collect::<Vec<f32>>();
            let rows_of_one = c.rank() == 2 && c.shape[1] == 1 && c.shape[0] == m;
            if c.len() == m * n && c.shape.iter().product::<usize>() == m * n && c.rank() == 2 {
                Bias::Full
            } else if c.len() == 1 {
                Bias::Cols(vec![cv[0] * g.beta; n])
            } else if c.len() == n && !rows_of_one {
                Bias::Cols(scaled(cv))
            } else if rows_of_one {
                Bias::Rows(scaled(cv))
            } else {
                return Err(Fail::Decline);
            }
        }
        _ => Bias::None,
    };
    let act = shapes::act_code(g.act);
    let (ain, bin) = (d.upload(a)?, d.upload(b)?);
    let mut y = match (&bias, c) {
        (Bias::Full, Some(c)) => d.upload_slice(c.as_f32().map_err(|_| Fail::Decline)?)?,
        _ => d.alloc(m * n)?,
    };
    let p = RowMajor {
        m,
        n,
        k,
        trans_a: g.trans_a,
        trans_b: g.trans_b,
        alpha: g.alpha,
        beta: if matches!(bias, Bias::Full) {
            g.beta
        } else {
            0.0
        },
    };
    blas::sgemm(d.blas, &p, &ain.view(), &bin.view(), &mut y.view_mut())?;
    let (code, al, be) = epi(act);
    let vec_bias = match &bias {
        Bias::Cols(v) => Some((d.upload_slice(v)?, n, 1)),
        Bias::Rows(v) => Some((d.upload_slice(v)?, m, n)),
        _ => None,
    };
    if vec_bias.is_some() || code != 0 {
        let (bv, channels, inner) = match &vec_bias {
            Some((blk, ch, inner)) => (Some(blk.view()), *ch, *inner),
            None => (None, n.max(1), 1),
        };
        d.l.epilogue_bias_act(
            &mut y.view_mut(),
            bv.as_ref(),
            i64_of(m * n),
            int(channels)?,
            i64_of(inner),
            code,
            al,
            be,
        )?;
    }
    if let Some((blk, _, _)) = vec_bias {
        d.pool.free(blk);
    }
    d.act_after(&mut y, m * n, act)?;
    d.release(ain);
    d.release(bin);
    d.download(y, vec![m, n])
}

fn matmul(
    d: &mut Dev<'_>,
    inputs: &[Option<&Tensor>],
    act: Option<crate::ops::Activation>,
) -> R<Tensor> {
    let (a, b) = (f32_in(inputs, 0)?, f32_in(inputs, 1)?);
    let bias = opt_f32_in(inputs, 2)?;
    if a.rank() < 2 || b.rank() < 2 {
        return Err(Fail::Decline);
    }
    let (m, k) = (a.shape[a.rank() - 2], a.shape[a.rank() - 1]);
    let (kb, n) = (b.shape[b.rank() - 2], b.shape[b.rank() - 1]);
    if k != kb || k == 0 || bias.is_some_and(|t| t.len() != n) {
        return Err(Fail::Decline);
    }
    let (abatch, bbatch) = (&a.shape[..a.rank() - 2], &b.shape[..b.rank() - 2]);
    let batch = broadcast_shape(abatch, bbatch).map_err(|_| Fail::Decline)?;
    let nb: usize = batch.iter().product();
    let (na, nbb): (usize, usize) = (abatch.iter().product(), bbatch.iter().product());
    let mut shape = batch.clone();
    shape.extend([m, n]);
    let total = checked_numel(&shape).map_err(|_| Fail::Decline)?;
    // One tall product when B is shared; else strided batched, each side either the whole
    // batch or a single matrix repeated (stride 0).
    enum Plan {
        Tall,
        Batched(BatchStrides),
    }
    let plan = if nbb == 1 && abatch == batch.as_slice() {
        Plan::Tall
    } else {
        let side = |dims: &[usize], prod: usize, stride: usize| -> Option<i64> {
            if prod == 1 {
                Some(0)
            } else if dims == batch.as_slice() {
                Some(i64_of(stride))
            } else {
                None
            }
        };
        match (side(abatch, na, m * k), side(bbatch, nbb, k * n)) {
            (Some(sa), Some(sb)) => Plan::Batched(BatchStrides {
                a: sa,
                b: sb,
                c: i64_of(m * n),
            }),
            _ => return Err(Fail::Decline),
        }
    };
    let shaped = shapes::act_code(act);
    let (ain, bin) = (d.upload(a)?, d.upload(b)?);
    let mut y = d.alloc(total)?;
    if total > 0 {
        match plan {
            Plan::Tall => {
                let p = RowMajor {
                    m: nb * m,
                    n,
                    k,
                    trans_a: false,
                    trans_b: false,
                    alpha: 1.0,
                    beta: 0.0,
                };
                blas::sgemm(d.blas, &p, &ain.view(), &bin.view(), &mut y.view_mut())?;
            }
            Plan::Batched(s) => {
                let p = RowMajor {
                    m,
                    n,
                    k,
                    trans_a: false,
                    trans_b: false,
                    alpha: 1.0,
                    beta: 0.0,
                };
                blas::sgemm_batched(
                    d.blas,
                    &p,
                    nb,
                    s,
                    &ain.view(),
                    &bin.view(),
                    &mut y.view_mut(),
                )?;
            }
        }
    }
    let bin2 = match bias {
        Some(t) => Some(d.upload(t)?),
        None => None,
    };
    let (code, al, be) = epi(shaped);
    if bin2.is_some() || code != 0 {
        let bv = bin2.as_ref().map(|b| b.view());
        d.l.epilogue_bias_act(
            &mut y.view_mut(),
            bv.as_ref(),
            i64_of(total),
            int(n.max(1))?,
            1,
            code,
            al,
            be,
        )?;
    }
    d.act_after(&mut y, total, shaped)?;
    d.release(ain);
    d.release(bin);
    d.release_opt(bin2);
    d.download(y, shape)
}

fn pool(d: &mut Dev<'_>, p: &crate::ops::pool::PoolAttrs, x: &Tensor) -> R<Tensor> {
    let g = shapes::pool_geometry(p, &x.shape).ok_or(Fail::Decline)?;
    let a = PoolArgs::from_geom(&g).ok_or(Fail::Decline)?;
    let n_out = checked_numel(&g.out_shape).map_err(|_| Fail::Decline)?;
    let xin = d.upload(x)?;
    let mut y = d.alloc(n_out)?;
    if p.max {
        d.l.maxpool2d(&xin.view(), &mut y.view_mut(), &a)?;
    } else {
        d.l.avgpool2d(
            &xin.view(),
            &mut y.view_mut(),
            &a,
            p.count_include_pad as i32,
        )?;
    }
    d.release(xin);
    d.download(y, g.out_shape)
}

fn global_pool(d: &mut Dev<'_>, x: &Tensor, max: bool) -> R<Tensor> {
    if x.rank() < 2 {
        return Err(Fail::Decline);
    }
    let nc = x.shape[0] * x.shape[1];
    let hw: usize = x.shape[2..].iter().product();
    if hw == 0 {
        return Err(Fail::Decline);
    }
    let mut shape = x.shape[..2].to_vec();
    shape.extend(std::iter::repeat_n(1, x.rank() - 2));
    let xin = d.upload(x)?;
    let mut y = d.alloc(nc)?;
    d.l.global_pool(&xin.view(), &mut y.view_mut(), i64_of(nc), i64_of(hw), max)?;
    d.release(xin);
    d.download(y, shape)
}

fn softmax(d: &mut Dev<'_>, x: &Tensor, axis: i64, log: bool, legacy: bool) -> R<Tensor> {
    let axis = norm_axis(axis, x.rank()).map_err(|_| Fail::Decline)?;
    let inner: usize = x.shape[axis + 1..].iter().product();
    if !(legacy || inner == 1) {
        return Err(Fail::Decline);
    }
    let cols: usize = x.shape[axis..].iter().product();
    if cols == 0 || x.is_empty() {
        return Err(Fail::Decline);
    }
    let rows = x.len() / cols;
    let xin = d.upload(x)?;
    let mut y = d.alloc(x.len())?;
    d.l.softmax(
        &xin.view(),
        &mut y.view_mut(),
        i64_of(rows),
        i64_of(cols),
        log,
    )?;
    d.release(xin);
    d.download(y, x.shape.clone())
}

/// Only the normalised output (the mean and inverse std-dev outputs are not produced: a model
/// that reads them fails with a missing value instead of wrong numbers).
fn layer_norm(d: &mut Dev<'_>, inputs: &[Option<&Tensor>], axis: i64, eps: f32) -> R<Tensor> {
    let x = f32_in(inputs, 0)?;
    let axis = norm_axis(axis, x.rank()).map_err(|_| Fail::Decline)?;
    let cols: usize = x.shape[axis..].iter().product();
    let gamma = f32_in(inputs, 1)?;
    let beta = opt_f32_in(inputs, 2)?;
    if cols == 0 || gamma.len() != cols || beta.is_some_and(|b| b.len() != cols) {
        return Err(Fail::Decline);
    }
    let rows = x.len() / cols;
    let xin = d.upload(x)?;
    let gin = d.upload(gamma)?;
    let bin = match beta {
        Some(b) => Some(d.upload(b)?),
        None => None,
    };
    let mut y = d.alloc(x.len())?;
    let bv = bin.as_ref().map(|b| b.view());
    d.l.layernorm(
        &xin.view(),
        Some(&gin.view()),
        bv.as_ref(),
        &mut y.view_mut(),
        i64_of(rows),
        i64_of(cols),
        eps,
    )?;
    d.release(xin);
    d.release(gin);
    d.release_opt(bin);
    d.download(y, x.shape.clone())
}

fn reduce(d: &mut Dev<'_>, x: &Tensor, p: &shapes::ReducePlan, code: i32) -> R<Tensor> {
    let xin = d.upload(x)?;
    let mut y = d.alloc(p.outer * p.inner)?;
    d.l.reduce(
        &xin.view(),
        &mut y.view_mut(),
        i64_of(p.outer),
        i64_of(p.axis_len),
        i64_of(p.inner),
        code,
    )?;
    d.release(xin);
    d.download(y, p.out_shape.clone())
}

fn contiguous(shape: &[usize]) -> Vec<i64> {
    strides(shape).iter().map(|&s| s as i64).collect()
}

fn transpose(d: &mut Dev<'_>, x: &Tensor, perm: Option<&[usize]>) -> R<Tensor> {
    let perm = shapes::transpose_perm(x.rank(), perm).ok_or(Fail::Decline)?;
    if x.rank() > shapes::MAX_RANK {
        return Err(Fail::Decline);
    }
    let out: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let n = x.len();
    let xin = d.upload(x)?;
    let mut y = d.alloc(n)?;
    match shapes::last_two_swap(&x.shape, &perm) {
        Some((batch, rows, cols)) if shapes::int(rows).is_some() && shapes::int(cols).is_some() => {
            d.l.transpose2d(
                &xin.view(),
                &mut y.view_mut(),
                i64_of(batch),
                int(rows)?,
                int(cols)?,
            )?;
        }
        _ => {
            d.l.strided_copy(
                &xin.view(),
                &mut y.view_mut(),
                i64_of(n),
                out.len() as i32,
                udims(&out)?,
                dims(&shapes::permuted_strides(&x.shape, &perm))?,
                0,
                dims(&contiguous(&out))?,
                0,
            )?;
        }
    }
    d.release(xin);
    d.download(y, out)
}

fn concat(d: &mut Dev<'_>, inputs: &[Option<&Tensor>], axis: i64) -> R<Tensor> {
    let ts: Vec<&Tensor> = inputs.iter().flatten().copied().collect();
    let first = *ts.first().ok_or(Fail::Decline)?;
    let r = first.rank();
    if r == 0 || r > shapes::MAX_RANK || ts.iter().any(|t| t.dtype() != DType::F32 || t.rank() != r)
    {
        return Err(Fail::Decline);
    }
    let axis = norm_axis(axis, r).map_err(|_| Fail::Decline)?;
    let mut out = first.shape.clone();
    out[axis] = 0;
    for t in &ts {
        for i in 0..r {
            if i != axis && t.shape[i] != first.shape[i] {
                return Err(Fail::Decline);
            }
        }
        out[axis] += t.shape[axis];
    }
    let n = checked_numel(&out).map_err(|_| Fail::Decline)?;
    let os = contiguous(&out);
    let mut y = d.alloc(n)?;
    let mut at = 0usize;
    for t in ts {
        if !t.is_empty() {
            let tin = d.upload(t)?;
            d.l.strided_copy(
                &tin.view(),
                &mut y.view_mut(),
                i64_of(t.len()),
                r as i32,
                udims(&t.shape)?,
                dims(&contiguous(&t.shape))?,
                0,
                dims(&os)?,
                i64_of(at) * os[axis],
            )?;
            d.release(tin);
        }
        at += t.shape[axis];
    }
    d.download(y, out)
}

fn slice(
    d: &mut Dev<'_>,
    inputs: &[Option<&Tensor>],
    attrs: Option<&crate::ops::shape::SliceAttrs>,
) -> R<Tensor> {
    let x = f32_in(inputs, 0)?;
    let ints = |i: usize| -> R<Option<Vec<i64>>> {
        opt_input(inputs, i)
            .map(|t| t.to_i64_vec().map_err(|_| Fail::Decline))
            .transpose()
    };
    let (starts, ends, axes, steps) = match attrs {
        Some((s, e, a)) => (s.clone(), e.clone(), a.clone(), None),
        None => (
            ints(1)?.ok_or(Fail::Decline)?,
            ints(2)?.ok_or(Fail::Decline)?,
            ints(3)?,
            ints(4)?,
        ),
    };
    if x.rank() == 0 || x.rank() > shapes::MAX_RANK {
        return Err(Fail::Decline);
    }
    let (out, start, step) =
        shapes::slice_plan(&x.shape, &starts, &ends, axes.as_deref(), steps.as_deref())
            .ok_or(Fail::Decline)?;
    let n = checked_numel(&out).map_err(|_| Fail::Decline)?;
    let xs = contiguous(&x.shape);
    let offset: i64 = start.iter().zip(&xs).map(|(a, b)| a * b).sum();
    let src_strides: Vec<i64> = step.iter().zip(&xs).map(|(a, b)| a * b).collect();
    let xin = d.upload(x)?;
    let mut y = d.alloc(n)?;
    d.l.strided_copy(
        &xin.view(),
        &mut y.view_mut(),
        i64_of(n),
        out.len() as i32,
        udims(&out)?,
        dims(&src_strides)?,
        offset,
        dims(&contiguous(&out))?,
        0,
    )?;
    d.release(xin);
    d.download(y, out)
}

fn gather(d: &mut Dev<'_>, inputs: &[Option<&Tensor>], axis: i64) -> R<Tensor> {
    let x = f32_in(inputs, 0)?;
    let ind = input(inputs, 1).map_err(|_| Fail::Decline)?;
    let axis = norm_axis(axis, x.rank()).map_err(|_| Fail::Decline)?;
    let len = x.shape[axis];
    // Indices are checked on the host: the kernel cannot raise, the CPU op reports the error.
    let ids = ind.to_i64_vec().map_err(|_| Fail::Decline)?;
    if ids.iter().any(|&i| i < -(len as i64) || i >= len as i64) {
        return Err(Fail::Decline);
    }
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let mut out = x.shape[..axis].to_vec();
    out.extend(&ind.shape);
    out.extend(&x.shape[axis + 1..]);
    let n = checked_numel(&out).map_err(|_| Fail::Decline)?;
    let xin = d.upload(x)?;
    let mut y = d.alloc(n)?;
    // Resident int64 indices (a constant) are used in place; others go up for this op.
    let resident = match d.weights.get(&key_of(ind)) {
        Some(Resident {
            data: ResidentData::I64(s),
            ..
        }) => Some(s),
        _ => None,
    };
    let idx_bytes = (ids.len() * 8) as u64;
    let temp = match resident {
        Some(_) => None,
        None => {
            d.pool
                .reserve_resident(idx_bytes)
                .map_err(Fail::OverBudget)?;
            match d.stream.clone_htod(&ids) {
                Ok(s) => Some(s),
                Err(e) => {
                    d.pool.release_resident(idx_bytes);
                    return Err(e.into());
                }
            }
        }
    };
    let idx_view = match (resident, &temp) {
        (Some(s), _) => s.as_view(),
        (None, Some(s)) => s.as_view(),
        (None, None) => unreachable!("either resident or uploaded"),
    };
    let res = d.l.gather_i64(
        &xin.view(),
        &idx_view,
        &mut y.view_mut(),
        i64_of(outer),
        i64_of(len),
        i64_of(ids.len()),
        i64_of(inner),
    );
    if temp.is_some() {
        // Stream-ordered free after the gather; only the accounting is immediate.
        drop(temp);
        d.pool.release_resident(idx_bytes);
    }
    res?;
    d.release(xin);
    d.download(y, out)
}

fn pad(
    d: &mut Dev<'_>,
    inputs: &[Option<&Tensor>],
    mode: &str,
    pads_attr: Option<&[i64]>,
    value_attr: f32,
) -> R<Tensor> {
    let x = f32_in(inputs, 0)?;
    let r = x.rank();
    if r == 0 || r > shapes::MAX_RANK || opt_input(inputs, 3).is_some() {
        return Err(Fail::Decline);
    }
    let pads = match pads_attr {
        Some(p) => p.to_vec(),
        None => input(inputs, 1)
            .and_then(|t| t.to_i64_vec())
            .map_err(|_| Fail::Decline)?,
    };
    if pads.len() != 2 * r {
        return Err(Fail::Decline);
    }
    let value = opt_input(inputs, 2)
        .filter(|t| !t.is_empty())
        .map_or(value_attr, |t| t.to_f64_vec()[0] as f32);
    let code = match mode {
        "constant" => 0,
        "reflect" => 1,
        "edge" => 2,
        "wrap" => 3,
        _ => return Err(Fail::Decline),
    };
    let mut out = Vec::with_capacity(r);
    for a in 0..r {
        let o = x.shape[a] as i64 + pads[a] + pads[a + r];
        if o < 0 {
            return Err(Fail::Decline);
        }
        out.push(o as usize);
    }
    let n = checked_numel(&out).map_err(|_| Fail::Decline)?;
    let xin = d.upload(x)?;
    let mut y = d.alloc(n)?;
    d.l.pad(
        &xin.view(),
        &mut y.view_mut(),
        i64_of(n),
        r as i32,
        udims(&out)?,
        udims(&x.shape)?,
        dims(&contiguous(&x.shape))?,
        dims(&pads[..r])?,
        code,
        value,
    )?;
    d.release(xin);
    d.download(y, out)
}

/// Uploads a constant to keep on the device (f32 data, or int64 for Gather indices).
pub fn make_resident(
    stream: &Arc<CudaStream>,
    pool: &mut DevicePool,
    t: &Arc<Tensor>,
) -> R<Option<Resident>> {
    let bytes = t.bytes() as u64;
    let upload = |pool: &mut DevicePool| -> R<ResidentData> {
        pool.reserve_resident(bytes).map_err(Fail::OverBudget)?;
        let r = match &t.data {
            Data::F32(v) => stream.clone_htod(v).map(ResidentData::F32),
            Data::I64(v) => stream.clone_htod(v).map(ResidentData::I64),
            _ => unreachable!("filtered below"),
        };
        r.map_err(|e| {
            pool.release_resident(bytes);
            Fail::Device(e.to_string())
        })
    };
    match t.data {
        Data::F32(_) | Data::I64(_) if !t.is_empty() => Ok(Some(Resident {
            _keep: t.clone(),
            data: upload(pool)?,
            bytes,
        })),
        _ => Ok(None),
    }
}
