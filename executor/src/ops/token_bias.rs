//! The key and value biases of onnxruntime's `com.microsoft.MultiHeadAttention`: added to a key
//! or value given as tokens (`[batch, length, hidden]`); one given already split into heads
//! (`[batch, heads, length, head size]`, a cross-attention cache) passes unchanged, as
//! onnxruntime leaves it. The rank is known only at run time, so no standard operator says it.

use super::Cx;
use super::elementwise::{Binary, binary_in};
use crate::error::{OpResult, shape_err};
use crate::tensor::Tensor;

pub fn token_bias(cx: &Cx, x: &Tensor, bias: &Tensor) -> OpResult<Tensor> {
    match x.rank() {
        3 if bias.rank() == 1 && bias.shape.last() == x.shape.last() => {
            binary_in(cx, Binary::Add, x, bias)
        }
        3 => shape_err(format!(
            "a bias of {:?} for a key or value of {:?}",
            bias.shape, x.shape
        )),
        4 => Ok(x.clone()),
        _ => shape_err(format!(
            "a key or value of {:?}: not [batch, length, hidden] or [batch, heads, length, head \
             size]",
            x.shape
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_take_the_bias_and_heads_pass() {
        let cx = Cx::new(1);
        let bias = Tensor::f32(vec![2], vec![1.0, 2.0]).unwrap();
        let tokens = Tensor::f32(vec![1, 2, 2], vec![0.0; 4]).unwrap();
        let y = token_bias(&cx, &tokens, &bias).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[1.0, 2.0, 1.0, 2.0]);
        let heads = Tensor::f32(vec![1, 2, 1, 1], vec![5.0, 6.0]).unwrap();
        assert_eq!(token_bias(&cx, &heads, &bias).unwrap(), heads);
        let wide = Tensor::f32(vec![1, 1, 3], vec![0.0; 3]).unwrap();
        assert!(token_bias(&cx, &wide, &bias).is_err());
        assert!(token_bias(&cx, &bias, &bias).is_err());
    }
}
