//! Det: the determinant of each square matrix in the last two axes, by LU decomposition with
//! partial pivoting in f64.

use super::elementwise::cast;
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{DType, Data, Tensor, checked_numel};

/// The determinant of every `[..., M, M]` matrix of `x` (float32 or float64), shape `[...]`.
pub fn det(x: &Tensor) -> OpResult<Tensor> {
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Err(OpError::DType(format!("Det of {:?}", x.dtype())));
    }
    let r = x.rank();
    if r < 2 || x.shape[r - 1] != x.shape[r - 2] {
        return shape_err(format!(
            "Det needs square matrices in the last two axes, got {:?}",
            x.shape
        ));
    }
    let m = x.shape[r - 1];
    let batch = x.shape[..r - 2].to_vec();
    let count = checked_numel(&batch)?;
    let v = x.to_f64_vec();
    let mut out = Vec::with_capacity(count);
    let mut a = vec![0.0f64; m * m];
    for k in 0..count {
        a.copy_from_slice(&v[k * m * m..][..m * m]);
        out.push(lu_det(&mut a, m));
    }
    Ok(cast(&Tensor::new(batch, Data::F64(out))?, x.dtype()))
}

/// The determinant of the `m`×`m` row-major matrix `a`, which is overwritten by its LU factors.
fn lu_det(a: &mut [f64], m: usize) -> f64 {
    let mut det = 1.0;
    for c in 0..m {
        // The largest remaining entry of the column as the pivot.
        let p = (c..m)
            .max_by(|&i, &j| a[i * m + c].abs().total_cmp(&a[j * m + c].abs()))
            .unwrap_or(c);
        let pivot = a[p * m + c];
        if pivot == 0.0 {
            return 0.0;
        }
        if p != c {
            for j in 0..m {
                a.swap(p * m + j, c * m + j);
            }
            det = -det;
        }
        det *= pivot;
        for i in c + 1..m {
            let f = a[i * m + c] / pivot;
            for j in c + 1..m {
                a[i * m + j] -= f * a[c * m + j];
            }
        }
    }
    det
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn determinants_of_a_batch_and_refusals() {
        let x = Tensor::f32(vec![2, 2, 2], vec![0.0, 1.0, 2.0, 3.0, 2.0, 0.0, 0.0, 4.0]).unwrap();
        let d = det(&x).unwrap();
        assert_eq!(
            (d.shape.clone(), d.as_f32().unwrap()),
            (vec![2], &[-2.0, 8.0][..])
        );
        let e = Tensor::f32(vec![0, 0], vec![]).unwrap();
        assert_eq!(det(&e).unwrap().as_f32().unwrap(), &[1.0]);
        assert!(det(&Tensor::f32(vec![2, 3], vec![0.0; 6]).unwrap()).is_err());
        assert!(det(&Tensor::f32(vec![3], vec![0.0; 3]).unwrap()).is_err());
    }
}
