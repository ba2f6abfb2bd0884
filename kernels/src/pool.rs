//! 2-D max and average pooling (NCHW, f32), one output plane per task.

use rayon::prelude::*;

/// Geometry of one 2-D pooling; the caller computes `oh`/`ow` (ceil mode included).
#[derive(Clone, Debug, Default)]
pub struct Pool2d {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    pub pt: usize,
    pub pl: usize,
    pub pb: usize,
    pub pr: usize,
    pub oh: usize,
    pub ow: usize,
}

fn for_planes(
    p: &Pool2d,
    input: &[f32],
    out: &mut [f32],
    threads: usize,
    f: impl Fn(&[f32], &mut [f32]) + Sync,
) {
    assert_eq!(input.len(), p.planes * p.h * p.w, "pool input size");
    assert_eq!(out.len(), p.planes * p.oh * p.ow, "pool output size");
    let (ip, op) = (p.h * p.w, p.oh * p.ow);
    if op == 0 {
        return;
    }
    if threads > 1 && input.len() >= crate::PAR_MIN_WORK {
        out.par_chunks_mut(op)
            .enumerate()
            .for_each(|(i, o)| f(&input[i * ip..(i + 1) * ip], o));
    } else {
        out.chunks_mut(op)
            .enumerate()
            .for_each(|(i, o)| f(&input[i * ip..(i + 1) * ip], o));
    }
}

pub fn max_pool2d(p: &Pool2d, input: &[f32], out: &mut [f32], threads: usize) {
    for_planes(p, input, out, threads, |x, o| {
        for oy in 0..p.oh {
            for ox in 0..p.ow {
                let mut m = f32::NEG_INFINITY;
                for ki in 0..p.kh {
                    let iy = (oy * p.sh + ki * p.dh) as isize - p.pt as isize;
                    if iy < 0 || iy as usize >= p.h {
                        continue;
                    }
                    for kj in 0..p.kw {
                        let ix = (ox * p.sw + kj * p.dw) as isize - p.pl as isize;
                        if ix >= 0 && (ix as usize) < p.w {
                            let v = x[iy as usize * p.w + ix as usize];
                            // NaN propagates like the reference implementations.
                            if v > m || v.is_nan() {
                                m = v;
                            }
                        }
                    }
                }
                o[oy * p.ow + ox] = m;
            }
        }
    });
}

/// Average pooling; with `count_include_pad` the divisor counts padding inside the padded
/// input, but never the extra cells that ceil mode adds past it (as onnxruntime does).
pub fn avg_pool2d(
    p: &Pool2d,
    input: &[f32],
    out: &mut [f32],
    count_include_pad: bool,
    threads: usize,
) {
    for_planes(p, input, out, threads, |x, o| {
        for oy in 0..p.oh {
            let y0 = (oy * p.sh) as isize - p.pt as isize;
            let y1 = (y0 + ((p.kh - 1) * p.dh + 1) as isize).min((p.h + p.pb) as isize);
            for ox in 0..p.ow {
                let x0 = (ox * p.sw) as isize - p.pl as isize;
                let x1 = (x0 + ((p.kw - 1) * p.dw + 1) as isize).min((p.w + p.pr) as isize);
                let mut s = 0.0f32;
                let mut cnt = 0usize;
                let mut padded = 0usize;
                let mut iy = y0;
                while iy < y1 {
                    let mut ix = x0;
                    while ix < x1 {
                        padded += 1;
                        if iy >= 0 && ix >= 0 && (iy as usize) < p.h && (ix as usize) < p.w {
                            s += x[iy as usize * p.w + ix as usize];
                            cnt += 1;
                        }
                        ix += p.dw as isize;
                    }
                    iy += p.dh as isize;
                }
                let div = if count_include_pad { padded } else { cnt };
                o[oy * p.ow + ox] = if div == 0 { 0.0 } else { s / div as f32 };
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_and_avg_on_a_small_plane() {
        let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let p = Pool2d {
            planes: 1,
            h: 4,
            w: 4,
            kh: 2,
            kw: 2,
            sh: 2,
            sw: 2,
            dh: 1,
            dw: 1,
            oh: 2,
            ow: 2,
            ..Default::default()
        };
        let mut o = vec![0.0; 4];
        max_pool2d(&p, &x, &mut o, 1);
        assert_eq!(o, vec![5.0, 7.0, 13.0, 15.0]);
        avg_pool2d(&p, &x, &mut o, false, 1);
        assert_eq!(o, vec![2.5, 4.5, 10.5, 12.5]);
        let p = Pool2d {
            kh: 3,
            kw: 3,
            sh: 1,
            sw: 1,
            pt: 1,
            pl: 1,
            pb: 1,
            pr: 1,
            oh: 4,
            ow: 4,
            ..p
        };
        let mut o = vec![0.0; 16];
        avg_pool2d(&p, &x, &mut o, true, 1);
        assert!((o[0] - (0.0 + 1.0 + 4.0 + 5.0) / 9.0).abs() < 1e-6);
        avg_pool2d(&p, &x, &mut o, false, 1);
        assert!((o[0] - 2.5).abs() < 1e-6);
    }
}
