//! `MatMulNBits`, the weight-only 2-, 4- or 8-bit MatMul that onnxruntime's
//! `MatMulNBitsQuantizer` writes (int4 language models): the constant weights are dequantized
//! once at load into a float `[K, N]` matrix, and the node reads as a MatMul by it (plus the
//! bias), which the executor packs like any other. Exact to onnxruntime's dequantization; the
//! weights then take four bytes an element instead of half a byte. onnxruntime's
//! `accuracy_level` 4 (A quantized to int8 for its kernel) is computed in float here.

use super::expansion::{Expansion, R};
use crate::tensor::{DType, Data, Tensor};

pub fn matmul_nbits(e: &mut Expansion) -> R<()> {
    let a = e.attrs();
    let positive = |name: &str| -> R<usize> {
        match a.int(name)? {
            Some(v) if v > 0 => usize::try_from(v).map_err(|e| e.to_string()),
            Some(v) => Err(format!("attribute {name:?} is {v}, not positive")),
            None => Err(format!("attribute {name:?} is required")),
        }
    };
    let (k, n, block) = (positive("K")?, positive("N")?, positive("block_size")?);
    let bits = a.int_or("bits", 4)?;
    if !matches!(bits, 2 | 4 | 8) {
        return Err(format!("attribute \"bits\" is {bits}, not 2, 4 or 8"));
    }
    let bits = bits as usize;
    if !(16..=1 << 20).contains(&block) || !block.is_power_of_two() {
        return Err(format!(
            "attribute \"block_size\" is {block}, not a power of two from 16 to 2^20"
        ));
    }
    if a.int_or("weight_prepacked", 0)? != 0 {
        return Err("attribute \"weight_prepacked\" is not supported (only 0)".into());
    }
    e.unsupported_input(4, "g_idx")?;
    let x = e.required(0, "A")?;
    let q = e.constant_input(1, "B")?;
    let scales = e.constant_input(2, "scales")?;
    let zeros = match e.input(3) {
        "" => None,
        _ => Some(e.constant_input(3, "zero_points")?),
    };
    let w = dequantized(&q, &scales, zeros.as_deref(), [k, n, block, bits])?;
    let w = e.computed(w);
    let out = e.output(0);
    match e.input(5) {
        "" => e.node_to("MatMul", &[x, &w], &[out], vec![]),
        bias => {
            let y = e.node("MatMul", &[x, &w], vec![]);
            e.node_to("Add", &[&y, bias], &[out], vec![]);
        }
    }
    Ok(())
}

/// The `[K, N]` float weights of packed `q` (`[N, blocks, block·bits/8]` bytes, each column's
/// values along K from the low bits of each byte up), per-block `scales` (`[N, blocks]`) and
/// zero points (packed like `q`, `[N, ⌈blocks·bits/8⌉]` bytes, or unpacked floats `[N, blocks]`;
/// by default the middle of the range, 2^(bits-1)).
fn dequantized(
    q: &Tensor,
    scales: &Tensor,
    zeros: Option<&Tensor>,
    [k, n, block, bits]: [usize; 4],
) -> R<Tensor> {
    let blocks = k.div_ceil(block);
    let blob = block * bits / 8;
    // Attributes past any real size (the fuzz suite's) must not overflow what they size.
    let expected = n.checked_mul(blocks).and_then(|c| c.checked_mul(blob));
    let Data::U8(bytes) = &q.data else {
        return Err(format!("B is {:?}, not uint8", q.dtype()));
    };
    if expected != Some(bytes.len()) {
        return Err(format!(
            "B has {} bytes, not N·⌈K/block_size⌉·block_size·bits/8 for K {k}, N {n}, \
             block_size {block} and {bits} bits",
            bytes.len(),
        ));
    }
    let scale = match scales.dtype() {
        DType::F32 => scales.to_f64_vec(),
        d => return Err(format!("scales are {d:?}: float32 is supported")),
    };
    if scale.len() != n * blocks {
        return Err(format!(
            "scales have {} values, not N·blocks = {}",
            scale.len(),
            n * blocks
        ));
    }
    let field = |data: &[u8], at: usize| -> f64 {
        let (byte, shift) = (at * bits / 8, at * bits % 8);
        ((data[byte] >> shift) & ((1u16 << bits) - 1) as u8) as f64
    };
    let zero_bytes = blocks.div_ceil(8 / bits);
    let zero: Box<dyn Fn(usize, usize) -> f64> = match zeros {
        None => Box::new(|_, _| (1u32 << (bits - 1)) as f64),
        Some(Tensor {
            data: Data::U8(z), ..
        }) if z.len() == n * zero_bytes => {
            Box::new(move |col, b| field(&z[col * zero_bytes..(col + 1) * zero_bytes], b))
        }
        Some(z) if z.dtype() == DType::F32 && z.len() == n * blocks => {
            let z = z.to_f64_vec();
            Box::new(move |col, b| z[col * blocks + b])
        }
        Some(z) => {
            return Err(format!(
                "zero_points are {:?} of {} values: uint8 packed ({}) or float32 ({}) are read",
                z.dtype(),
                z.len(),
                n * zero_bytes,
                n * blocks
            ));
        }
    };
    let mut w = vec![0f32; k * n];
    for col in 0..n {
        let column = &bytes[col * blocks * blob..(col + 1) * blocks * blob];
        for b in 0..blocks {
            let (s, z) = (scale[col * blocks + b], zero(col, b));
            for at in b * block..((b + 1) * block).min(k) {
                w[at * n + col] = ((field(column, at) - z) * s) as f32;
            }
        }
    }
    Tensor::f32(vec![k, n], w).map_err(|e| e.to_string())
}
