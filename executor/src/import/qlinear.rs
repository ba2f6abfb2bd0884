//! onnxruntime's 8-bit operators in the operator-oriented format (`quantize_static` with
//! `QuantFormat.QOperator`, older int8 model zoo files) and the dynamic integer products of
//! `quantize_dynamic`, written out as the standard operators they stand for: an operator on
//! 8-bit values is `DequantizeLinear`, the float operator, `QuantizeLinear` (onnxruntime
//! documents most of them that way), which the QDQ pass then fuses into integer kernels where it
//! has one. Integer products stay integer (`MatMulInteger`), scaled afterwards.

use super::expansion::{Expansion, R, float_attr, int_attr};
use crate::tensor::{Data, Tensor};

/// `(x - zero) · scale`.
fn dequantize(e: &mut Expansion, x: &str, scale: &str, zero: &str) -> String {
    e.node("DequantizeLinear", &[x, scale, zero], vec![])
}

/// `y` quantized into output 0 with `scale` and `zero`; without a zero point the output takes
/// the element type of `like` (an 8-bit input of the node), as onnxruntime's do.
fn quantize_into(e: &mut Expansion, y: &str, scale: &str, zero: &str, like: &str) {
    let zero = match zero {
        "" => {
            let nought = e.constant(&Tensor::new(vec![], Data::I32(vec![0])).expect("a scalar"));
            e.node("CastLike", &[&nought, like], vec![])
        }
        z => z.to_string(),
    };
    let out = e.output(0);
    e.node_to("QuantizeLinear", &[y, scale, &zero], &[out], vec![]);
}

/// Refuses the NHWC forms onnxruntime's layout optimizer writes.
fn channels_first(e: &Expansion) -> R<()> {
    match e.attrs().int_or("channels_last", 0)? {
        0 => Ok(()),
        _ => Err("attribute \"channels_last\" is not supported (only 0)".into()),
    }
}

/// The operators on dequantized 8-bit inputs with one requantized output.
pub fn qlinear(e: &mut Expansion, op: &str) -> R<()> {
    if op == "QLinearConcat" {
        return concat(e);
    }
    let x = e.required(0, "X")?;
    let dq = |e: &mut Expansion, at: usize| -> R<String> {
        let (v, scale) = (
            e.required(at, "an operand")?,
            e.required(at + 1, "its scale")?,
        );
        Ok(dequantize(e, v, scale, e.input(at + 2)))
    };
    // The float result and where the output's scale and zero point are.
    let (y, out_at) = match op {
        "QLinearAdd" | "QLinearMul" => {
            let (a, b) = (dq(e, 0)?, dq(e, 3)?);
            (e.node(&op[7..], &[&a, &b], vec![]), 6)
        }
        "QLinearSigmoid" => {
            let a = dq(e, 0)?;
            (e.node("Sigmoid", &[&a], vec![]), 3)
        }
        "QLinearLeakyRelu" => {
            let alpha = e.attrs().float_or("alpha", 0.01)?;
            let a = dq(e, 0)?;
            let attrs = vec![float_attr("alpha", alpha)];
            (e.node("LeakyRelu", &[&a], attrs), 3)
        }
        "QLinearGlobalAveragePool" => {
            channels_first(e)?;
            let a = dq(e, 0)?;
            (e.node("GlobalAveragePool", &[&a], vec![]), 3)
        }
        "QLinearAveragePool" => {
            channels_first(e)?;
            let attrs = e.same_attrs(&[
                "auto_pad",
                "ceil_mode",
                "count_include_pad",
                "kernel_shape",
                "pads",
                "strides",
            ]);
            let a = dq(e, 0)?;
            (e.node("AveragePool", &[&a], attrs), 3)
        }
        "QLinearSoftmax" => {
            let a = e.attrs();
            let opset = a.int("opset")?.ok_or("attribute \"opset\" is required")?;
            let axis = a.int_or("axis", -1)?;
            let v = dq(e, 0)?;
            let y = e.fresh_value("Softmax");
            e.node_at("Softmax", &[&v], &[&y], vec![int_attr("axis", axis)], opset);
            (y, 3)
        }
        "QLinearWhere" => {
            let cond = e.required(0, "condition")?;
            let (a, b) = (dq(e, 1)?, dq(e, 4)?);
            (e.node("Where", &[cond, &a, &b], vec![]), 7)
        }
        _ => unreachable!("contrib dispatches only QLinear operators here"),
    };
    let like = if op == "QLinearWhere" {
        e.required(1, "X")?
    } else {
        x
    };
    let (scale, zero) = (
        e.required(out_at, "the output's scale")?,
        e.input(out_at + 1),
    );
    quantize_into(e, &y, scale, zero, like);
    Ok(())
}

