//! Max and average pooling (1-D/2-D) and the global pools, NCHW. Pieces are ranges of the N·C
//! planes, which at batch 1 are channels.

use super::{Cx, Lowered, Operand, decline, f32_in};
use crate::gpu::api::Kernel;
use crate::gpu::launch::{Builder, grid_1d, grid_rows};
use crate::ops::pool::{PoolAttrs, pool2d_geometry};
use crate::tensor::DType;

/// The most taps a device pooling window walks when the input plane is smaller.
const WALKED_TAPS: usize = 1024;

pub fn pool(p: &PoolAttrs, ins: &[Option<Operand<'_>>], cx: &mut Cx<'_>) -> Lowered<()> {
    if p.nhwc {
        return decline("an NHWC max pool (the CPU's layout)");
    }
    let (x, px) = f32_in(ins, 0)?;
    let (g, shape) = pool2d_geometry(p, x.shape).map_err(|e| super::Decline(e.to_string()))?;
    let y = cx.output(0, DType::F32, shape)?;
    let (plane_in, plane_out) = (g.h * g.w, g.oh * g.ow);
    // The device kernels walk every tap of a window; the CPU's visit only those that read the
    // input, so a window mostly of padding (attributes only, no data behind them) runs there.
    if g.kh.saturating_mul(g.kw) > plane_in.max(WALKED_TAPS) {
        return decline("a pooling window of more taps than its input plane holds");
    }
    if g.planes * plane_out == 0 {
        cx.whole();
        return Ok(());
    }
    for r in cx.ranges(g.planes) {
        cx.piece();
        let kernel = if p.max {
            Kernel::MaxPool2d
        } else {
            Kernel::AvgPool2d
        };
        let mut b = Builder::new(kernel, grid_1d((r.len() * plane_out) as u64))
            .ptr(px.at(r.start * plane_in, 4))
            .ptr(y.at(r.start * plane_out, 4))
            .long(r.len())
            .int(g.h)
            .int(g.w)
            .int(g.oh)
            .int(g.ow)
            .int(g.kh)
            .int(g.kw)
            .int(g.sh)
            .int(g.sw)
            .int(g.pt)
            .int(g.pl);
        if !p.max {
            b = b.int(g.pb).int(g.pr);
        }
        b = b.int(g.dh).int(g.dw);
        if !p.max {
            b = b.code(p.count_include_pad as i32);
        }
        cx.launch(b.finish())?;
    }
    Ok(())
}

pub fn global(max: bool, ins: &[Option<Operand<'_>>], cx: &mut Cx<'_>) -> Lowered<()> {
    let (x, px) = f32_in(ins, 0)?;
    if x.rank() < 2 {
        return decline("global pooling of rank < 2");
    }
    let nc = x.shape[0] * x.shape[1];
    let hw: usize = x.shape[2..].iter().product();
    if hw == 0 {
        return decline("global pooling of an empty plane");
    }
    let mut shape = x.shape[..2].to_vec();
    shape.extend(std::iter::repeat_n(1, x.rank() - 2));
    let y = cx.output(0, DType::F32, shape)?;
    if nc == 0 {
        cx.whole();
        return Ok(());
    }
    let kernel = if max {
        Kernel::GlobalMaxPool
    } else {
        Kernel::GlobalAvgPool
    };
    for r in cx.ranges(nc) {
        cx.piece();
        cx.launch(
            Builder::new(kernel, grid_rows(r.len() as u64))
                .ptr(px.at(r.start * hw, 4))
                .ptr(y.at(r.start, 4))
                .long(r.len())
                .long(hw)
                .finish(),
        )?;
    }
    Ok(())
}
