//! The recurrent layers RNN, GRU and LSTM, as the ONNX spec defines them: forward, reverse or
//! bidirectional; the activation functions of the `activations` attribute (those without
//! parameters, and those whose parameters have ONNX defaults); `clip` on every activation's
//! input; per-batch `sequence_lens` (steps past a sequence's end output zeros and leave its
//! state alone); initial states, LSTM peepholes, GRU's `linear_before_reset`, and `layout` 1
//! (batch first). Attributes outside this (`activation_alpha`, `activation_beta`, LSTM's
//! `input_forget`, other activations) are import errors, never ignored. Worked in f64.

use super::attrs::Attrs;
use super::quant::dynamic_quantize_into;
use super::{input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{DType, Data, Tensor, checked_numel};
use cotenant_kernels::activation::{map_inplace, sigmoid, tanh};
use cotenant_kernels::dense;
use cotenant_kernels::gemm::{Mat, sgemm};
use cotenant_kernels::qgemm::{PackedA, PackedB, qgemm_map};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cell {
    Rnn,
    Gru { linear_before_reset: bool },
    Lstm,
}

impl Cell {
    /// Gates (weight blocks) per direction.
    fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru { .. } => 3,
            Cell::Lstm => 4,
        }
    }
    /// Activation functions per direction, and their defaults.
    fn default_acts(self) -> &'static [Act] {
        match self {
            Cell::Rnn => &[Act::Tanh],
            Cell::Gru { .. } => &[Act::Sigmoid, Act::Tanh],
            Cell::Lstm => &[Act::Sigmoid, Act::Tanh, Act::Tanh],
        }
    }
    fn name(self) -> &'static str {
        match self {
            Cell::Rnn => "RNN",
            Cell::Gru { .. } => "GRU",
            Cell::Lstm => "LSTM",
        }
    }
}

/// Activation functions, with the parameters their ONNX operators default to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    Sigmoid,
    Tanh,
    Relu,
    Softsign,
    Softplus,
    HardSigmoid,
    LeakyRelu,
    ThresholdedRelu,
    Elu,
}

