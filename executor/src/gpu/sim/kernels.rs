//! Every kernel of `kernels/cuda/*.cu` rendered on the CPU, reading its arguments exactly as the
//! `.cu` header comment lists them (count, order and types are checked, so a launcher that passes
//! them wrongly fails here) and touching exactly the memory the kernel would. The launch shape is
//! checked where the kernel's result depends on it (tiles that must cover the matrix, block
//! reductions that need whole warps); grid-stride kernels are correct for any grid.

use super::memory::{Memory, R};
use crate::gpu::api::{Arg, DevPtr, Dims6, Kernel, Launch};

/// The arguments of one launch, read in order.
struct Args<'a> {
    kernel: Kernel,
    args: &'a [Arg],
    next: usize,
}

impl Args<'_> {
    fn take(&mut self, want: &str) -> R<Arg> {
        let a = self.args.get(self.next).copied().ok_or_else(|| {
            format!(
                "{}: argument {} ({want}) is missing",
                self.kernel.name(),
                self.next
            )
        })?;
        self.next += 1;
        Ok(a)
    }
    fn wrong(&self, want: &str, got: Arg) -> String {
        format!(
            "{}: argument {} is {got:?}, expected {want}",
            self.kernel.name(),
            self.next - 1
        )
    }
    fn ptr(&mut self) -> R<DevPtr> {
        match self.take("pointer")? {
            Arg::Ptr(p) => Ok(p),
            a => Err(self.wrong("a pointer", a)),
        }
    }
    fn opt_ptr(&mut self) -> R<Option<DevPtr>> {
        match self.take("pointer or NULL")? {
            Arg::Ptr(p) => Ok(Some(p)),
            Arg::Null => Ok(None),
            a => Err(self.wrong("a pointer or NULL", a)),
        }
    }
    fn int(&mut self) -> R<i64> {
        match self.take("int")? {
            Arg::I32(v) => Ok(v as i64),
            a => Err(self.wrong("an int (i32)", a)),
        }
    }
    fn long(&mut self) -> R<i64> {
        match self.take("long long")? {
            Arg::I64(v) => Ok(v),
            a => Err(self.wrong("a long long (i64)", a)),
        }
    }
    fn float(&mut self) -> R<f32> {
        match self.take("float")? {
            Arg::F32(v) => Ok(v),
            a => Err(self.wrong("a float", a)),
        }
    }
    fn dims(&mut self) -> R<Dims6> {
        match self.take("Dims6")? {
            Arg::Dims(d) => Ok(d),
            a => Err(self.wrong("a Dims6", a)),
        }
    }
    fn done(&self) -> R<()> {
        if self.next == self.args.len() {
            Ok(())
        } else {
            Err(format!(
                "{}: {} arguments passed, the kernel takes {}",
                self.kernel.name(),
                self.args.len(),
                self.next
            ))
        }
    }
}

fn count(v: i64, what: &str) -> R<usize> {
    usize::try_from(v).map_err(|_| format!("{what} = {v} is negative"))
}

/// Checks a block-reduction launch: whole warps, at most 1024 threads, a 1-D block.
fn whole_warps(l: &Launch) -> R<()> {
    let (x, y, z) = l.block;
    if x == 0 || !x.is_multiple_of(32) || x > 1024 || y != 1 || z != 1 {
        return Err(format!(
            "{}: block {:?} must be (32·k, 1, 1) with at most 1024 threads",
            l.kernel.name(),
            l.block
        ));
    }
    Ok(())
}

