//! One launcher per kernel of `kernels/cuda/*.cu`, with the argument order and types of the
//! kernel's header comment (`int` → i32, `long long` → i64, `float` → f32, pointers → device
//! views, NULL → [`NULL`]) and its launch shape. Nothing here checks shapes: callers pass views
//! at least as long as the kernel reads and writes.

use super::shapes::Dims6;
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// Threads per block of the 1-D grid-stride kernels and the row (block-reduction) kernels.
pub const BLOCK: u32 = 256;
/// Most blocks along x the launchers use (grid-stride loops cover the rest).
pub const MAX_GRID: u64 = 65_535;

/// A NULL device pointer for optional (`may be NULL`) kernel arguments.
pub static NULL: u64 = 0;

/// A 1-D grid-stride launch over `n` elements: min(ceil(n / 256), 65535) blocks of 256.
pub fn grid_1d(n: u64) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as u64).clamp(1, MAX_GRID) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block (of 256 threads, a multiple of 32) per row, blocks striding over rows.
pub fn grid_rows(rows: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.clamp(1, MAX_GRID) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// transpose2d_tiled_f32: blocks of (32, 8), grid (ceil(cols/32), ceil(rows/32), min(batch, 65535)).
pub fn grid_transpose(batch: u64, rows: u64, cols: u64) -> Option<LaunchConfig> {
    let gx = cols.div_ceil(32);
    let gy = rows.div_ceil(32);
    if gx > u32::MAX as u64 || gy > MAX_GRID {
        return None;
    }
    Some(LaunchConfig {
        grid_dim: (
            gx.max(1) as u32,
            gy.max(1) as u32,
            batch.clamp(1, MAX_GRID) as u32,
        ),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    })
}

pub type LResult = Result<(), String>;

type In<'a, 'b> = &'a CudaView<'b, f32>;
type Out<'a, 'b> = &'a mut CudaViewMut<'b, f32>;

/// The kernels of one context plus the stream they run on.
pub struct Launcher<'a> {
    pub stream: &'a std::sync::Arc<CudaStream>,
    pub kernels: &'a super::module::Loaded,
}

macro_rules! launch {
    ($self:ident, $name:literal, $cfg:expr, [$($arg:expr),* $(,)?]) => {{
        let f = $self.kernels.get($name)?;
        let mut b = $self.stream.launch_builder(f);
        $( b.arg($arg); )*
        // SAFETY: argument count, order and types follow the kernel's header comment; the
        // callers size every view for the elements the kernel touches.
        unsafe { b.launch($cfg) }.map(|_| ()).map_err(|e| format!("{}: {e}", $name))
    }};
}

/// An optional input: the view, or NULL.
macro_rules! opt {
    ($b:ident, $v:expr) => {
        match $v {
            Some(v) => $b.arg(v),
            None => $b.arg(&NULL),
        }
    };
}