impl Act {
    fn parse(name: &str) -> Option<Act> {
        Some(match name.to_ascii_lowercase().as_str() {
            "sigmoid" => Act::Sigmoid,
            "tanh" => Act::Tanh,
            "relu" => Act::Relu,
            "softsign" => Act::Softsign,
            "softplus" => Act::Softplus,
            "hardsigmoid" => Act::HardSigmoid,
            "leakyrelu" => Act::LeakyRelu,
            "thresholdedrelu" => Act::ThresholdedRelu,
            "elu" => Act::Elu,
            _ => return None,
        })
    }
    fn apply(self, x: f64) -> f64 {
        match self {
            Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Act::Tanh => x.tanh(),
            Act::Relu => x.max(0.0),
            Act::Softsign => x / (1.0 + x.abs()),
            Act::Softplus => x.exp().ln_1p(),
            Act::HardSigmoid => (0.2 * x + 0.5).clamp(0.0, 1.0),
            Act::LeakyRelu => {
                if x < 0.0 {
                    0.01 * x
                } else {
                    x
                }
            }
            Act::ThresholdedRelu => {
                if x > 1.0 {
                    x
                } else {
                    0.0
                }
            }
            Act::Elu => {
                if x < 0.0 {
                    x.exp() - 1.0
                } else {
                    x
                }
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct RnnAttrs {
    pub cell: Cell,
    pub hidden: Option<usize>,
    /// Forward (false) and reverse (true) passes, in output order.
    pub passes: Vec<bool>,
    /// Per pass, the cell's activation functions.
    pub acts: Vec<Vec<Act>>,
    pub clip: Option<f64>,
    pub batch_first: bool,
    /// R in 8 bits for the recurrent product (DynamicQuantizeLSTM's, `import::contrib`).
    pub quantized_r: Option<Arc<QuantizedR>>,
}

/// R kept in 8 bits, as DynamicQuantizeLSTM gives it: per direction, R transposed (`hidden ×
/// gates·hidden`, the input-major layout that op stores) packed for `qgemm`, and a scale per
/// column. Each step quantizes its state to uint8 over the state's own range, zero included (as
/// DynamicQuantizeLinear does, and onnxruntime runs that op), multiplies exactly in integers
/// and scales back: a step reads a quarter of the bytes of R in float32, which bounds it.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedR {
    pub packs: Vec<PackedB>,
    /// `[directions][gates·hidden]`.
    pub scales: Vec<f32>,
}

impl QuantizedR {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.packs.iter().map(PackedB::bytes).sum::<usize>() + self.scales.len() * 4
    }

    /// Whether this holds `dirs` directions of `hidden × gh`.
    fn fits(&self, dirs: usize, hidden: usize, gh: usize) -> bool {
        self.packs.len() == dirs
            && self.packs.iter().all(|p| p.k() == hidden && p.n() == gh)
            && self.scales.len() == dirs * gh
    }

    /// `out = h · R` of direction `d`, through `h` quantized into `q` and packed into `a`; `false`
    /// (nothing written) where `h` is not all finite.
    fn times(&self, d: usize, h: &[f32], q: &mut [u8], a: &mut PackedA, out: &mut [f32]) -> bool {
        if !h.iter().all(|v| v.is_finite()) {
            return false;
        }
        let (scale, zero) = dynamic_quantize_into(h, q);
        a.pack(1, h.len(), q, h.len(), zero as u8);
        let scales = &self.scales[d * out.len()..][..out.len()];
        qgemm_map(1, a, &self.packs[d], out, |_, j0, acc, o| {
            for ((o, &s), &acc) in o.iter_mut().zip(&scales[j0..]).zip(acc) {
                *o = acc as f32 * (scale * s);
            }
        });
        true
    }
}

impl RnnAttrs {
    pub fn parse(op_type: &str, a: &Attrs) -> Result<RnnAttrs, String> {
        let cell = match op_type {
            "RNN" => Cell::Rnn,
            "GRU" => Cell::Gru {
                linear_before_reset: a.flag("linear_before_reset", false)?,
            },
            _ => Cell::Lstm,
        };
        for unsupported in ["activation_alpha", "activation_beta"] {
            if a.has(unsupported) {
                return Err(format!("attribute {unsupported:?} is not supported"));
            }
        }
        if cell == Cell::Lstm && a.flag("input_forget", false)? {
            return Err("attribute \"input_forget\" 1 is not supported".into());
        }
        let passes = match a.string_or("direction", "forward")?.as_str() {
            "forward" => vec![false],
            "reverse" => vec![true],
            "bidirectional" => vec![false, true],
            d => {
                return Err(format!(
                    "attribute \"direction\" is {d:?}, not forward, reverse or bidirectional"
                ));
            }
        };
        let per = cell.default_acts().len();
        let acts = match a.strings("activations")? {
            None => vec![cell.default_acts().to_vec(); passes.len()],
            Some(names) => {
                let acts = names
                    .iter()
                    .map(|n| {
                        Act::parse(n).ok_or_else(|| {
                            format!("attribute \"activations\": {n:?} is not supported")
                        })
                    })
                    .collect::<Result<Vec<Act>, String>>()?;
                if acts.len() != per * passes.len() {
                    return Err(format!(
                        "attribute \"activations\" has {} functions; {} {} pass(es) need {}",
                        acts.len(),
                        passes.len(),
                        cell.name(),
                        per * passes.len()
                    ));
                }
                acts.chunks(per).map(<[Act]>::to_vec).collect()
            }
        };
        let clip = match a.float("clip")? {
            None => None,
            Some(c) if c > 0.0 => Some(c as f64),
            Some(c) => return Err(format!("attribute \"clip\" is {c}, not positive")),
        };
        let hidden = match a.int("hidden_size")? {
            None => None,
            Some(h) => Some(
                usize::try_from(h)
                    .ok()
                    .filter(|&h| h > 0)
                    .ok_or_else(|| format!("attribute \"hidden_size\" is {h}, not positive"))?,
            ),
        };
        Ok(RnnAttrs {
            cell,
            hidden,
            passes,
            acts,
            clip,
            batch_first: a.flag("layout", false)?,
            quantized_r: None,
        })
    }
}

/// The sizes of a run: steps, batch, input features, hidden units.
#[derive(Clone, Copy, Debug)]
pub struct RnnShape {
    pub seq: usize,
    pub batch: usize,
    pub input: usize,
    pub hidden: usize,
    pub dirs: usize,
}

impl RnnShape {
    /// Y's shape.
    pub fn y(&self, batch_first: bool) -> Vec<usize> {
        match batch_first {
            false => vec![self.seq, self.dirs, self.batch, self.hidden],
            true => vec![self.batch, self.seq, self.dirs, self.hidden],
        }
    }
    /// Y_h's (and Y_c's, and the initial states') shape.
    pub fn state(&self, batch_first: bool) -> Vec<usize> {
        match batch_first {
            false => vec![self.dirs, self.batch, self.hidden],
            true => vec![self.batch, self.dirs, self.hidden],
        }
    }
}

fn expect_shape(t: &Tensor, want: &[usize], what: &str) -> OpResult<()> {
    if t.shape != want {
        return shape_err(format!("{what} of shape {:?}, expected {want:?}", t.shape));
    }
    Ok(())
}

/// Checks X, W and R against each other and the attributes.
pub fn rnn_shape(r: &RnnAttrs, inputs: &[Option<&Tensor>]) -> OpResult<RnnShape> {
    let (x, w, rw) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let name = r.cell.name();
    if x.rank() != 3 || rw.rank() != 3 {
        return shape_err(format!(
            "{name} needs a 3-D X and R, got {:?} and {:?}",
            x.shape, rw.shape
        ));
    }
    let (seq, batch) = match r.batch_first {
        false => (x.shape[0], x.shape[1]),
        true => (x.shape[1], x.shape[0]),
    };
    let (dirs, g) = (r.passes.len(), r.cell.gates());
    let hidden = r.hidden.unwrap_or(rw.shape[2]);
    let s = RnnShape {
        seq,
        batch,
        input: x.shape[2],
        hidden,
        dirs,
    };
    let gh = g.checked_mul(hidden).ok_or(OpError::TooLarge(usize::MAX))?;
    expect_shape(w, &[dirs, gh, s.input], "W")?;
    expect_shape(rw, &[dirs, gh, hidden], "R")?;
    checked_numel(&s.y(r.batch_first))?;
    Ok(s)
}

fn floats(t: &Tensor, what: &str) -> OpResult<Vec<f64>> {
    match t.dtype() {
        DType::F32 | DType::F64 => Ok(t.to_f64_vec()),
        d => Err(OpError::DType(format!(
            "{what} of {d:?}: float32 or float64 is supported"
        ))),
    }
}

/// `Y`, `Y_h` and (LSTM) `Y_c`.
pub fn rnn<'a>(r: &RnnAttrs, inputs: &[Option<&'a Tensor>]) -> OpResult<Vec<Tensor>> {
    let s = rnn_shape(r, inputs)?;
    let x = input(inputs, 0)?;
    let (seq, batch, inp, hid, dirs) = (s.seq, s.batch, s.input, s.hidden, s.dirs);
    let g = r.cell.gates();
    let (wt, rt) = (input(inputs, 1)?, input(inputs, 2)?);
    // Float32 X, W and R are read in place, and their products run through the kernels' f32
    // matrix product; other types are converted and multiplied in f64.
    let f32s = |t: &'a Tensor| (t.dtype() == DType::F32).then(|| t.as_f32().ok()).flatten();
    let fast = match (f32s(x), f32s(wt), f32s(rt)) {
        (Some(x), Some(w), Some(r)) => Some((x, w, r)),
        _ => None,
    };
    let converted = |t: &Tensor, what: &str, needed: bool| match needed {
        true => floats(t, what),
        false => Ok(Vec::new()),
    };
    let xv = converted(x, "X", fast.is_none())?;
    let wv = converted(wt, "W", fast.is_none())?;
    // GRU's candidate without linear_before_reset reads the rows of R itself.
    let rows_of_r = r.cell
        == Cell::Gru {
            linear_before_reset: false,
        };
    let rv = converted(rt, "R", fast.is_none() || rows_of_r)?;
    let bv = match opt_input(inputs, 3) {
        Some(b) => {
            expect_shape(b, &[dirs, 2 * g * hid], "B")?;
            floats(b, "B")?
        }
        None => vec![0.0; dirs * 2 * g * hid],
    };
    let lens: Vec<usize> = match opt_input(inputs, 4) {
        Some(l) => {
            expect_shape(l, &[batch], "sequence_lens")?;
            l.to_i64_vec()?
                .iter()
                .map(|&v| {
                    usize::try_from(v)
                        .ok()
                        .filter(|&v| v <= seq)
                        .ok_or_else(|| {
                            OpError::Shape(format!("sequence length {v} outside 0..={seq}"))
                        })
                })
                .collect::<OpResult<_>>()?
        }
        None => vec![seq; batch],
    };
    let state_shape = s.state(r.batch_first);
    // States as [dir][batch][hidden], whatever the layout.
    let state = |i: usize, what: &str| -> OpResult<Vec<f64>> {
        let Some(t) = opt_input(inputs, i) else {
            return Ok(vec![0.0; dirs * batch * hid]);
        };
        expect_shape(t, &state_shape, what)?;
        let v = floats(t, what)?;
        Ok(match r.batch_first {
            false => v,
            true => (0..dirs * batch * hid)
                .map(|k| {
                    let (d, b, j) = (k / (batch * hid), k / hid % batch, k % hid);
                    v[(b * dirs + d) * hid + j]
                })
                .collect(),
        })
    };
    let mut h = state(5, "initial_h")?;
    let lstm = r.cell == Cell::Lstm;
    let mut c = if lstm {
        state(6, "initial_c")?
    } else {
        Vec::new()
    };
    let peep = match opt_input(inputs, 7).filter(|_| lstm) {
        Some(p) => {
            expect_shape(p, &[dirs, 3 * hid], "P")?;
            floats(p, "P")?
        }
        None => vec![0.0; dirs * 3 * hid],
    };
    let mut y = vec![0.0; checked_numel(&s.y(r.batch_first))?];
    let y_at = |t: usize, d: usize, b: usize| match r.batch_first {
        false => ((t * dirs + d) * batch + b) * hid,
        true => ((b * seq + t) * dirs + d) * hid,
    };
    let clip = |v: f64| r.clip.map_or(v, |c| v.clamp(-c, c));
    let mut pre = vec![0.0; g * hid];
    let mut rh = vec![0.0; g * hid];
    let (gh, rows) = (g * hid, seq * batch);
    let (mut h32, mut rh32) = (vec![0f32; hid], vec![0f32; gh]);
    let quantized = r.quantized_r.as_deref().filter(|q| q.fits(dirs, hid, gh));
    let (mut hq, mut packed_h) = (vec![0u8; hid], PackedA::default());
    // Float32 LSTMs with the default activations and no clip compute their gates in f32, a
    // vector at a time, as onnxruntime does; the rest in f64.
    let f32_cell = fast.is_some()
        && r.clip.is_none()
        && r.acts
            .iter()
            .all(|a| a.as_slice() == Cell::Lstm.default_acts());
    let mut z32 = vec![0f32; if f32_cell { gh } else { 0 }];
    for (d, &reverse) in r.passes.iter().enumerate() {
        let acts = &r.acts[d];
        let rw = match rv.is_empty() {
            true => &[][..],
            false => &rv[d * gh * hid..(d + 1) * gh * hid],
        };
        // W x for every step at once, a row per row of X (in X's layout).
        let xw: Vec<f64> = match fast {
            Some((x32, w32, _)) => {
                let mut out = vec![0f32; rows * gh];
                let wd = &w32[d * gh * inp..(d + 1) * gh * inp];
                times_rows(x32, wd, (rows, inp, gh), &mut out);
                out.into_iter().map(f64::from).collect()
            }
            None => {
                let w = &wv[d * gh * inp..(d + 1) * gh * inp];
                (0..rows * gh)
                    .map(|e| {
                        let (row, k) = (e / gh, e % gh);
                        let (xr, wr) =
                            (&xv[row * inp..(row + 1) * inp], &w[k * inp..(k + 1) * inp]);
                        xr.iter().zip(wr).map(|(a, b)| a * b).sum::<f64>()
                    })
                    .collect()
            }
        };
        let (wb, rb) = (
            &bv[d * 2 * g * hid..(d * 2 + 1) * g * hid],
            &bv[(d * 2 + 1) * g * hid..(d * 2 + 2) * g * hid],
        );
        let p = &peep[d * 3 * hid..(d + 1) * 3 * hid];
        for (b, &len) in lens.iter().enumerate() {
            let hs = &mut h[(d * batch + b) * hid..(d * batch + b + 1) * hid];
            for step in 0..len {
                let t = if reverse { len - 1 - step } else { step };
                let row = match r.batch_first {
                    false => t * batch + b,
                    true => b * seq + t,
                };
                // W x + Wb and R h + Rb, per gate row.
                for k in 0..gh {
                    pre[k] = xw[row * gh + k] + wb[k];
                }
                match fast {
                    Some((_, _, r32)) => {
                        for (a, &v) in h32.iter_mut().zip(hs.iter()) {
                            *a = v as f32;
                        }
                        let in_8_bits = quantized
                            .is_some_and(|q| q.times(d, &h32, &mut hq, &mut packed_h, &mut rh32));
                        if !in_8_bits {
                            let rd = &r32[d * gh * hid..(d + 1) * gh * hid];
                            times_rows(&h32, rd, (1, hid, gh), &mut rh32);
                        }
                        for k in 0..gh {
                            rh[k] = f64::from(rh32[k]) + rb[k];
                        }
                    }
                    None => {
                        for k in 0..gh {
                            let rr = &rw[k * hid..(k + 1) * hid];
                            rh[k] =
                                rr.iter().zip(hs.iter()).map(|(a, b)| a * b).sum::<f64>() + rb[k];
                        }
                    }
                }
                match r.cell {
                    Cell::Rnn => {
                        for j in 0..hid {
                            hs[j] = acts[0].apply(clip(pre[j] + rh[j]));
                        }
                    }
                    Cell::Gru {
                        linear_before_reset,
                    } => {
                        let (f, gg) = (acts[0], acts[1]);
                        let z: Vec<f64> = (0..hid).map(|j| f.apply(clip(pre[j] + rh[j]))).collect();
                        let rs: Vec<f64> = (0..hid)
                            .map(|j| f.apply(clip(pre[hid + j] + rh[hid + j])))
                            .collect();
                        let cand: Vec<f64> = if linear_before_reset {
                            (0..hid)
                                .map(|j| gg.apply(clip(pre[2 * hid + j] + rs[j] * rh[2 * hid + j])))
                                .collect()
                        } else {
                            // R_h (r ⊙ h) + Rb_h.
                            let rh_rows = &rw[2 * hid * hid..3 * hid * hid];
                            (0..hid)
                                .map(|j| {
                                    let row = &rh_rows[j * hid..(j + 1) * hid];
                                    let v: f64 = (0..hid).map(|k| row[k] * rs[k] * hs[k]).sum();
                                    gg.apply(clip(pre[2 * hid + j] + v + rb[2 * hid + j]))
                                })
                                .collect()
                        };
                        for j in 0..hid {
                            hs[j] = (1.0 - z[j]) * cand[j] + z[j] * hs[j];
                        }
                    }
                    Cell::Lstm if f32_cell => {
                        let cs = &mut c[(d * batch + b) * hid..(d * batch + b + 1) * hid];
                        lstm_cell_f32(&pre, &rh, p, cs, hs, &mut z32);
                    }
                    Cell::Lstm => {
                        let (f, gg, hh) = (acts[0], acts[1], acts[2]);
                        let cs = &mut c[(d * batch + b) * hid..(d * batch + b + 1) * hid];
                        // Gate blocks: input, output, forget, cell; peepholes: input, output,
                        // forget.
                        for j in 0..hid {
                            let gate = |k: usize| pre[k * hid + j] + rh[k * hid + j];
                            let i = f.apply(clip(gate(0) + p[j] * cs[j]));
                            let fg = f.apply(clip(gate(2) + p[2 * hid + j] * cs[j]));
                            let cand = gg.apply(clip(gate(3)));
                            cs[j] = fg * cs[j] + i * cand;
                            let o = f.apply(clip(gate(1) + p[hid + j] * cs[j]));
                            hs[j] = o * hh.apply(cs[j]);
                        }
                    }
                }
                let at = y_at(t, d, b);
                y[at..at + hid].copy_from_slice(hs);
            }
        }
    }
    let dtype = x.dtype();
    let out = |shape: Vec<usize>, v: Vec<f64>| -> OpResult<Tensor> {
        match dtype {
            DType::F64 => Tensor::new(shape, Data::F64(v)),
            _ => Tensor::f32(shape, v.into_iter().map(|e| e as f32).collect()),
        }
    };
    // States back in the layout's order.
    let relayout = |v: Vec<f64>| -> Vec<f64> {
        match r.batch_first {
            false => v,
            true => (0..dirs * batch * hid)
                .map(|k| {
                    let (b, d, j) = (k / (dirs * hid), k / hid % dirs, k % hid);
                    v[(d * batch + b) * hid + j]
                })
                .collect(),
        }
    };
    let mut outs = vec![
        out(s.y(r.batch_first), y)?,
        out(state_shape.clone(), relayout(h))?,
    ];
    if lstm {
        outs.push(out(state_shape, relayout(c))?);
    }
    Ok(outs)
}