/// Runs `l` on `mem`.
pub fn run(l: &Launch, mem: &mut Memory) -> R<()> {
    if l.blocks() == 0 || l.threads_per_block() == 0 {
        return Err(format!(
            "{}: empty launch {:?} x {:?}",
            l.kernel.name(),
            l.grid,
            l.block
        ));
    }
    let mut a = Args {
        kernel: l.kernel,
        args: &l.args,
        next: 0,
    };
    match l.kernel {
        Kernel::EwBinary => {
            let (pa, pb, py) = (a.ptr()?, a.ptr()?, a.ptr()?);
            let (n, op) = (count(a.long()?, "n")?, a.int()?);
            a.done()?;
            let y: Vec<f32> = {
                let (x0, x1) = (mem.slice::<f32>(pa, n)?, mem.slice::<f32>(pb, n)?);
                x0.iter().zip(x1).map(|(&u, &v)| binary(u, v, op)).collect()
            };
            mem.write(py, &y)
        }
        Kernel::EwBinaryBcast => {
            let (pa, pb, py) = (a.ptr()?, a.ptr()?, a.ptr()?);
            let (n, rank) = (count(a.long()?, "n")?, count(a.int()?, "rank")?);
            let (shape, sa, sb, op) = (a.dims()?, a.dims()?, a.dims()?, a.int()?);
            a.done()?;
            let shape = &shape.0[..rank.min(6)];
            let (ea, eb) = (extent(shape, &sa.0, 0)?, extent(shape, &sb.0, 0)?);
            let y: Vec<f32> = {
                let (x0, x1) = (mem.slice::<f32>(pa, ea)?, mem.slice::<f32>(pb, eb)?);
                (0..n)
                    .map(|i| {
                        let (oa, ob) = (offset(i, shape, &sa.0, 0), offset(i, shape, &sb.0, 0));
                        binary(x0[oa as usize], x1[ob as usize], op)
                    })
                    .collect()
            };
            mem.write(py, &y)
        }
        Kernel::EwScalar => {
            let (pa, s, py) = (a.ptr()?, a.float()?, a.ptr()?);
            let (n, op, swap) = (count(a.long()?, "n")?, a.int()?, a.int()?);
            a.done()?;
            let y: Vec<f32> = mem
                .slice::<f32>(pa, n)?
                .iter()
                .map(|&v| match swap {
                    0 => binary(v, s, op),
                    _ => binary(s, v, op),
                })
                .collect();
            mem.write(py, &y)
        }
        Kernel::EwUnary => {
            let (px, py) = (a.ptr()?, a.ptr()?);
            let (n, op, al, be) = (count(a.long()?, "n")?, a.int()?, a.float()?, a.float()?);
            a.done()?;
            let y: Vec<f32> = mem
                .slice::<f32>(px, n)?
                .iter()
                .map(|&v| unary(v, op, al, be))
                .collect();
            mem.write(py, &y)
        }
        Kernel::EpilogueBiasAct | Kernel::EpilogueBiasResidualAct => {
            let py = a.ptr()?;
            let bias = a.opt_ptr()?;
            let residual = match l.kernel {
                Kernel::EpilogueBiasResidualAct => Some(a.ptr()?),
                _ => None,
            };
            let n = count(a.long()?, "n")?;
            let (channels, inner) = (count(a.int()?, "channels")?, count(a.long()?, "inner")?);
            let (act, al, be) = (a.int()?, a.float()?, a.float()?);
            a.done()?;
            if channels == 0 || inner == 0 {
                return Err(format!(
                    "{}: channels and inner must be positive",
                    l.kernel.name()
                ));
            }
            let mut y = mem.read::<f32>(py, n)?;
            let b = bias.map(|p| mem.slice::<f32>(p, channels)).transpose()?;
            let r = residual.map(|p| mem.slice::<f32>(p, n)).transpose()?;
            for (i, v) in y.iter_mut().enumerate() {
                let mut t = *v;
                if let Some(b) = b {
                    t += b[(i / inner) % channels];
                }
                if let Some(r) = r {
                    t += r[i];
                }
                *v = activate(t, act, al, be);
            }
            mem.write(py, &y)
        }
        Kernel::EpilogueScaleShiftAct => {
            let (py, scale, shift) = (a.ptr()?, a.opt_ptr()?, a.opt_ptr()?);
            let n = count(a.long()?, "n")?;
            let (channels, inner) = (count(a.int()?, "channels")?, count(a.long()?, "inner")?);
            let (act, al, be) = (a.int()?, a.float()?, a.float()?);
            a.done()?;
            if channels == 0 || inner == 0 {
                return Err(
                    "epilogue_scale_shift_act_f32: channels and inner must be positive".into(),
                );
            }
            let mut y = mem.read::<f32>(py, n)?;
            let sc = scale.map(|p| mem.slice::<f32>(p, channels)).transpose()?;
            let sh = shift.map(|p| mem.slice::<f32>(p, channels)).transpose()?;
            for (i, v) in y.iter_mut().enumerate() {
                let c = (i / inner) % channels;
                let mut t = *v;
                if let Some(s) = sc {
                    t *= s[c];
                }
                if let Some(s) = sh {
                    t += s[c];
                }
                *v = activate(t, act, al, be);
            }
            mem.write(py, &y)
        }
        Kernel::Im2col => {
            let (px, pcol) = (a.ptr()?, a.ptr()?);
            let g = ConvDims::read(&mut a, false)?;
            a.done()?;
            let (kk, p) = (g.c * g.kh * g.kw, g.oh * g.ow);
            let col: Vec<f32> = {
                let x = mem.slice::<f32>(px, g.n * g.c * g.h * g.w)?;
                let mut col = vec![0.0f32; g.n * kk * p];
                for n in 0..g.n {
                    for row in 0..kk {
                        let (kw, kh, c) = (row % g.kw, (row / g.kw) % g.kh, row / (g.kw * g.kh));
                        for (pi, out) in col[(n * kk + row) * p..][..p].iter_mut().enumerate() {
                            let (oh, ow) = (pi / g.ow, pi % g.ow);
                            if let Some((ih, iw)) = g.tap(oh, ow, kh, kw) {
                                *out = x[((n * g.c + c) * g.h + ih) * g.w + iw];
                            }
                        }
                    }
                }
                col
            };
            mem.write(pcol, &col)
        }
        Kernel::Conv2dDirect | Kernel::DepthwiseConv2d => {
            let (px, pw, pb, py) = (a.ptr()?, a.ptr()?, a.opt_ptr()?, a.ptr()?);
            let depthwise = l.kernel == Kernel::DepthwiseConv2d;
            let g = ConvDims::read(&mut a, true)?;
            let groups = if depthwise {
                g.c
            } else {
                count(a.int()?, "groups")?
            };
            let (act, al, be) = (a.int()?, a.float()?, a.float()?);
            a.done()?;
            // For the depthwise kernel the "M" argument is the channel multiplier.
            let m = if depthwise { g.c * g.m } else { g.m };
            if groups == 0 || !g.c.is_multiple_of(groups) || !m.is_multiple_of(groups) {
                return Err(format!(
                    "{}: {groups} groups for C {} M {m}",
                    l.kernel.name(),
                    g.c
                ));
            }
            let (cg, mg) = (g.c / groups, m / groups);
            let y: Vec<f32> = {
                let x = mem.slice::<f32>(px, g.n * g.c * g.h * g.w)?;
                let w = mem.slice::<f32>(pw, m * cg * g.kh * g.kw)?;
                let b = pb.map(|p| mem.slice::<f32>(p, m)).transpose()?;
                let mut y = vec![0.0f32; g.n * m * g.oh * g.ow];
                for (i, out) in y.iter_mut().enumerate() {
                    let (ow, oh) = (i % g.ow, (i / g.ow) % g.oh);
                    let (mo, n) = ((i / (g.ow * g.oh)) % m, i / (g.ow * g.oh * m));
                    let grp = mo / mg;
                    let mut acc = b.map_or(0.0, |b| b[mo]);
                    for ci in 0..cg {
                        let c = grp * cg + ci;
                        for kh in 0..g.kh {
                            for kw in 0..g.kw {
                                if let Some((ih, iw)) = g.tap(oh, ow, kh, kw) {
                                    let xv = x[((n * g.c + c) * g.h + ih) * g.w + iw];
                                    let wv = w[((mo * cg + ci) * g.kh + kh) * g.kw + kw];
                                    acc = xv.mul_add(wv, acc);
                                }
                            }
                        }
                    }
                    *out = activate(acc, act, al, be);
                }
                y
            };
            mem.write(py, &y)
        }
        Kernel::MaxPool2d | Kernel::AvgPool2d => {
            let (px, py) = (a.ptr()?, a.ptr()?);
            let nc = count(a.long()?, "NC")?;
            let mut ints = [0usize; 9];
            for (k, v) in ints.iter_mut().enumerate() {
                *v = count(
                    a.int()?,
                    [
                        "H", "W", "OH", "OW", "KH", "KW", "stride_h", "stride_w", "pad_top",
                    ][k],
                )?;
            }
            let [h, w, oh, ow, kh, kw, sh, sw, pt] = ints;
            let pl = count(a.int()?, "pad_left")?;
            let avg = l.kernel == Kernel::AvgPool2d;
            let (pb, pr) = if avg {
                (
                    count(a.int()?, "pad_bottom")?,
                    count(a.int()?, "pad_right")?,
                )
            } else {
                (0, 0)
            };
            let (dh, dw) = (count(a.int()?, "dil_h")?, count(a.int()?, "dil_w")?);
            let include_pad = if avg { a.int()? != 0 } else { false };
            a.done()?;
            let y: Vec<f32> = {
                let x = mem.slice::<f32>(px, nc * h * w)?;
                let mut y = vec![0.0f32; nc * oh * ow];
                for (i, out) in y.iter_mut().enumerate() {
                    let (o_w, o_h, p) = (i % ow, (i / ow) % oh, i / (ow * oh));
                    let (h0, w0) = ((o_h * sh) as i64 - pt as i64, (o_w * sw) as i64 - pl as i64);
                    let (mut m, mut s) = (f32::NEG_INFINITY, 0.0f32);
                    let (mut rows_in, mut rows_pad, mut cols_in, mut cols_pad) = (0, 0, 0, 0);
                    for k in 0..kh {
                        let ih = h0 + (k * dh) as i64;
                        rows_pad += (ih >= -(pt as i64) && ih < (h + pb) as i64) as usize;
                        if ih < 0 || ih >= h as i64 {
                            continue;
                        }
                        rows_in += 1;
                        for j in 0..kw {
                            let iw = w0 + (j * dw) as i64;
                            if iw < 0 || iw >= w as i64 {
                                continue;
                            }
                            let v = x[(p * h + ih as usize) * w + iw as usize];
                            m = m.max(v);
                            s += v;
                        }
                    }
                    for j in 0..kw {
                        let iw = w0 + (j * dw) as i64;
                        cols_pad += (iw >= -(pl as i64) && iw < (w + pr) as i64) as usize;
                        cols_in += (iw >= 0 && iw < w as i64) as usize;
                    }
                    *out = if avg {
                        let div = if include_pad {
                            rows_pad * cols_pad
                        } else {
                            rows_in * cols_in
                        };
                        if div > 0 { s / div as f32 } else { 0.0 }
                    } else {
                        m
                    };
                }
                y
            };
            mem.write(py, &y)
        }
        Kernel::GlobalAvgPool | Kernel::GlobalMaxPool => {
            whole_warps(l)?;
            let (px, py) = (a.ptr()?, a.ptr()?);
            let (nc, hw) = (count(a.long()?, "NC")?, count(a.long()?, "HW")?);
            a.done()?;
            let max = l.kernel == Kernel::GlobalMaxPool;
            let y: Vec<f32> = mem
                .slice::<f32>(px, nc * hw)?
                .chunks(hw.max(1))
                .take(nc)
                .map(|p| match max {
                    true => p.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                    false => p.iter().sum::<f32>() / hw as f32,
                })
                .collect();
            mem.write(py, &y)
        }
        Kernel::Softmax | Kernel::LogSoftmax => {
            whole_warps(l)?;
            let (px, py) = (a.ptr()?, a.ptr()?);
            let (rows, cols) = (count(a.long()?, "rows")?, count(a.long()?, "cols")?);
            a.done()?;
            let log = l.kernel == Kernel::LogSoftmax;
            let mut y = mem.read::<f32>(px, rows * cols)?;
            for r in y.chunks_mut(cols.max(1)) {
                let m = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let s: f32 = r.iter().map(|v| (v - m).exp()).sum();
                for v in r.iter_mut() {
                    *v = if log {
                        *v - m - s.ln()
                    } else {
                        (*v - m).exp() * (1.0 / s)
                    };
                }
            }
            mem.write(py, &y)
        }
        Kernel::LayerNorm | Kernel::RmsNorm => {
            whole_warps(l)?;
            let px = a.ptr()?;
            let gamma = a.opt_ptr()?;
            let beta = match l.kernel {
                Kernel::LayerNorm => a.opt_ptr()?,
                _ => None,
            };
            let py = a.ptr()?;
            let (rows, cols, eps) = (
                count(a.long()?, "rows")?,
                count(a.long()?, "cols")?,
                a.float()?,
            );
            a.done()?;
            let rms = l.kernel == Kernel::RmsNorm;
            let mut y = mem.read::<f32>(px, rows * cols)?;
            let g = gamma.map(|p| mem.slice::<f32>(p, cols)).transpose()?;
            let b = beta.map(|p| mem.slice::<f32>(p, cols)).transpose()?;
            for r in y.chunks_mut(cols.max(1)) {
                let mean = if rms {
                    0.0
                } else {
                    r.iter().sum::<f32>() / cols as f32
                };
                let q: f32 = r.iter().map(|v| (v - mean) * (v - mean)).sum();
                let rstd = 1.0 / (q / cols as f32 + eps).sqrt();
                for (j, v) in r.iter_mut().enumerate() {
                    let mut t = (*v - mean) * rstd;
                    if let Some(g) = g {
                        t *= g[j];
                    }
                    if let Some(b) = b {
                        t += b[j];
                    }
                    *v = t;
                }
            }
            mem.write(py, &y)
        }
        Kernel::ReduceAxis | Kernel::ReduceLastAxis => {
            let (px, py) = (a.ptr()?, a.ptr()?);
            let (outer, axis, inner) = match l.kernel {
                Kernel::ReduceAxis => (
                    count(a.long()?, "outer")?,
                    count(a.long()?, "axis_len")?,
                    count(a.long()?, "inner")?,
                ),
                _ => {
                    whole_warps(l)?;
                    (count(a.long()?, "rows")?, count(a.long()?, "cols")?, 1)
                }
            };
            let op = a.int()?;
            a.done()?;
            let y: Vec<f32> = {
                let x = mem.slice::<f32>(px, outer * axis * inner)?;
                (0..outer * inner)
                    .map(|i| {
                        let (k, o) = (i % inner, i / inner);
                        let vals = (0..axis).map(|j| x[(o * axis + j) * inner + k]);
                        reduce(vals, axis, op)
                    })
                    .collect()
            };
            mem.write(py, &y)
        }
        Kernel::StridedCopy => {
            let (ps, pd) = (a.ptr()?, a.ptr()?);
            let (n, rank) = (count(a.long()?, "n")?, count(a.int()?, "rank")?);
            let (shape, ss, so) = (a.dims()?, a.dims()?, a.long()?);
            let (ds, doff) = (a.dims()?, a.long()?);
            a.done()?;
            let shape = &shape.0[..rank.min(6)];
            let (es, ed) = (extent(shape, &ss.0, so)?, extent(shape, &ds.0, doff)?);
            let src = mem.read::<f32>(ps, es)?;
            let dst = mem.slice_mut::<f32>(pd, ed)?;
            for i in 0..n {
                dst[offset(i, shape, &ds.0, doff) as usize] =
                    src[offset(i, shape, &ss.0, so) as usize];
            }
            Ok(())
        }
        Kernel::Transpose2d => {
            let (px, py) = (a.ptr()?, a.ptr()?);
            let batch = count(a.long()?, "batch")?;
            let (rows, cols) = (count(a.int()?, "rows")?, count(a.int()?, "cols")?);
            a.done()?;
            let (gx, gy, _) = l.grid;
            if l.block != (32, 8, 1) || (gx as usize) * 32 < cols || (gy as usize) * 32 < rows {
                return Err(format!(
                    "transpose2d_tiled_f32: grid {:?} block {:?} does not tile {rows}x{cols}",
                    l.grid, l.block
                ));
            }
            let x = mem.read::<f32>(px, batch * rows * cols)?;
            let y = mem.slice_mut::<f32>(py, batch * rows * cols)?;
            for b in 0..batch {
                for r in 0..rows {
                    for c in 0..cols {
                        y[b * rows * cols + c * rows + r] = x[b * rows * cols + r * cols + c];
                    }
                }
            }
            Ok(())
        }
        Kernel::GatherI64 | Kernel::GatherI32 => {
            let (px, pi, py) = (a.ptr()?, a.ptr()?, a.ptr()?);
            let outer = count(a.long()?, "outer")?;
            let (axis, n_idx, inner) = (
                count(a.long()?, "axis_len")?,
                count(a.long()?, "n_idx")?,
                count(a.long()?, "inner")?,
            );
            a.done()?;
            let idx: Vec<i64> = match l.kernel {
                Kernel::GatherI64 => mem.read::<i64>(pi, n_idx)?,
                _ => mem
                    .slice::<i32>(pi, n_idx)?
                    .iter()
                    .map(|&v| v as i64)
                    .collect(),
            };
            let y: Vec<f32> = {
                let x = mem.slice::<f32>(px, outer * axis * inner)?;
                (0..outer * n_idx * inner)
                    .map(|i| {
                        let (k, j, o) = (i % inner, (i / inner) % n_idx, i / (inner * n_idx));
                        let mut at = idx[j];
                        if at < 0 {
                            at += axis as i64;
                        }
                        match at >= 0 && (at as usize) < axis {
                            true => x[(o * axis + at as usize) * inner + k],
                            false => 0.0,
                        }
                    })
                    .collect()
            };
            mem.write(py, &y)
        }
        Kernel::Fill => {
            let py = a.ptr()?;
            let (n, v) = (count(a.long()?, "n")?, a.float()?);
            a.done()?;
            mem.slice_mut::<f32>(py, n)?.fill(v);
            Ok(())
        }
        Kernel::Pad => {
            let (px, py) = (a.ptr()?, a.ptr()?);
            let (n, rank) = (count(a.long()?, "n")?, count(a.int()?, "rank")?);
            let (out, ins, istr, pads) = (a.dims()?, a.dims()?, a.dims()?, a.dims()?);
            let (mode, value) = (a.int()?, a.float()?);
            a.done()?;
            let r = rank.min(6);
            let in_len = extent(
                &ins.0[..r].iter().map(|&d| d.max(1)).collect::<Vec<_>>(),
                &istr.0,
                0,
            )?;
            let empty = ins.0[..r].contains(&0);
            let x = if empty {
                Vec::new()
            } else {
                mem.read::<f32>(px, in_len)?
            };
            let y = mem.slice_mut::<f32>(py, n)?;
            for (i, v) in y.iter_mut().enumerate() {
                let (mut rem, mut off, mut inside) = (i as i64, 0i64, true);
                for d in (0..r).rev() {
                    let len = ins.0[d];
                    let mut k = rem % out.0[d] - pads.0[d];
                    rem /= out.0[d];
                    if k < 0 || k >= len {
                        if mode == 1 && len == 1 {
                            k = 0;
                        } else if mode == 1 && len > 1 {
                            let period = 2 * (len - 1);
                            k = k.rem_euclid(period);
                            if k >= len {
                                k = period - k;
                            }
                        } else if mode == 2 && len > 0 {
                            k = if k < 0 { 0 } else { len - 1 };
                        } else if mode == 3 && len > 0 {
                            k = k.rem_euclid(len);
                        } else {
                            inside = false;
                            k = 0;
                        }
                    }
                    off += k * istr.0[d];
                }
                *v = if inside && !empty {
                    x[off as usize]
                } else {
                    value
                };
            }
            Ok(())
        }
    }
}