impl Launcher<'_> {
    // ---- elementwise.cu ----

    pub fn ew_binary(&self, a: In, b: In, out: Out, n: i64, op: i32) -> LResult {
        if n == 0 {
            return Ok(());
        }
        launch!(
            self,
            "ew_binary_f32",
            grid_1d(n as u64),
            [a, b, out, &n, &op]
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn ew_binary_bcast(
        &self,
        a: In,
        b: In,
        out: Out,
        n: i64,
        rank: i32,
        shape: Dims6,
        a_strides: Dims6,
        b_strides: Dims6,
        op: i32,
    ) -> LResult {
        if n == 0 {
            return Ok(());
        }
        launch!(
            self,
            "ew_binary_bcast_f32",
            grid_1d(n as u64),
            [a, b, out, &n, &rank, &shape, &a_strides, &b_strides, &op]
        )
    }

    pub fn ew_scalar(&self, a: In, s: f32, out: Out, n: i64, op: i32, swap: i32) -> LResult {
        if n == 0 {
            return Ok(());
        }
        launch!(
            self,
            "ew_scalar_f32",
            grid_1d(n as u64),
            [a, &s, out, &n, &op, &swap]
        )
    }

    /// Out of place (in place goes through [`Launcher::ew_unary_inplace`]).
    pub fn ew_unary(&self, x: In, y: Out, n: i64, op: i32, alpha: f32, beta: f32) -> LResult {
        if n == 0 {
            return Ok(());
        }
        launch!(
            self,
            "ew_unary_f32",
            grid_1d(n as u64),
            [x, y, &n, &op, &alpha, &beta]
        )
    }

    /// y = op(y): the kernel allows x == y.
    pub fn ew_unary_inplace(&self, y: Out, n: i64, op: i32, alpha: f32, beta: f32) -> LResult {
        if n == 0 {
            return Ok(());
        }
        let f = self.kernels.get("ew_unary_f32")?;
        // The same pointer twice: a raw device address, recorded as a write on `y`.
        let (ptr, _record) = cudarc::driver::DevicePtrMut::device_ptr_mut(y, self.stream);
        let mut b = self.stream.launch_builder(f);
        b.arg(&ptr).arg(&ptr);
        b.arg(&n).arg(&op).arg(&alpha).arg(&beta);
        // SAFETY: ew_unary_f32(x, y, n, op, alpha, beta) with x == y, which it allows.
        unsafe { b.launch(grid_1d(n as u64)) }
            .map(|_| ())
            .map_err(|e| format!("ew_unary_f32: {e}"))
    }

    // ---- epilogue.cu (in place on y) ----

    #[allow(clippy::too_many_arguments)]
    pub fn epilogue_bias_act(
        &self,
        y: Out,
        bias: Option<In>,
        n: i64,
        channels: i32,
        inner: i64,
        act: i32,
        alpha: f32,
        beta: f32,
    ) -> LResult {
        if n == 0 {
            return Ok(());
        }
        let f = self.kernels.get("epilogue_bias_act_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(y);
        opt!(b, bias);
        b.arg(&n)
            .arg(&channels)
            .arg(&inner)
            .arg(&act)
            .arg(&alpha)
            .arg(&beta);
        // SAFETY: epilogue_bias_act_f32(y, bias, n, channels, inner, act, alpha, beta).
        unsafe { b.launch(grid_1d(n as u64)) }
            .map(|_| ())
            .map_err(|e| format!("epilogue_bias_act_f32: {e}"))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn epilogue_bias_residual_act(
        &self,
        y: Out,
        bias: Option<In>,
        residual: In,
        n: i64,
        channels: i32,
        inner: i64,
        act: i32,
        alpha: f32,
        beta: f32,
    ) -> LResult {
        if n == 0 {
            return Ok(());
        }
        let f = self.kernels.get("epilogue_bias_residual_act_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(y);
        opt!(b, bias);
        b.arg(residual);
        b.arg(&n)
            .arg(&channels)
            .arg(&inner)
            .arg(&act)
            .arg(&alpha)
            .arg(&beta);
        // SAFETY: epilogue_bias_residual_act_f32(y, bias, residual, n, channels, inner, act, alpha, beta).
        unsafe { b.launch(grid_1d(n as u64)) }
            .map(|_| ())
            .map_err(|e| format!("epilogue_bias_residual_act_f32: {e}"))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn epilogue_scale_shift_act(
        &self,
        y: Out,
        scale: Option<In>,
        shift: Option<In>,
        n: i64,
        channels: i32,
        inner: i64,
        act: i32,
        alpha: f32,
        beta: f32,
    ) -> LResult {
        if n == 0 {
            return Ok(());
        }
        let f = self.kernels.get("epilogue_scale_shift_act_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(y);
        opt!(b, scale);
        opt!(b, shift);
        b.arg(&n)
            .arg(&channels)
            .arg(&inner)
            .arg(&act)
            .arg(&alpha)
            .arg(&beta);
        // SAFETY: epilogue_scale_shift_act_f32(y, scale, shift, n, channels, inner, act, alpha, beta).
        unsafe { b.launch(grid_1d(n as u64)) }
            .map(|_| ())
            .map_err(|e| format!("epilogue_scale_shift_act_f32: {e}"))
    }

    // ---- conv.cu ----

    /// col is [N, C*KH*KW, OH*OW].
    pub fn im2col(&self, x: In, col: Out, p: &ConvArgs) -> LResult {
        let total = p.n as i64 * p.c as i64 * p.kh as i64 * p.kw as i64 * p.oh as i64 * p.ow as i64;
        if total == 0 {
            return Ok(());
        }
        launch!(
            self,
            "im2col_nchw_f32",
            grid_1d(total as u64),
            [
                x,
                col,
                &p.n,
                &p.c,
                &p.h,
                &p.w,
                &p.kh,
                &p.kw,
                &p.oh,
                &p.ow,
                &p.pad_h,
                &p.pad_w,
                &p.stride_h,
                &p.stride_w,
                &p.dil_h,
                &p.dil_w
            ]
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn conv2d_direct(
        &self,
        x: In,
        w: In,
        bias: Option<In>,
        y: Out,
        p: &ConvArgs,
        groups: i32,
        act: (i32, f32, f32),
    ) -> LResult {
        let total = p.n as i64 * p.m as i64 * p.oh as i64 * p.ow as i64;
        if total == 0 {
            return Ok(());
        }
        let f = self.kernels.get("conv2d_direct_nchw_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(w);
        opt!(b, bias);
        b.arg(y);
        b.arg(&p.n)
            .arg(&p.c)
            .arg(&p.h)
            .arg(&p.w)
            .arg(&p.m)
            .arg(&p.kh)
            .arg(&p.kw);
        b.arg(&p.oh)
            .arg(&p.ow)
            .arg(&p.pad_h)
            .arg(&p.pad_w)
            .arg(&p.stride_h)
            .arg(&p.stride_w);
        b.arg(&p.dil_h)
            .arg(&p.dil_w)
            .arg(&groups)
            .arg(&act.0)
            .arg(&act.1)
            .arg(&act.2);
        // SAFETY: conv2d_direct_nchw_f32(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, pad_h,
        // pad_w, stride_h, stride_w, dil_h, dil_w, groups, act, alpha, beta).
        unsafe { b.launch(grid_1d(total as u64)) }
            .map(|_| ())
            .map_err(|e| format!("conv2d_direct_nchw_f32: {e}"))
    }

    /// `p.m` = C * mult output channels.
    pub fn depthwise_conv2d(
        &self,
        x: In,
        w: In,
        bias: Option<In>,
        y: Out,
        p: &ConvArgs,
        act: (i32, f32, f32),
    ) -> LResult {
        let total = p.n as i64 * p.m as i64 * p.oh as i64 * p.ow as i64;
        if total == 0 {
            return Ok(());
        }
        let mult: i32 = p.m / p.c.max(1);
        let f = self.kernels.get("depthwise_conv2d_nchw_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(w);
        opt!(b, bias);
        b.arg(y);
        b.arg(&p.n)
            .arg(&p.c)
            .arg(&p.h)
            .arg(&p.w)
            .arg(&mult)
            .arg(&p.kh)
            .arg(&p.kw);
        b.arg(&p.oh)
            .arg(&p.ow)
            .arg(&p.pad_h)
            .arg(&p.pad_w)
            .arg(&p.stride_h)
            .arg(&p.stride_w);
        b.arg(&p.dil_h)
            .arg(&p.dil_w)
            .arg(&act.0)
            .arg(&act.1)
            .arg(&act.2);
        // SAFETY: depthwise_conv2d_nchw_f32(x, w, bias, y, N, C, H, W, mult, KH, KW, OH, OW,
        // pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, act, alpha, beta).
        unsafe { b.launch(grid_1d(total as u64)) }
            .map(|_| ())
            .map_err(|e| format!("depthwise_conv2d_nchw_f32: {e}"))
    }

    // ---- pool.cu ----

    pub fn maxpool2d(&self, x: In, y: Out, p: &PoolArgs) -> LResult {
        let total = p.nc * p.oh as i64 * p.ow as i64;
        if total == 0 {
            return Ok(());
        }
        launch!(
            self,
            "maxpool2d_nchw_f32",
            grid_1d(total as u64),
            [
                x,
                y,
                &p.nc,
                &p.h,
                &p.w,
                &p.oh,
                &p.ow,
                &p.kh,
                &p.kw,
                &p.stride_h,
                &p.stride_w,
                &p.pad_top,
                &p.pad_left,
                &p.dil_h,
                &p.dil_w
            ]
        )
    }

    pub fn avgpool2d(&self, x: In, y: Out, p: &PoolArgs, count_include_pad: i32) -> LResult {
        let total = p.nc * p.oh as i64 * p.ow as i64;
        if total == 0 {
            return Ok(());
        }
        launch!(
            self,
            "avgpool2d_nchw_f32",
            grid_1d(total as u64),
            [
                x,
                y,
                &p.nc,
                &p.h,
                &p.w,
                &p.oh,
                &p.ow,
                &p.kh,
                &p.kw,
                &p.stride_h,
                &p.stride_w,
                &p.pad_top,
                &p.pad_left,
                &p.pad_bottom,
                &p.pad_right,
                &p.dil_h,
                &p.dil_w,
                &count_include_pad
            ]
        )
    }

    pub fn global_pool(&self, x: In, y: Out, nc: i64, hw: i64, max: bool) -> LResult {
        if nc == 0 {
            return Ok(());
        }
        if max {
            launch!(
                self,
                "global_maxpool_nchw_f32",
                grid_rows(nc as u64),
                [x, y, &nc, &hw]
            )
        } else {
            launch!(
                self,
                "global_avgpool_nchw_f32",
                grid_rows(nc as u64),
                [x, y, &nc, &hw]
            )
        }
    }

    // ---- softmax.cu, layernorm.cu ----

    pub fn softmax(&self, x: In, y: Out, rows: i64, cols: i64, log: bool) -> LResult {
        if rows == 0 {
            return Ok(());
        }
        if log {
            launch!(
                self,
                "log_softmax_lastaxis_f32",
                grid_rows(rows as u64),
                [x, y, &rows, &cols]
            )
        } else {
            launch!(
                self,
                "softmax_lastaxis_f32",
                grid_rows(rows as u64),
                [x, y, &rows, &cols]
            )
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn layernorm(
        &self,
        x: In,
        gamma: Option<In>,
        beta: Option<In>,
        y: Out,
        rows: i64,
        cols: i64,
        eps: f32,
    ) -> LResult {
        if rows == 0 {
            return Ok(());
        }
        let f = self.kernels.get("layernorm_lastaxis_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x);
        opt!(b, gamma);
        opt!(b, beta);
        b.arg(y).arg(&rows).arg(&cols).arg(&eps);
        // SAFETY: layernorm_lastaxis_f32(x, gamma, beta, y, rows, cols, eps).
        unsafe { b.launch(grid_rows(rows as u64)) }
            .map(|_| ())
            .map_err(|e| format!("layernorm_lastaxis_f32: {e}"))
    }

    pub fn rmsnorm(
        &self,
        x: In,
        gamma: Option<In>,
        y: Out,
        rows: i64,
        cols: i64,
        eps: f32,
    ) -> LResult {
        if rows == 0 {
            return Ok(());
        }
        let f = self.kernels.get("rmsnorm_lastaxis_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x);
        opt!(b, gamma);
        b.arg(y).arg(&rows).arg(&cols).arg(&eps);
        // SAFETY: rmsnorm_lastaxis_f32(x, gamma, y, rows, cols, eps).
        unsafe { b.launch(grid_rows(rows as u64)) }
            .map(|_| ())
            .map_err(|e| format!("rmsnorm_lastaxis_f32: {e}"))
    }

    // ---- reduce.cu ----

    pub fn reduce(&self, x: In, y: Out, outer: i64, axis_len: i64, inner: i64, op: i32) -> LResult {
        if outer * inner == 0 {
            return Ok(());
        }
        if inner == 1 {
            launch!(
                self,
                "reduce_lastaxis_f32",
                grid_rows(outer as u64),
                [x, y, &outer, &axis_len, &op]
            )
        } else {
            launch!(
                self,
                "reduce_axis_f32",
                grid_1d((outer * inner) as u64),
                [x, y, &outer, &axis_len, &inner, &op]
            )
        }
    }

    // ---- copy.cu ----

    #[allow(clippy::too_many_arguments)]
    pub fn strided_copy(
        &self,
        src: In,
        dst: Out,
        n: i64,
        rank: i32,
        shape: Dims6,
        src_strides: Dims6,
        src_offset: i64,
        dst_strides: Dims6,
        dst_offset: i64,
    ) -> LResult {
        if n == 0 {
            return Ok(());
        }
        launch!(
            self,
            "strided_copy_f32",
            grid_1d(n as u64),
            [
                src,
                dst,
                &n,
                &rank,
                &shape,
                &src_strides,
                &src_offset,
                &dst_strides,
                &dst_offset
            ]
        )
    }

    pub fn transpose2d(&self, x: In, y: Out, batch: i64, rows: i32, cols: i32) -> LResult {
        if batch == 0 || rows == 0 || cols == 0 {
            return Ok(());
        }
        let cfg = grid_transpose(batch as u64, rows as u64, cols as u64)
            .ok_or("transpose2d_tiled_f32: too many rows for the grid")?;
        launch!(
            self,
            "transpose2d_tiled_f32",
            cfg,
            [x, y, &batch, &rows, &cols]
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn gather_i64(
        &self,
        x: In,
        idx: &CudaView<'_, i64>,
        y: Out,
        outer: i64,
        axis_len: i64,
        n_idx: i64,
        inner: i64,
    ) -> LResult {
        let total = outer * n_idx * inner;
        if total == 0 {
            return Ok(());
        }
        launch!(
            self,
            "gather_axis_i64_f32",
            grid_1d(total as u64),
            [x, idx, y, &outer, &axis_len, &n_idx, &inner]
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn gather_i32(
        &self,
        x: In,
        idx: &CudaView<'_, i32>,
        y: Out,
        outer: i64,
        axis_len: i64,
        n_idx: i64,
        inner: i64,
    ) -> LResult {
        let total = outer * n_idx * inner;
        if total == 0 {
            return Ok(());
        }
        launch!(
            self,
            "gather_axis_i32_f32",
            grid_1d(total as u64),
            [x, idx, y, &outer, &axis_len, &n_idx, &inner]
        )
    }

    pub fn fill(&self, y: Out, n: i64, value: f32) -> LResult {
        if n == 0 {
            return Ok(());
        }
        launch!(self, "fill_f32", grid_1d(n as u64), [y, &n, &value])
    }

    #[allow(clippy::too_many_arguments)]
    pub fn pad(
        &self,
        x: In,
        y: Out,
        n: i64,
        rank: i32,
        out_shape: Dims6,
        in_shape: Dims6,
        in_strides: Dims6,
        pads_begin: Dims6,
        mode: i32,
        value: f32,
    ) -> LResult {
        if n == 0 {
            return Ok(());
        }
        launch!(
            self,
            "pad_f32",
            grid_1d(n as u64),
            [
                x,
                y,
                &n,
                &rank,
                &out_shape,
                &in_shape,
                &in_strides,
                &pads_begin,
                &mode,
                &value
            ]
        )
    }
}

/// The `int` geometry of conv.cu's kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConvArgs {
    pub n: i32,
    pub c: i32,
    pub h: i32,
    pub w: i32,
    pub m: i32,
    pub kh: i32,
    pub kw: i32,
    pub oh: i32,
    pub ow: i32,
    pub pad_h: i32,
    pub pad_w: i32,
    pub stride_h: i32,
    pub stride_w: i32,
    pub dil_h: i32,
    pub dil_w: i32,
}

impl ConvArgs {
    pub fn from_geom(g: &super::shapes::ConvGeom) -> Option<ConvArgs> {
        use super::shapes::int;
        Some(ConvArgs {
            n: int(g.n)?,
            c: int(g.c)?,
            h: int(g.h)?,
            w: int(g.w)?,
            m: int(g.m)?,
            kh: int(g.kh)?,
            kw: int(g.kw)?,
            oh: int(g.oh)?,
            ow: int(g.ow)?,
            pad_h: int(g.pad[0])?,
            pad_w: int(g.pad[1])?,
            stride_h: int(g.stride[0])?,
            stride_w: int(g.stride[1])?,
            dil_h: int(g.dil[0])?,
            dil_w: int(g.dil[1])?,
        })
    }
}

/// The geometry of pool.cu's window kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolArgs {
    pub nc: i64,
    pub h: i32,
    pub w: i32,
    pub oh: i32,
    pub ow: i32,
    pub kh: i32,
    pub kw: i32,
    pub stride_h: i32,
    pub stride_w: i32,
    pub pad_top: i32,
    pub pad_left: i32,
    pub pad_bottom: i32,
    pub pad_right: i32,
    pub dil_h: i32,
    pub dil_w: i32,
}

impl PoolArgs {
    pub fn from_geom(g: &super::shapes::PoolGeom) -> Option<PoolArgs> {
        use super::shapes::int;
        Some(PoolArgs {
            nc: i64::try_from(g.planes).ok()?,
            h: int(g.h)?,
            w: int(g.w)?,
            oh: int(g.out[0])?,
            ow: int(g.out[1])?,
            kh: int(g.k[0])?,
            kw: int(g.k[1])?,
            stride_h: int(g.s[0])?,
            stride_w: int(g.s[1])?,
            pad_top: int(g.begin[0])?,
            pad_left: int(g.begin[1])?,
            pad_bottom: int(g.end[0])?,
            pad_right: int(g.end[1])?,
            dil_h: int(g.d[0])?,
            dil_w: int(g.d[1])?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_shapes_follow_the_headers() {
        let c = grid_1d(0);
        assert_eq!((c.grid_dim, c.block_dim), ((1, 1, 1), (256, 1, 1)));
        assert_eq!(grid_1d(257).grid_dim.0, 2);
        assert_eq!(grid_1d(1 << 40).grid_dim.0, 65_535);
        assert_eq!(grid_rows(10).grid_dim.0, 10);
        assert_eq!(grid_rows(1 << 20).grid_dim.0, 65_535);
        assert_eq!(grid_rows(10).block_dim.0 % 32, 0);
        let t = grid_transpose(3, 100, 33).unwrap();
        assert_eq!((t.grid_dim, t.block_dim), ((2, 4, 3), (32, 8, 1)));
        assert!(grid_transpose(1, 32 * 70_000, 1).is_none());
    }
}