/// One step of an LSTM with the default activations, in f32: `pre` is `W x + Wb`, `rh` is
/// `R h + Rb` (gate blocks input, output, forget, cell), `p` the peepholes (input, output,
/// forget); updates the cell state `c` and the hidden state `h`. `z` is scratch of `pre`'s
/// length.
fn lstm_cell_f32(pre: &[f64], rh: &[f64], p: &[f64], c: &mut [f64], h: &mut [f64], z: &mut [f32]) {
    let hid = c.len();
    for ((z, &a), &b) in z.iter_mut().zip(pre).zip(rh) {
        *z = (a + b) as f32;
    }
    let (zi, rest) = z.split_at_mut(hid);
    let (zo, rest) = rest.split_at_mut(hid);
    let (zf, zg) = rest.split_at_mut(hid);
    for j in 0..hid {
        zi[j] += (p[j] * c[j]) as f32;
        zf[j] += (p[2 * hid + j] * c[j]) as f32;
    }
    map_inplace(1, zi, sigmoid);
    map_inplace(1, zf, sigmoid);
    map_inplace(1, zg, tanh);
    for j in 0..hid {
        let cj = zf[j] * c[j] as f32 + zi[j] * zg[j];
        c[j] = f64::from(cj);
        zo[j] += (p[hid + j] * c[j]) as f32;
        // The new cell state, through tanh below, in the forget gate's place.
        zf[j] = cj;
    }
    map_inplace(1, zo, sigmoid);
    map_inplace(1, zf, tanh);
    for j in 0..hid {
        h[j] = f64::from(zo[j] * zf[j]);
    }
}