/// Convolution sizes as conv.cu passes them, after the three (or four) pointers.
struct ConvDims {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    /// Output channels (conv2d_direct), the channel multiplier (depthwise), or 0 (im2col).
    m: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    pad: [usize; 2],
    stride: [usize; 2],
    dil: [usize; 2],
}

impl ConvDims {
    fn read(a: &mut Args<'_>, with_m: bool) -> R<ConvDims> {
        let mut int = |what| -> R<usize> { count(a.int()?, what) };
        let (n, c, h, w) = (int("N")?, int("C")?, int("H")?, int("W")?);
        let m = if with_m { int("M")? } else { 0 };
        let (kh, kw, oh, ow) = (int("KH")?, int("KW")?, int("OH")?, int("OW")?);
        let pad = [int("pad_h")?, int("pad_w")?];
        let stride = [int("stride_h")?, int("stride_w")?];
        let dil = [int("dil_h")?, int("dil_w")?];
        Ok(ConvDims {
            n,
            c,
            h,
            w,
            m,
            kh,
            kw,
            oh,
            ow,
            pad,
            stride,
            dil,
        })
    }

    /// The input pixel tap (kh, kw) of output pixel (oh, ow) reads, when inside the image.
    fn tap(&self, oh: usize, ow: usize, kh: usize, kw: usize) -> Option<(usize, usize)> {
        let ih = (oh * self.stride[0] + kh * self.dil[0]).checked_sub(self.pad[0])?;
        let iw = (ow * self.stride[1] + kw * self.dil[1]).checked_sub(self.pad[1])?;
        (ih < self.h && iw < self.w).then_some((ih, iw))
    }
}

