//! RoiAlign: each region of interest of a feature map pooled to a fixed grid of bins, every bin
//! the average (or maximum) of bilinear samples on a regular grid inside it (Mask R-CNN).

use super::attrs::Attrs;
use super::elementwise::cast;
use super::input;
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{DType, Data, MAX_ELEMENTS, Tensor, checked_numel};

#[derive(Clone, Debug, PartialEq)]
pub struct RoiAlignAttrs {
    pub max: bool,
    /// `half_pixel`: region corners shifted by half a pixel, and no 1x1 floor on their size.
    pub half_pixel: bool,
    pub output_height: usize,
    pub output_width: usize,
    /// Samples per bin along each axis; 0: as many as the bin is wide (rounded up).
    pub sampling_ratio: usize,
    pub spatial_scale: f32,
}

/// Most bilinear samples one bin may take (64 bytes each, held while the bin is pooled): a
/// hostile region of 1e30 pixels would otherwise ask for that many.
pub(crate) const MAX_SAMPLES: usize = 1 << 16;

impl RoiAlignAttrs {
    pub fn parse(a: &Attrs, opset: i64) -> Result<RoiAlignAttrs, String> {
        let max = match a.string_or("mode", "avg")?.as_str() {
            "avg" => false,
            "max" => true,
            m => return Err(format!("attribute \"mode\" is {m:?}, not avg or max")),
        };
        // Opset 16 added the attribute; before it, regions were not shifted.
        let default = if opset < 16 {
            "output_half_pixel"
        } else {
            "half_pixel"
        };
        let half_pixel = match a
            .string_or("coordinate_transformation_mode", default)?
            .as_str()
        {
            "half_pixel" => true,
            "output_half_pixel" => false,
            m => {
                return Err(format!(
                    "attribute \"coordinate_transformation_mode\" is {m:?}, not half_pixel or \
                     output_half_pixel"
                ));
            }
        };
        let positive = |name: &str| -> Result<usize, String> {
            match a.int_or(name, 1)? {
                v if v >= 1 && v as u64 <= MAX_ELEMENTS as u64 => Ok(v as usize),
                v => Err(format!("attribute {name:?} is {v}, not a positive size")),
            }
        };
        let sampling_ratio = match a.int_or("sampling_ratio", 0)? {
            // At most `MAX_SAMPLES` per bin.
            v @ 0..=256 => v as usize,
            v => {
                return Err(format!(
                    "attribute \"sampling_ratio\" is {v}, not in 0..=256"
                ));
            }
        };
        let spatial_scale = a.float_or("spatial_scale", 1.0)?;
        if !(spatial_scale.is_finite() && spatial_scale > 0.0) {
            return Err(format!(
                "attribute \"spatial_scale\" is {spatial_scale}, not positive"
            ));
        }
        Ok(RoiAlignAttrs {
            max,
            half_pixel,
            output_height: positive("output_height")?,
            output_width: positive("output_width")?,
            sampling_ratio,
            spatial_scale,
        })
    }
}

/// The output shape `[regions, channels, output_height, output_width]`.
pub(crate) fn roi_align_shape(
    a: &RoiAlignAttrs,
    inputs: &[Option<&Tensor>],
) -> OpResult<Vec<usize>> {
    let (x, rois, idx) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    if x.rank() != 4 || rois.rank() != 2 || rois.shape[1] != 4 || idx.rank() != 1 {
        return shape_err(format!(
            "RoiAlign of {:?} with regions {:?} and batch indices {:?}",
            x.shape, rois.shape, idx.shape
        ));
    }
    if idx.shape[0] != rois.shape[0] {
        return shape_err(format!(
            "RoiAlign: {} regions but {} batch indices",
            rois.shape[0], idx.shape[0]
        ));
    }
    let shape = vec![rois.shape[0], x.shape[1], a.output_height, a.output_width];
    checked_numel(&shape)?;
    Ok(shape)
}

/// One bilinear sample: four input offsets within a channel and their weights.
type Sample = ([usize; 4], [f64; 4]);

/// The bilinear sample at `(y, x)` of an `h`×`w` map (nothing outside it by more than a pixel).
fn sample(y: f64, x: f64, h: usize, w: usize) -> Sample {
    if y < -1.0 || y > h as f64 || x < -1.0 || x > w as f64 || h == 0 || w == 0 {
        return ([0; 4], [0.0; 4]);
    }
    let (mut y, mut x) = (y.max(0.0), x.max(0.0));
    let (mut y0, mut x0) = (y as usize, x as usize);
    let y1 = if y0 >= h - 1 {
        y0 = h - 1;
        y = y0 as f64;
        y0
    } else {
        y0 + 1
    };
    let x1 = if x0 >= w - 1 {
        x0 = w - 1;
        x = x0 as f64;
        x0
    } else {
        x0 + 1
    };
    let (ly, lx) = (y - y0 as f64, x - x0 as f64);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    (
        [y0 * w + x0, y0 * w + x1, y1 * w + x0, y1 * w + x1],
        [hy * hx, hy * lx, ly * hx, ly * lx],
    )
}