/// `out = x · wᵀ` for `x` `[m, k]` and weights `w` `[n, k]` (a gate row each): with the dense
/// kernel, `w`'s rows are read where they lie, where a GEMM would pack all of them again at
/// every call (every step, for R).
fn times_rows(x: &[f32], w: &[f32], (m, k, n): (usize, usize, usize), out: &mut [f32]) {
    if dense::available() {
        dense::dense(x, w, (m, k, n), out, 1);
    } else {
        let (xm, wm) = (Mat::row_major(x, k), Mat::transposed(w, k));
        sgemm(1, m, n, k, xm, wm, out, n, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], seed: u32) -> Tensor {
        let n: usize = shape.iter().product();
        let v = (0..n)
            .map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) % 1000)
            .map(|k| k as f32 / 1000.0 - 0.5)
            .collect();
        Tensor::f32(shape.to_vec(), v).unwrap()
    }

    /// `t` with its first two axes swapped.
    fn swap01(x: &Tensor) -> Tensor {
        let (a, b, rest) = (
            x.shape[0],
            x.shape[1],
            x.shape[2..].iter().product::<usize>(),
        );
        let v = x.as_f32().unwrap();
        let mut out = Vec::with_capacity(v.len());
        for j in 0..b {
            for i in 0..a {
                out.extend_from_slice(&v[(i * b + j) * rest..(i * b + j + 1) * rest]);
            }
        }
        let mut shape = x.shape.clone();
        shape.swap(0, 1);
        Tensor::f32(shape, out).unwrap()
    }

    #[test]
    fn batch_first_layout_is_the_same_run_transposed() {
        let (seq, batch, inp, hid) = (4, 3, 2, 2);
        let mut attrs = RnnAttrs {
            cell: Cell::Lstm,
            hidden: Some(hid),
            passes: vec![false, true],
            acts: vec![Cell::Lstm.default_acts().to_vec(); 2],
            clip: None,
            batch_first: false,
            quantized_r: None,
        };
        let x = t(&[seq, batch, inp], 1);
        let w = t(&[2, 4 * hid, inp], 2);
        let r = t(&[2, 4 * hid, hid], 3);
        let b = t(&[2, 8 * hid], 4);
        let lens = Tensor::new(vec![batch], Data::I32(vec![4, 1, 3])).unwrap();
        let (h0, c0) = (t(&[2, batch, hid], 5), t(&[2, batch, hid], 6));
        let p = t(&[2, 3 * hid], 7);
        let run = |a: &RnnAttrs, x: &Tensor, h0: &Tensor, c0: &Tensor| {
            let ins = [x, &w, &r, &b, &lens, h0, c0, &p].map(Some);
            rnn(a, &ins).unwrap()
        };
        let seq_first = run(&attrs, &x, &h0, &c0);
        attrs.batch_first = true;
        let batch_first = run(&attrs, &swap01(&x), &swap01(&h0), &swap01(&c0));
        // Y: [seq, dirs, batch, hidden] against [batch, seq, dirs, hidden].
        let y = &seq_first[0];
        let yb = batch_first[0].as_f32().unwrap();
        for (k, &v) in y.as_f32().unwrap().iter().enumerate() {
            let (s, d, bi, j) = (
                k / (2 * batch * hid),
                k / (batch * hid) % 2,
                k / hid % batch,
                k % hid,
            );
            assert_eq!(v, yb[((bi * seq + s) * 2 + d) * hid + j]);
        }
        // Steps past a sequence's end are zeros.
        assert!(
            y.as_f32().unwrap()[(2 * 2 * batch + batch + 1) * hid..][..hid]
                .iter()
                .all(|&v| v == 0.0)
        );
        assert_eq!(swap01(&seq_first[1]), batch_first[1]);
        assert_eq!(swap01(&seq_first[2]), batch_first[2]);
    }

    #[test]
    fn unsupported_attributes_are_refused_by_name() {
        use crate::proto::AttributeProto;
        let attr = |name: &str, i: i64| AttributeProto {
            name: name.into(),
            r#type: 2,
            i,
            ..Default::default()
        };
        for (op, a, what) in [
            ("LSTM", attr("input_forget", 1), "input_forget"),
            ("RNN", attr("layout", 2), "layout"),
            ("GRU", attr("hidden_size", 0), "hidden_size"),
        ] {
            let list = [a];
            let e = RnnAttrs::parse(op, &Attrs { list: &list }).unwrap_err();
            assert!(e.contains(what), "{e}");
        }
        let alpha = AttributeProto {
            name: "activation_alpha".into(),
            r#type: 6,
            floats: vec![0.5],
            ..Default::default()
        };
        let list = [alpha];
        let e = RnnAttrs::parse("RNN", &Attrs { list: &list }).unwrap_err();
        assert!(e.contains("activation_alpha"), "{e}");
    }

    #[test]
    fn an_8_bit_recurrent_product_is_within_a_quantization_step_and_leaves_non_finite_states() {
        let (hid, gh) = (5, 12);
        let q: Vec<i8> = (0..hid * gh).map(|i| (i * 37 % 255) as i8).collect();
        let zeros: Vec<i8> = (0..gh).map(|j| j as i8 - 6).collect();
        let scales: Vec<f32> = (0..gh).map(|j| 0.01 + j as f32 * 0.001).collect();
        let r8 = QuantizedR {
            packs: vec![PackedB::new(hid, gh, &q, (gh, 1), &zeros)],
            scales: scales.clone(),
        };
        let (mut hq, mut a, mut out) = (vec![0; hid], PackedA::default(), vec![0f32; gh]);
        let h = [0.3f32, -0.9, 0.05, 0.0, 0.7];
        assert!(r8.times(0, &h, &mut hq, &mut a, &mut out));
        for j in 0..gh {
            let want: f32 = (0..hid)
                .map(|k| h[k] * (q[k * gh + j] as f32 - zeros[j] as f32) * scales[j])
                .sum();
            let bound: f32 = (0..hid)
                .map(|k| (q[k * gh + j] as f32 - zeros[j] as f32).abs() * scales[j])
                .sum::<f32>()
                * (1.6 / 255.0);
            assert!(
                (out[j] - want).abs() <= bound,
                "{j}: {} against {want}",
                out[j]
            );
        }
        assert!(r8.times(0, &[0.0; 5], &mut hq, &mut a, &mut out));
        assert!(out.iter().all(|&v| v == 0.0));
        let nan = [0.1, f32::NAN, 0.0, 0.0, 0.0];
        assert!(
            !r8.times(0, &nan, &mut hq, &mut a, &mut out),
            "left to the float product"
        );
    }
}