/// `QLinearConcat(Y_scale, Y_zero_point, (X, X_scale, X_zero_point)...)`.
fn concat(e: &mut Expansion) -> R<()> {
    let axis = e
        .attrs()
        .int("axis")?
        .ok_or("attribute \"axis\" is required")?;
    let n = e.np.input.len();
    if n < 5 || !(n - 2).is_multiple_of(3) {
        return Err(format!(
            "has {n} inputs: Y_scale, Y_zero_point, then a (tensor, scale, zero point) triple \
             per operand"
        ));
    }
    let mut parts = Vec::new();
    for at in (2..n).step_by(3) {
        let (x, scale) = (
            e.required(at, "an operand")?,
            e.required(at + 1, "its scale")?,
        );
        parts.push(dequantize(e, x, scale, e.input(at + 2)));
    }
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let y = e.node("Concat", &parts, vec![int_attr("axis", axis)]);
    let (scale, zero) = (e.required(0, "Y_scale")?, e.required(1, "Y_zero_point")?);
    quantize_into(e, &y, scale, zero, e.input(2));
    Ok(())
}

/// `sums` (int32) as float, times `a_scale · b_scale`, plus `bias` when given, into `out`.
fn scaled_sums(e: &mut Expansion, sums: &str, a_scale: &str, b_scale: &str, bias: &str, out: &str) {
    let sums = e.node("Cast", &[sums], vec![int_attr("to", 1)]);
    let scale = e.node("Mul", &[a_scale, b_scale], vec![]);
    match bias {
        "" => e.node_to("Mul", &[&sums, &scale], &[out], vec![]),
        _ => {
            let scaled = e.node("Mul", &[&sums, &scale], vec![]);
            e.node_to("Add", &[&scaled, bias], &[out], vec![]);
        }
    }
}

/// `MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point?, b_zero_point?, bias?)`.
pub fn matmul_integer_to_float(e: &mut Expansion) -> R<()> {
    let (a, b) = (e.required(0, "A")?, e.required(1, "B")?);
    let (a_scale, b_scale) = (e.required(2, "a_scale")?, e.required(3, "b_scale")?);
    let sums = e.node("MatMulInteger", &[a, b, e.input(4), e.input(5)], vec![]);
    scaled_sums(e, &sums, a_scale, b_scale, e.input(6), e.output(0));
    Ok(())
}

/// `DynamicQuantizeMatMul(A, B, b_scale, b_zero_point?, bias?)`: A quantized to uint8 over
/// its own range, as `DynamicQuantizeLinear` does, then the integer product.
pub fn dynamic_quantize_matmul(e: &mut Expansion) -> R<()> {
    let (a, b, b_scale) = (
        e.required(0, "A")?,
        e.required(1, "B")?,
        e.required(2, "b_scale")?,
    );
    let (q, q_scale, q_zero) = (
        e.fresh_value("a_quantized"),
        e.fresh_value("a_scale"),
        e.fresh_value("a_zero_point"),
    );
    e.node_to(
        "DynamicQuantizeLinear",
        &[a],
        &[&q, &q_scale, &q_zero],
        vec![],
    );
    let sums = e.node("MatMulInteger", &[&q, b, &q_zero, e.input(3)], vec![]);
    scaled_sums(e, &sums, &q_scale, b_scale, e.input(4), e.output(0));
    Ok(())
}

/// `QGemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C?, y_scale?, y_zero_point?)`:
/// Gemm of the dequantized operands, C (int32 at scale `alpha · a_scale · b_scale`) added, the
/// result quantized when `y_scale` is given and float otherwise.
pub fn qgemm(e: &mut Expansion) -> R<()> {
    let at = e.attrs();
    let (alpha, trans_b) = (at.float_or("alpha", 1.0)?, at.flag("transB", false)?);
    let a_in = e.required(0, "A")?;
    let a = dequantize(e, a_in, e.required(1, "a_scale")?, e.input(2));
    // A per-column scale runs along B's columns: its second axis, or its first transposed.
    let (b_in, b_scale) = (e.required(3, "B")?, e.required(4, "b_scale")?);
    let b_axis = int_attr("axis", if trans_b { 0 } else { 1 });
    let b = e.node(
        "DequantizeLinear",
        &[b_in, b_scale, e.input(5)],
        vec![b_axis],
    );
    let mut gemm_inputs = vec![a, b];
    let c = e.input(6);
    if !c.is_empty() {
        let c = e.node("Cast", &[c], vec![int_attr("to", 1)]);
        let ab = e.node("Mul", &[e.input(1), b_scale], vec![]);
        let alpha = e.float(alpha);
        let scale = e.node("Mul", &[&ab, &alpha], vec![]);
        gemm_inputs.push(e.node("Mul", &[&c, &scale], vec![]));
    }
    let attrs = e.same_attrs(&["alpha", "transA", "transB"]);
    let gemm_inputs: Vec<&str> = gemm_inputs.iter().map(String::as_str).collect();
    match e.input(7) {
        "" => e.node_to("Gemm", &gemm_inputs, &[e.output(0)], attrs),
        y_scale => {
            let y = e.node("Gemm", &gemm_inputs, attrs);
            quantize_into(e, &y, y_scale, e.input(8), a_in);
        }
    }
    Ok(())
}