/// RoiAlign of `X` `[N, C, H, W]` over `rois` `[R, 4]` (x1, y1, x2, y2) of images
/// `batch_indices` `[R]`.
pub fn roi_align(a: &RoiAlignAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let shape = roi_align_shape(a, inputs)?;
    let (x, rois, idx) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Err(OpError::DType(format!("RoiAlign of {:?}", x.dtype())));
    }
    let (n, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (ph, pw) = (a.output_height, a.output_width);
    let v = x.to_f64_vec();
    let boxes = rois.to_f64_vec();
    let images = idx.to_i64_vec()?;
    let mut y = vec![0.0f64; checked_numel(&shape)?];
    let offset = if a.half_pixel { 0.5 } else { 0.0 };
    let scale = f64::from(a.spatial_scale);
    for (r, &image) in images.iter().enumerate() {
        let image = usize::try_from(image)
            .ok()
            .filter(|&i| i < n)
            .ok_or_else(|| {
                OpError::Shape(format!(
                    "RoiAlign batch index {image} outside a batch of {n}"
                ))
            })?;
        let b = &boxes[r * 4..][..4];
        if b.iter().any(|v| !v.is_finite()) {
            return shape_err(format!("RoiAlign region {r} is {b:?}"));
        }
        let (x0, y0) = (b[0] * scale - offset, b[1] * scale - offset);
        let (mut rw, mut rh) = (b[2] * scale - offset - x0, b[3] * scale - offset - y0);
        if !a.half_pixel {
            (rw, rh) = (rw.max(1.0), rh.max(1.0));
        }
        let (bh, bw) = (rh / ph as f64, rw / pw as f64);
        let grid = |size: f64| -> OpResult<usize> {
            match a.sampling_ratio {
                0 if size.ceil() > MAX_SAMPLES as f64 => Err(OpError::Unsupported(format!(
                    "RoiAlign region {r} asks for more than {MAX_SAMPLES} samples per bin axis"
                ))),
                0 => Ok(size.ceil().max(0.0) as usize),
                s => Ok(s),
            }
        };
        let (gh, gw) = (grid(bh)?, grid(bw)?);
        let per_bin = gh * gw;
        if per_bin > MAX_SAMPLES {
            return Err(OpError::Unsupported(format!(
                "RoiAlign region {r} asks for {gh}x{gw} samples per bin"
            )));
        }
        let count = per_bin.max(1) as f64;
        let mut samples: Vec<Sample> = Vec::with_capacity(per_bin);
        for bin in 0..ph * pw {
            let (oy, ox) = (bin / pw, bin % pw);
            // The bin's samples, shared by all channels.
            samples.clear();
            for iy in 0..gh {
                let sy = y0 + oy as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                for ix in 0..gw {
                    let sx = x0 + ox as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                    samples.push(sample(sy, sx, h, w));
                }
            }
            for ch in 0..c {
                let plane = &v[(image * c + ch) * h * w..][..h * w];
                // A sample's four weighted taps.
                let taps = |(at, wt): &Sample| {
                    let mut t = [0.0; 4];
                    for k in 0..4 {
                        t[k] = wt[k] * plane.get(at[k]).copied().unwrap_or(0.0);
                    }
                    t
                };
                y[(r * c + ch) * ph * pw + bin] = if a.max {
                    samples
                        .iter()
                        .map(|s| taps(s).into_iter().fold(f64::NEG_INFINITY, f64::max))
                        .reduce(f64::max)
                        .unwrap_or(0.0)
                } else {
                    samples
                        .iter()
                        .map(|s| taps(s).iter().sum::<f64>())
                        .sum::<f64>()
                        / count
                };
            }
        }
    }
    Ok(cast(&Tensor::new(shape, Data::F64(y))?, x.dtype()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(max: bool) -> RoiAlignAttrs {
        RoiAlignAttrs {
            max,
            half_pixel: false,
            output_height: 1,
            output_width: 1,
            sampling_ratio: 2,
            spatial_scale: 1.0,
        }
    }

    #[test]
    fn regions_pool_bilinear_samples_and_bad_regions_are_refused() {
        let x = Tensor::f32(vec![1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let rois = Tensor::f32(vec![1, 4], vec![0.0, 0.0, 1.0, 1.0]).unwrap();
        let idx = Tensor::i64(vec![1], vec![0]).unwrap();
        let ins = [Some(&x), Some(&rois), Some(&idx)];
        // Samples at 0.25 and 0.75 on each axis: their mean is the map at (0.5, 0.5).
        let y = roi_align(&attrs(false), &ins).unwrap();
        assert_eq!(y.shape, vec![1, 1, 1, 1]);
        assert!((y.as_f32().unwrap()[0] - 2.5).abs() < 1e-6);
        let bad = Tensor::i64(vec![1], vec![1]).unwrap();
        assert!(roi_align(&attrs(false), &[Some(&x), Some(&rois), Some(&bad)]).is_err());
        let huge = Tensor::f32(vec![1, 4], vec![0.0, 0.0, 1e30, 1e30]).unwrap();
        let auto = RoiAlignAttrs {
            sampling_ratio: 0,
            ..attrs(true)
        };
        assert!(roi_align(&auto, &[Some(&x), Some(&huge), Some(&idx)]).is_err());
        let nan = Tensor::f32(vec![1, 4], vec![f32::NAN, 0.0, 1.0, 1.0]).unwrap();
        assert!(roi_align(&attrs(true), &[Some(&x), Some(&nan), Some(&idx)]).is_err());
    }
}