/// The element offset of flat index `i` of `shape` under `strides` (in elements) from `base`.
fn offset(i: usize, shape: &[i64], strides: &[i64; 6], base: i64) -> i64 {
    let (mut rem, mut off) = (i as i64, base);
    for d in (0..shape.len()).rev() {
        let s = shape[d].max(1);
        off += (rem % s) * strides[d];
        rem /= s;
    }
    off
}

/// Elements from the pointer a strided walk over `shape` reaches (the largest offset + 1); an
/// error when it would reach before the pointer.
fn extent(shape: &[i64], strides: &[i64; 6], base: i64) -> R<usize> {
    if shape.iter().any(|&d| d <= 0) {
        return Ok(0);
    }
    let (mut lo, mut hi) = (base, base);
    for (d, &len) in shape.iter().enumerate() {
        let span = (len - 1) * strides[d];
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    if lo < 0 {
        return Err(format!(
            "a strided walk reaches {lo} elements before its pointer"
        ));
    }
    Ok(hi as usize + 1)
}

fn binary(a: f32, b: f32, op: i64) -> f32 {
    match op {
        0 => a + b,
        1 => a - b,
        2 => a * b,
        3 => a / b,
        4 => a.max(b),
        5 => a.min(b),
        6 => a.powf(b),
        7 => a % b,
        _ => f32::NAN,
    }
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

fn erf(x: f32) -> f32 {
    cotenant_kernels::activation::erf(x)
}

// fmaxf/fminf return the other operand for a NaN, as f32::max/min do; clamp would keep the NaN.
#[allow(clippy::manual_clamp)]
fn unary(x: f32, op: i64, alpha: f32, beta: f32) -> f32 {
    match op {
        0 => x,
        1 => x.max(0.0),
        2 => 1.0 / (1.0 + (-x).exp()),
        3 => x.tanh(),
        4 => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
        5 => {
            let k = 0.797_884_6_f32;
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
        6 => x.exp(),
        7 => x.ln(),
        8 => x.sqrt(),
        9 => 1.0 / x.sqrt(),
        10 => x.abs(),
        11 => -x,
        12 => 1.0 / x,
        13 => {
            if x >= 0.0 {
                x
            } else {
                alpha * x
            }
        }
        14 => {
            if x >= 0.0 {
                x
            } else {
                alpha * (x.exp() - 1.0)
            }
        }
        15 => x.max(alpha).min(beta),
        16 => (alpha * x + beta).max(0.0).min(1.0),
        17 => x * (x + 3.0).max(0.0).min(6.0) * (1.0 / 6.0),
        18 => softplus(x),
        19 => x / (1.0 + (-x).exp()),
        20 => erf(x),
        21 => x.sin(),
        22 => x.cos(),
        23 => x.floor(),
        24 => x.ceil(),
        25 => x.round_ties_even(),
        26 => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        27 => x.max(0.0).min(6.0),
        28 => beta * if x > 0.0 { x } else { alpha * (x.exp() - 1.0) },
        29 => x * softplus(x).tanh(),
        _ => f32::NAN,
    }
}

/// activation.cuh's switch.
#[allow(clippy::manual_clamp)]
fn activate(x: f32, act: i64, alpha: f32, beta: f32) -> f32 {
    match act {
        0 => x,
        1 => x.max(0.0),
        2 => x.max(0.0).min(6.0),
        3 => {
            if x >= 0.0 {
                x
            } else {
                alpha * x
            }
        }
        4 => 1.0 / (1.0 + (-x).exp()),
        5 => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
        6 => x / (1.0 + (-x).exp()),
        7 => x.tanh(),
        8 => x * (x + 3.0).max(0.0).min(6.0) * (1.0 / 6.0),
        9 => x.max(alpha).min(beta),
        _ => f32::NAN,
    }
}

/// reduce.cu's fold, combine and finish over one run of values.
fn reduce(vals: impl Iterator<Item = f32> + Clone, n: usize, op: i64) -> f32 {
    let init = match op {
        2 | 8 => f32::NEG_INFINITY,
        3 => f32::INFINITY,
        4 => 1.0,
        _ => 0.0,
    };
    let acc = vals.clone().fold(init, |acc, v| match op {
        2 | 8 => acc.max(v),
        3 => acc.min(v),
        4 => acc * v,
        5 | 7 => v.mul_add(v, acc),
        6 => acc + v.abs(),
        _ => acc + v,
    });
    match op {
        1 => acc / n as f32,
        7 => acc.sqrt(),
        8 if acc != f32::NEG_INFINITY => acc + vals.map(|v| (v - acc).exp()).sum::<f32>().ln(),
        _ => acc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::api::BufferId;

    fn launch(kernel: Kernel, args: Vec<Arg>) -> Launch {
        Launch {
            kernel,
            grid: (1, 1, 1),
            block: (256, 1, 1),
            shared_mem: 0,
            args,
        }
    }

    fn buffer(mem: &mut Memory, data: &[f32]) -> DevPtr {
        let p = DevPtr::new(mem.alloc((data.len() * 4) as u64).unwrap(), 0);
        mem.write(p, data).unwrap();
        p
    }

    #[test]
    fn arguments_are_checked_against_the_kernel_signature() {
        let mut mem = Memory::default();
        let x = buffer(&mut mem, &[1.0, -2.0]);
        let ok = launch(
            Kernel::EwUnary,
            vec![
                Arg::Ptr(x),
                Arg::Ptr(x),
                Arg::I64(2),
                Arg::I32(1),
                Arg::F32(0.0),
                Arg::F32(0.0),
            ],
        );
        run(&ok, &mut mem).unwrap();
        assert_eq!(mem.slice::<f32>(x, 2).unwrap(), &[1.0, 0.0]);
        // n as an int where the kernel takes a long long.
        let mut bad = ok.clone();
        bad.args[2] = Arg::I32(2);
        let e = run(&bad, &mut mem).unwrap_err();
        assert!(
            e.contains("ew_unary_f32: argument 2") && e.contains("long long"),
            "{e}"
        );
        let mut short = ok.clone();
        short.args.pop();
        assert!(run(&short, &mut mem).unwrap_err().contains("missing"));
        let mut long = ok;
        long.args.push(Arg::I32(0));
        assert!(run(&long, &mut mem).unwrap_err().contains("7 arguments"));
        // n beyond the buffer.
        let over = launch(
            Kernel::EwUnary,
            vec![
                Arg::Ptr(x),
                Arg::Ptr(x),
                Arg::I64(3),
                Arg::I32(1),
                Arg::F32(0.0),
                Arg::F32(0.0),
            ],
        );
        assert!(run(&over, &mut mem).unwrap_err().contains("past its end"));
        let stale = DevPtr::new(BufferId(99), 0);
        let e = run(
            &launch(
                Kernel::Fill,
                vec![Arg::Ptr(stale), Arg::I64(1), Arg::F32(0.0)],
            ),
            &mut mem,
        )
        .unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn reductions_need_whole_warps_and_tiles_must_cover() {
        let mut mem = Memory::default();
        let x = buffer(&mut mem, &[1.0; 64]);
        let mut l = launch(
            Kernel::Softmax,
            vec![Arg::Ptr(x), Arg::Ptr(x), Arg::I64(2), Arg::I64(32)],
        );
        run(&l, &mut mem).unwrap();
        l.block = (100, 1, 1);
        assert!(run(&l, &mut mem).unwrap_err().contains("32·k"));
        let y = buffer(&mut mem, &[0.0; 64]);
        let mut t = launch(
            Kernel::Transpose2d,
            vec![
                Arg::Ptr(x),
                Arg::Ptr(y),
                Arg::I64(1),
                Arg::I32(2),
                Arg::I32(32),
            ],
        );
        t.block = (32, 8, 1);
        run(&t, &mut mem).unwrap();
        t.args[4] = Arg::I32(33);
        t.args[3] = Arg::I32(1);
        let e = run(&t, &mut mem).unwrap_err();
        assert!(e.contains("does not tile"), "{e}");
    }
}
