//! MelWeightMatrix: the triangular filters that map a one-sided DFT's bins onto mel bands,
//! computed as the ONNX reference does (band edges evenly spaced in mel, rounded down to bins).

use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{DType, Data, MAX_ELEMENTS, Tensor, checked_numel};

/// One scalar input as an integer.
fn int(t: &Tensor, what: &str) -> OpResult<i64> {
    match t.to_i64_vec()?.as_slice() {
        [v] => Ok(*v),
        v => shape_err(format!(
            "MelWeightMatrix {what} must be one integer, got {v:?}"
        )),
    }
}

/// One scalar input as a float.
fn float(t: &Tensor, what: &str) -> OpResult<f64> {
    match t.to_f64_vec().as_slice() {
        [v] if v.is_finite() => Ok(*v),
        v => shape_err(format!(
            "MelWeightMatrix {what} must be one finite number, got {v:?}"
        )),
    }
}

/// The output shape `[dft_length / 2 + 1, num_mel_bins]` for these inputs.
pub(crate) fn mel_shape(inputs: &[Option<&Tensor>]) -> OpResult<Vec<usize>> {
    let bins = int(super::input(inputs, 0)?, "num_mel_bins")?;
    let dft = int(super::input(inputs, 1)?, "dft_length")?;
    let limit = MAX_ELEMENTS as i64;
    if !(1..=limit).contains(&bins) || !(1..=limit).contains(&dft) {
        return shape_err(format!(
            "MelWeightMatrix of {bins} mel bins over a DFT of {dft}: both must be positive"
        ));
    }
    let shape = vec![dft as usize / 2 + 1, bins as usize];
    checked_numel(&shape)?;
    Ok(shape)
}

/// MelWeightMatrix, as element type `to`.
pub fn mel_weight_matrix(to: DType, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let shape = mel_shape(inputs)?;
    let (spectrum, bins) = (shape[0], shape[1]);
    let dft = int(super::input(inputs, 1)?, "dft_length")? as f64;
    let rate = int(super::input(inputs, 2)?, "sample_rate")?;
    let (low, high) = (
        float(super::input(inputs, 3)?, "lower_edge_hertz")?,
        float(super::input(inputs, 4)?, "upper_edge_hertz")?,
    );
    if rate <= 0 || !(0.0..=high).contains(&low) {
        return shape_err(format!(
            "MelWeightMatrix at sample rate {rate} from {low} Hz to {high} Hz"
        ));
    }
    // The reference computes the edges' mel values and their step in the edges' (float32)
    // precision, the bands' frequencies in f64.
    let mel = |hz: f64| 2595.0f32 * (1.0 + hz as f32 / 700.0).log10();
    let (low_mel, high_mel) = (mel(low), mel(high));
    let step = f64::from((high_mel - low_mel) / (bins + 2) as f32);
    let low_mel = f64::from(low_mel);
    let edges: Vec<i64> = (0..bins + 2)
        .map(|i| {
            let m = i as f64 * step + low_mel;
            let hz = 700.0 * (10f64.powf(m / 2595.0) - 1.0);
            ((dft + 1.0) * hz / rate as f64).floor() as i64
        })
        .collect();
    let mut y = vec![0.0f64; spectrum * bins];
    let mut set = |j: i64, i: usize, v: f64| -> OpResult<()> {
        let j = usize::try_from(j)
            .ok()
            .filter(|&j| j < spectrum)
            .ok_or_else(|| {
                OpError::Shape(format!(
                    "MelWeightMatrix band {i} reaches bin {j} of a spectrum of {spectrum}"
                ))
            })?;
        y[j * bins + i] = v;
        Ok(())
    };
    for i in 0..bins {
        let (lo, center, hi) = (edges[i], edges[i + 1], edges[i + 2]);
        if center == lo {
            set(center, i, 1.0)?;
        } else {
            for j in lo..=center {
                set(j, i, (j - lo) as f64 / (center - lo) as f64)?;
            }
        }
        if hi > center {
            for j in center..hi {
                set(j, i, (hi - j) as f64 / (hi - center) as f64)?;
            }
        }
    }
    Ok(super::elementwise::cast(
        &Tensor::new(shape, Data::F64(y))?,
        to,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar_i(v: i64) -> Tensor {
        Tensor::i64(vec![], vec![v]).unwrap()
    }

    #[test]
    fn filters_are_triangles_and_bad_ranges_are_refused() {
        let (bins, dft, rate) = (scalar_i(8), scalar_i(16), scalar_i(8192));
        let (lo, hi) = (Tensor::scalar_f32(0.0), Tensor::scalar_f32(4096.0));
        let ins = [Some(&bins), Some(&dft), Some(&rate), Some(&lo), Some(&hi)];
        let y = mel_weight_matrix(DType::F32, &ins).unwrap();
        assert_eq!(y.shape, vec![9, 8]);
        assert!(y.as_f32().unwrap().iter().all(|v| (0.0..=1.0).contains(v)));
        let huge = Tensor::scalar_f32(1e9);
        let bad = [Some(&bins), Some(&dft), Some(&rate), Some(&lo), Some(&huge)];
        assert!(mel_weight_matrix(DType::F32, &bad).is_err());
        let zero = scalar_i(0);
        let bad = [Some(&zero), Some(&dft), Some(&rate), Some(&lo), Some(&hi)];
        assert!(mel_weight_matrix(DType::F32, &bad).is_err());
    }
}
