//! Ops that select or place elements by position: TopK, ArgMax/ArgMin, Hardmax,
//! GatherElements, GatherND, ScatterElements (and the older Scatter), ScatterND, NonZero,
//! OneHot, Compress, ReverseSequence and Unique. Every index
//! read from a tensor is checked against the dimension it addresses: an index out of range is
//! an error naming the op, never a read or write out of bounds.

use super::arg_extreme::arg_positions_f32;
use super::elementwise::{Num, is_nan};
use super::input;
use crate::error::{OpError, OpResult, shape_err};
use crate::ops::attrs::Attrs;
use crate::tensor::{DType, Data, Tensor, axis_in, checked_numel, norm_axis, strides};
use crate::with_data;
use std::borrow::Cow;
use std::cmp::Ordering;

/// How ScatterElements and ScatterND combine an update with the value it lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// The update replaces the value.
    None,
    Add,
    Mul,
    Max,
    Min,
}

impl Reduction {
    /// The `reduction` attribute: add and mul since opset 16, max and min since 18.
    fn parse(a: &Attrs, opset: i64) -> Result<Reduction, String> {
        let name = a.string_or("reduction", "none")?;
        let (r, since) = match name.as_str() {
            "none" => (Reduction::None, 0),
            "add" => (Reduction::Add, 16),
            "mul" => (Reduction::Mul, 16),
            "max" => (Reduction::Max, 18),
            "min" => (Reduction::Min, 18),
            _ => {
                return Err(format!(
                    "attribute \"reduction\" is {name:?}, not none, add, mul, max or min"
                ));
            }
        };
        if opset < since {
            return Err(format!(
                "attribute \"reduction\" {name:?} needs opset {since}"
            ));
        }
        Ok(r)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum IndexOp {
    /// `k` is the attribute of opset 1; later opsets read it from input 1. The k elements are
    /// always returned sorted, which is also a valid answer for `sorted=0`.
    TopK {
        axis: i64,
        largest: bool,
        k: Option<i64>,
    },
    /// ArgMax (`max`) or ArgMin; `last` is `select_last_index`.
    ArgExtreme {
        max: bool,
        axis: i64,
        keepdims: bool,
        last: bool,
    },
    GatherElements {
        axis: i64,
    },
    GatherNd {
        batch_dims: usize,
    },
    ScatterElements {
        axis: i64,
        reduction: Reduction,
    },
    ScatterNd {
        reduction: Reduction,
    },
    NonZero,
    OneHot {
        axis: i64,
    },
    /// A one where ArgMax (the first largest) is along `axis`, zeros elsewhere; `legacy`
    /// (before opset 13): along the input coerced to 2-D at `axis`.
    Hardmax {
        axis: i64,
        legacy: bool,
    },
    /// The slices along `axis` (of the flattened input, if none) where the condition is true.
    Compress {
        axis: Option<i64>,
    },
    /// The first `sequence_lens[b]` steps along `time_axis` reversed in every batch entry `b`.
    ReverseSequence {
        batch_axis: i64,
        time_axis: i64,
    },
    /// The distinct slices along `axis` (elements of the flattened input, if none), sorted or
    /// in order of first occurrence, with their first positions, the position of every input
    /// slice among them, and their counts.
    Unique {
        axis: Option<i64>,
        sorted: bool,
    },
}

impl IndexOp {
    pub fn parse(op: &str, a: &Attrs, opset: i64) -> Result<Option<IndexOp>, String> {
        Ok(Some(match op {
            "TopK" => IndexOp::TopK {
                axis: a.int_or("axis", -1)?,
                // `largest` and `sorted` exist since opset 11.
                largest: opset < 11 || a.int_or("largest", 1)? != 0,
                k: if opset < 10 {
                    Some(a.int("k")?.ok_or("TopK needs the attribute \"k\"")?)
                } else {
                    None
                },
            },
            "ArgMax" | "ArgMin" => IndexOp::ArgExtreme {
                max: op == "ArgMax",
                axis: a.int_or("axis", 0)?,
                keepdims: a.int_or("keepdims", 1)? != 0,
                last: a.int_or("select_last_index", 0)? != 0,
            },
            "GatherElements" => IndexOp::GatherElements {
                axis: a.int_or("axis", 0)?,
            },
            "GatherND" => IndexOp::GatherNd {
                batch_dims: usize::try_from(a.int_or("batch_dims", 0)?)
                    .map_err(|_| "attribute \"batch_dims\" is negative")?,
            },
            // Scatter is ScatterElements under its name before opset 11.
            "ScatterElements" | "Scatter" => IndexOp::ScatterElements {
                axis: a.int_or("axis", 0)?,
                reduction: Reduction::parse(a, opset)?,
            },
            "ScatterND" => IndexOp::ScatterNd {
                reduction: Reduction::parse(a, opset)?,
            },
            "NonZero" => IndexOp::NonZero,
            "OneHot" => IndexOp::OneHot {
                axis: a.int_or("axis", -1)?,
            },
            "Hardmax" => IndexOp::Hardmax {
                axis: a.int_or("axis", if opset < 13 { 1 } else { -1 })?,
                legacy: opset < 13,
            },
            "Compress" => IndexOp::Compress {
                axis: a.int("axis")?,
            },
            "ReverseSequence" => IndexOp::ReverseSequence {
                batch_axis: a.int_or("batch_axis", 1)?,
                time_axis: a.int_or("time_axis", 0)?,
            },
            "Unique" => IndexOp::Unique {
                axis: a.int("axis")?,
                sorted: a.int_or("sorted", 1)? != 0,
            },
            _ => return Ok(None),
        }))
    }

    pub fn name(&self) -> &'static str {
        match self {
            IndexOp::TopK { .. } => "TopK",
            IndexOp::ArgExtreme { max: true, .. } => "ArgMax",
            IndexOp::ArgExtreme { max: false, .. } => "ArgMin",
            IndexOp::GatherElements { .. } => "GatherElements",
            IndexOp::GatherNd { .. } => "GatherND",
            IndexOp::ScatterElements { .. } => "ScatterElements",
            IndexOp::ScatterNd { .. } => "ScatterND",
            IndexOp::NonZero => "NonZero",
            IndexOp::OneHot { .. } => "OneHot",
            IndexOp::Hardmax { .. } => "Hardmax",
            IndexOp::Compress { .. } => "Compress",
            IndexOp::ReverseSequence { .. } => "ReverseSequence",
            IndexOp::Unique { .. } => "Unique",
        }
    }

    pub fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = || input(inputs, 0);
        let one = |t: OpResult<Tensor>| t.map(|t| vec![t]);
        match self {
            IndexOp::TopK { axis, largest, k } => {
                let k = match k {
                    Some(k) => *k,
                    None => single_int(input(inputs, 1)?, "TopK k")?,
                };
                top_k(x()?, k, *axis, *largest)
            }
            IndexOp::ArgExtreme {
                max,
                axis,
                keepdims,
                last,
            } => one(arg_extreme(x()?, *max, *axis, *keepdims, *last)),
            IndexOp::GatherElements { axis } => {
                one(gather_elements(x()?, input(inputs, 1)?, *axis))
            }
            IndexOp::GatherNd { batch_dims } => {
                one(gather_nd(x()?, input(inputs, 1)?, *batch_dims))
            }
            IndexOp::ScatterElements { axis, reduction } => one(scatter_elements(
                x()?,
                input(inputs, 1)?,
                input(inputs, 2)?,
                *axis,
                *reduction,
            )),
            IndexOp::ScatterNd { reduction } => one(scatter_nd(
                x()?,
                input(inputs, 1)?,
                input(inputs, 2)?,
                *reduction,
            )),
            IndexOp::NonZero => one(non_zero(x()?)),
            IndexOp::OneHot { axis } => {
                one(one_hot(x()?, input(inputs, 1)?, input(inputs, 2)?, *axis))
            }
            IndexOp::Hardmax { axis, legacy } => one(hardmax(x()?, *axis, *legacy)),
            IndexOp::Unique { axis, sorted } => unique(x()?, *axis, *sorted),
            IndexOp::Compress { axis } => one(compress(x()?, input(inputs, 1)?, *axis)),
            IndexOp::ReverseSequence {
                batch_axis,
                time_axis,
            } => one(reverse_sequence(
                x()?,
                input(inputs, 1)?,
                *batch_axis,
                *time_axis,
            )),
        }
    }
}

/// The one integer of a scalar or one-element tensor (TopK's k).
fn single_int(t: &Tensor, what: &str) -> OpResult<i64> {
    match t.to_i64_vec()?.as_slice() {
        [v] => Ok(*v),
        v => shape_err(format!("{what} must hold one value, not {}", v.len())),
    }
}

/// `i` (negative counts from the end) as a position in a dimension of `d`.
fn fix_index(i: i64, d: usize, op: &str) -> OpResult<usize> {
    let d64 = i64::try_from(d).map_err(|_| OpError::TooLarge(d))?;
    let j = if i < 0 { i + d64 } else { i };
    if (0..d64).contains(&j) {
        Ok(j as usize)
    } else {
        shape_err(format!(
            "{op} index {i} is out of range for a dimension of {d}"
        ))
    }
}

/// Calls `f` with every multi-index of `shape`, in row-major order.
pub(crate) fn each_index(
    shape: &[usize],
    mut f: impl FnMut(&[usize]) -> OpResult<()>,
) -> OpResult<()> {
    if shape.contains(&0) {
        return Ok(());
    }
    let mut pos = vec![0usize; shape.len()];
    loop {
        f(&pos)?;
        let mut ax = shape.len();
        loop {
            if ax == 0 {
                return Ok(());
            }
            ax -= 1;
            pos[ax] += 1;
            if pos[ax] < shape[ax] {
                break;
            }
            pos[ax] = 0;
        }
    }
}

/// A total order for sorting: NaN above every number (as numpy sorts), equal to itself.
fn nan_high<T: PartialOrd>(a: T, b: T) -> Ordering {
    a.partial_cmp(&b)
        .unwrap_or_else(|| is_nan(a).cmp(&is_nan(b)))
}

/// Outer, axis and inner sizes of `shape` around `axis`.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

fn top_k(x: &Tensor, k: i64, axis: i64, largest: bool) -> OpResult<Vec<Tensor>> {
    if x.dtype() == DType::Bool {
        return Err(OpError::DType("TopK of bool".into()));
    }
    let axis = axis_in(axis, x.rank())?;
    let (outer, n, inner) = around(&x.shape, axis);
    let k = usize::try_from(k).ok().filter(|&k| k <= n).ok_or_else(|| {
        OpError::Shape(format!(
            "TopK k {k} is outside 0..={n}, the size of axis {axis}"
        ))
    })?;
    let mut shape = x.shape.clone();
    shape[axis] = k;
    checked_numel(&shape)?;
    let picks = with_data!(&x.data, v => top_k_positions(v, outer, n, inner, k, largest));
    let mut src = Vec::with_capacity(picks.len());
    for (at, &j) in picks.iter().enumerate() {
        let (o, i) = (at / inner.max(1) / k.max(1), at % inner.max(1));
        src.push((o * n + j) * inner + i);
    }
    let indices = picks.iter().map(|&j| j as i64).collect();
    Ok(vec![
        Tensor::new(shape.clone(), x.data.gather(&src))?,
        Tensor::new(shape, Data::I64(indices))?,
    ])
}

/// For every output position of TopK (in the output's row-major order), the position along
/// the axis it takes its element from. Ties go to the lower position.
fn top_k_positions<T: Copy + PartialOrd>(
    v: &[T],
    outer: usize,
    n: usize,
    inner: usize,
    k: usize,
    largest: bool,
) -> Vec<usize> {
    let mut out = vec![0usize; outer * k * inner];
    if k == 0 {
        return out;
    }
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| v[(o * n + j) * inner + i];
            let cmp = |a: &usize, b: &usize| {
                let c = nan_high(at(*a), at(*b));
                let c = if largest { c.reverse() } else { c };
                c.then(a.cmp(b))
            };
            order.clear();
            order.extend(0..n);
            // The order is total (ties broken by position), so a partial selection followed by
            // a sort of the first k gives exactly what a full sort would.
            if k < n {
                order.select_nth_unstable_by(k - 1, cmp);
            }
            order[..k].sort_unstable_by(cmp);
            for (r, &j) in order[..k].iter().enumerate() {
                out[(o * k + r) * inner + i] = j;
            }
        }
    }
    out
}

fn arg_extreme(x: &Tensor, max: bool, axis: i64, keepdims: bool, last: bool) -> OpResult<Tensor> {
    let name = if max { "ArgMax" } else { "ArgMin" };
    if x.dtype() == DType::Bool {
        return Err(OpError::DType(format!("{name} of bool")));
    }
    let axis = axis_in(axis, x.rank())?;
    let (outer, n, inner) = around(&x.shape, axis);
    if n == 0 && outer * inner > 0 {
        return shape_err(format!("{name} over axis {axis} of size 0"));
    }
    let mut shape = x.shape.clone();
    if keepdims {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    let out = match &x.data {
        Data::F32(v) if n > 0 => arg_positions_f32(v, outer, n, inner, max, last),
        d => with_data!(d, v => arg_positions(v, outer, n, inner, max, last)),
    };
    Tensor::new(shape, Data::I64(out))
}

fn hardmax(x: &Tensor, axis: i64, legacy: bool) -> OpResult<Tensor> {
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Err(OpError::DType(format!("Hardmax of {:?}", x.dtype())));
    }
    let axis = axis_in(axis, x.rank())?;
    let (outer, n, inner) = match legacy {
        true => (
            x.shape[..axis].iter().product(),
            x.shape[axis..].iter().product(),
            1,
        ),
        false => around(&x.shape, axis),
    };
    let mut hot = vec![0.0; x.len()];
    if n > 0 {
        let picks = with_data!(&x.data, v => arg_positions(v, outer, n, inner, true, false));
        for (k, &j) in picks.iter().enumerate() {
            hot[(k / inner * n + j as usize) * inner + k % inner] = 1.0;
        }
    }
    let hot = Tensor::new(x.shape.clone(), Data::F64(hot))?;
    Ok(super::elementwise::cast(&hot, x.dtype()))
}

fn compress(x: &Tensor, condition: &Tensor, axis: Option<i64>) -> OpResult<Tensor> {
    let (Data::Bool(keep), 1) = (&condition.data, condition.rank()) else {
        return Err(OpError::DType(format!(
            "Compress condition must be a bool vector, not {:?} {:?}",
            condition.dtype(),
            condition.shape
        )));
    };
    let (x, axis) = on_axis(x, axis)?;
    let x: &Tensor = &x;
    let (outer, n, inner) = around(&x.shape, axis);
    if keep.len() > n {
        return shape_err(format!(
            "Compress condition of {} entries for an axis of {n}",
            keep.len()
        ));
    }
    let kept: Vec<usize> = (0..keep.len()).filter(|&j| keep[j]).collect();
    let mut at = Vec::with_capacity(outer * kept.len() * inner);
    for o in 0..outer {
        for &j in &kept {
            let start = (o * n + j) * inner;
            at.extend(start..start + inner);
        }
    }
    let mut shape = x.shape.clone();
    shape[axis] = kept.len();
    Tensor::new(shape, x.data.gather(&at))
}

/// `x` and the axis an op works along: `axis` normalised, or `x` flattened when none is given.
fn on_axis(x: &Tensor, axis: Option<i64>) -> OpResult<(Cow<'_, Tensor>, usize)> {
    Ok(match axis {
        Some(a) => (Cow::Borrowed(x), axis_in(a, x.rank())?),
        None => (Cow::Owned(x.clone().reshaped(vec![x.len()])?), 0),
    })
}

fn unique(x: &Tensor, axis: Option<i64>, sorted: bool) -> OpResult<Vec<Tensor>> {
    let (x, axis) = on_axis(x, axis)?;
    let x: &Tensor = &x;
    let (outer, n, inner) = around(&x.shape, axis);
    // The flat positions of slice `k` along the axis, in row-major order.
    let slice =
        |k: usize| (0..outer).flat_map(move |o| (0..inner).map(move |i| (o * n + k) * inner + i));
    // Slices in ascending order (NaN above numbers and equal to itself), ties by position.
    let mut order: Vec<usize> = (0..n).collect();
    let mut same = vec![false; n];
    with_data!(&x.data, v => {
        let cmp = |a: usize, b: usize| {
            slice(a)
                .zip(slice(b))
                .map(|(i, j)| nan_high(v[i], v[j]))
                .find(|o| o.is_ne())
                .unwrap_or(Ordering::Equal)
        };
        order.sort_by(|&a, &b| cmp(a, b).then(a.cmp(&b)));
        for w in 1..n {
            same[w] = cmp(order[w - 1], order[w]).is_eq();
        }
    });
    // Groups of equal slices: each group's first member is its first occurrence.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (w, &k) in order.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if same[w] => g.push(k),
            _ => groups.push(vec![k]),
        }
    }
    if !sorted {
        groups.sort_by_key(|g| g[0]);
    }
    let mut inverse = vec![0i64; n];
    for (at, g) in groups.iter().enumerate() {
        for &k in g {
            inverse[k] = at as i64;
        }
    }
    let mut picks = Vec::with_capacity(outer * groups.len() * inner);
    for o in 0..outer {
        for g in &groups {
            let start = (o * n + g[0]) * inner;
            picks.extend(start..start + inner);
        }
    }
    let mut shape = x.shape.clone();
    shape[axis] = groups.len();
    let ints = |v: Vec<i64>| Tensor::i64(vec![v.len()], v);
    Ok(vec![
        Tensor::new(shape, x.data.gather(&picks))?,
        ints(groups.iter().map(|g| g[0] as i64).collect())?,
        ints(inverse)?,
        ints(groups.iter().map(|g| g.len() as i64).collect())?,
    ])
}

fn reverse_sequence(x: &Tensor, lens: &Tensor, batch: i64, time: i64) -> OpResult<Tensor> {
    let (b, t) = (axis_in(batch, x.rank())?, axis_in(time, x.rank())?);
    if b == t {
        return shape_err(format!("ReverseSequence batch and time are both axis {b}"));
    }
    let lens = lens.to_i64_vec()?;
    if lens.len() != x.shape[b] {
        return shape_err(format!(
            "ReverseSequence has {} sequence lengths for a batch of {}",
            lens.len(),
            x.shape[b]
        ));
    }
    let steps = x.shape[t];
    let lens = lens
        .iter()
        .map(|&l| usize::try_from(l).ok().filter(|&l| l <= steps))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| {
            OpError::Shape(format!(
                "ReverseSequence lengths {lens:?} outside 0..={steps}"
            ))
        })?;
    let st = strides(&x.shape);
    let mut at = Vec::with_capacity(x.len());
    each_index(&x.shape, |pos| {
        let (l, p) = (lens[pos[b]], pos[t]);
        let from = if p < l { l - 1 - p } else { p };
        let off: usize = pos.iter().zip(&st).map(|(i, s)| i * s).sum();
        at.push(off - p * st[t] + from * st[t]);
        Ok(())
    })?;
    Tensor::new(x.shape.clone(), x.data.gather(&at))
}

/// The position of the largest (`max`) or smallest element along the axis, the first or the
/// `last` of equals; NaN counts as the extreme, as in numpy.
pub(super) fn arg_positions<T: Copy + PartialOrd>(
    v: &[T],
    outer: usize,
    n: usize,
    inner: usize,
    max: bool,
    last: bool,
) -> Vec<i64> {
    // How much more extreme `a` is than `b`.
    let beyond = |a: T, b: T| match (is_nan(a), is_nan(b)) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ if max => nan_high(a, b),
        _ => nan_high(b, a),
    };
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| v[(o * n + j) * inner + i];
            let mut best = 0;
            for j in 1..n {
                match beyond(at(j), at(best)) {
                    Ordering::Greater => best = j,
                    Ordering::Equal if last => best = j,
                    _ => {}
                }
            }
            out.push(best as i64);
        }
    }
    out
}

/// For every element of `ind` (same rank as `data`), the flat position in `data` it addresses
/// along `axis` (GatherElements reads there, ScatterElements writes there).
fn element_targets(data: &[usize], ind: &Tensor, axis: i64, op: &str) -> OpResult<Vec<usize>> {
    let r = data.len();
    if r == 0 || ind.rank() != r {
        return shape_err(format!(
            "{op} needs data of rank >= 1 and indices of the same rank, not {data:?} and {:?}",
            ind.shape
        ));
    }
    let axis = axis_in(axis, r)?;
    if (0..r).any(|d| d != axis && ind.shape[d] > data[d]) {
        return shape_err(format!(
            "{op} indices {:?} reach past data {data:?} off axis {axis}",
            ind.shape
        ));
    }
    let ids = ind.to_i64_vec()?;
    let st = strides(data);
    let mut out = Vec::with_capacity(ids.len());
    let mut k = 0;
    each_index(&ind.shape, |pos| {
        let base: usize = (0..r).filter(|&d| d != axis).map(|d| pos[d] * st[d]).sum();
        out.push(base + fix_index(ids[k], data[axis], op)? * st[axis]);
        k += 1;
        Ok(())
    })?;
    Ok(out)
}

fn gather_elements(data: &Tensor, ind: &Tensor, axis: i64) -> OpResult<Tensor> {
    let src = element_targets(&data.shape, ind, axis, "GatherElements")?;
    Tensor::new(ind.shape.clone(), data.data.gather(&src))
}

/// The output shape of GatherND, after every check of the operands' shapes.
pub(crate) fn gather_nd_shape(data: &[usize], ind: &[usize], b: usize) -> OpResult<Vec<usize>> {
    let (r, q) = (data.len(), ind.len());
    if r == 0 || q == 0 || b >= r.min(q) {
        return shape_err(format!(
            "GatherND of {data:?} by {ind:?} with batch_dims {b}"
        ));
    }
    if data[..b] != ind[..b] {
        return shape_err(format!(
            "GatherND batch dimensions differ: {data:?} and {ind:?}"
        ));
    }
    let m = ind[q - 1];
    if m < 1 || m > r - b {
        return shape_err(format!(
            "GatherND index tuples of {m} for data of rank {r} with batch_dims {b}"
        ));
    }
    let mut out = ind[..q - 1].to_vec();
    out.extend(&data[b + m..]);
    checked_numel(&out)?;
    Ok(out)
}

fn gather_nd(data: &Tensor, ind: &Tensor, b: usize) -> OpResult<Tensor> {
    let out = gather_nd_shape(&data.shape, &ind.shape, b)?;
    let q = ind.rank();
    let m = ind.shape[q - 1];
    let slice: usize = data.shape[b + m..].iter().product();
    let batches: usize = ind.shape[..b].iter().product();
    let tuples: usize = ind.shape[b..q - 1].iter().product();
    let batch_stride: usize = data.shape[b..].iter().product();
    let st = strides(&data.shape);
    let ids = ind.to_i64_vec()?;
    let mut src = Vec::with_capacity(checked_numel(&out)?);
    for bi in 0..batches {
        for t in 0..tuples {
            let tuple = &ids[(bi * tuples + t) * m..][..m];
            let mut at = bi * batch_stride;
            for (j, &i) in tuple.iter().enumerate() {
                at += fix_index(i, data.shape[b + j], "GatherND")? * st[b + j];
            }
            src.extend(at..at + slice);
        }
    }
    Tensor::new(out, data.data.gather(&src))
}

fn scatter_elements(
    data: &Tensor,
    ind: &Tensor,
    upd: &Tensor,
    axis: i64,
    red: Reduction,
) -> OpResult<Tensor> {
    if upd.shape != ind.shape {
        return shape_err(format!(
            "ScatterElements updates {:?} differ from indices {:?}",
            upd.shape, ind.shape
        ));
    }
    let at = element_targets(&data.shape, ind, axis, "ScatterElements")?;
    scatter(data, &at, upd, red)
}

fn scatter_nd(data: &Tensor, ind: &Tensor, upd: &Tensor, red: Reduction) -> OpResult<Tensor> {
    let (r, q) = (data.rank(), ind.rank());
    let k = ind.shape.last().copied().unwrap_or(0);
    if r == 0 || q == 0 || k > r {
        return shape_err(format!(
            "ScatterND of {:?} by indices {:?}",
            data.shape, ind.shape
        ));
    }
    let mut want = ind.shape[..q - 1].to_vec();
    want.extend(&data.shape[k..]);
    if upd.shape != want {
        return shape_err(format!(
            "ScatterND updates are {:?} where {want:?} was expected",
            upd.shape
        ));
    }
    let slice: usize = data.shape[k..].iter().product();
    let tuples: usize = ind.shape[..q - 1].iter().product();
    let st = strides(&data.shape);
    let ids = ind.to_i64_vec()?;
    let mut at = Vec::with_capacity(upd.len());
    for t in 0..tuples {
        let mut off = 0;
        for (j, &i) in ids[t * k..][..k].iter().enumerate() {
            off += fix_index(i, data.shape[j], "ScatterND")? * st[j];
        }
        at.extend(off..off + slice);
    }
    scatter(data, &at, upd, red)
}

/// `data` with `upd[i]` combined into position `at[i]`, in order.
fn scatter(data: &Tensor, at: &[usize], upd: &Tensor, red: Reduction) -> OpResult<Tensor> {
    let mut out = data.data.clone();
    macro_rules! typed {
        ($($v:ident),*) => {
            match (&mut out, &upd.data) {
                $((Data::$v(o), Data::$v(u)) => scatter_typed(o, at, u, red),)*
                (Data::Bool(o), Data::Bool(u)) if red == Reduction::None => {
                    for (&t, &u) in at.iter().zip(u) {
                        o[t] = u;
                    }
                }
                (o, u) => {
                    return Err(OpError::DType(format!(
                        "scatter of {:?} updates into {:?} data with reduction {red:?}",
                        u.dtype(),
                        o.dtype()
                    )));
                }
            }
        };
    }
    typed!(F32, F64, I64, I32, I16, I8, U64, U32, U16, U8);
    Tensor::new(data.shape.clone(), out)
}

fn scatter_typed<T: Num>(o: &mut [T], at: &[usize], u: &[T], red: Reduction) {
    for (&t, &u) in at.iter().zip(u) {
        let v = o[t];
        o[t] = match red {
            Reduction::None => u,
            Reduction::Add => v.add(u),
            Reduction::Mul => v.mul(u),
            // NaN wins, as numpy's maximum and minimum have it.
            Reduction::Max | Reduction::Min => {
                let beats = if red == Reduction::Max { u > v } else { u < v };
                if !is_nan(v) && (is_nan(u) || beats) {
                    u
                } else {
                    v
                }
            }
        };
    }
}

fn non_zero(x: &Tensor) -> OpResult<Tensor> {
    let hits: Vec<usize> = with_data!(&x.data, v => v
        .iter()
        .enumerate()
        .filter(|(_, e)| **e != Default::default())
        .map(|(i, _)| i)
        .collect());
    let (r, n) = (x.rank(), hits.len());
    let st = strides(&x.shape);
    let mut out = vec![0i64; checked_numel(&[r, n])?];
    for (c, &p) in hits.iter().enumerate() {
        for d in 0..r {
            out[d * n + c] = ((p / st[d]) % x.shape[d]) as i64;
        }
    }
    Tensor::new(vec![r, n], Data::I64(out))
}

/// OneHot's depth: a positive count from a one-element tensor of any numeric type.
pub(crate) fn one_hot_depth(depth: &Tensor) -> OpResult<usize> {
    match depth.to_f64_vec().as_slice() {
        // NaN fails the comparison too.
        [d] if *d >= 1.0 => Ok(d.min(usize::MAX as f64) as usize),
        [d] => shape_err(format!("OneHot depth {d} is not positive")),
        v => shape_err(format!("OneHot depth must hold one value, not {}", v.len())),
    }
}

/// The output shape of OneHot: the indices' shape with the depth inserted at `axis`.
pub(crate) fn one_hot_shape(ind: &[usize], depth: usize, axis: i64) -> OpResult<Vec<usize>> {
    let axis = norm_axis(axis, ind.len() + 1)?;
    let mut out = ind.to_vec();
    out.insert(axis, depth);
    checked_numel(&out)?;
    Ok(out)
}

fn one_hot(ind: &Tensor, depth: &Tensor, values: &Tensor, axis: i64) -> OpResult<Tensor> {
    if values.len() != 2 {
        return shape_err(format!(
            "OneHot values must be [off, on], not {} values",
            values.len()
        ));
    }
    let depth = one_hot_depth(depth)?;
    let shape = one_hot_shape(&ind.shape, depth, axis)?;
    let axis = norm_axis(axis, ind.rank() + 1)?;
    // Float indices are truncated, as a cast to int64 does.
    let ids: Vec<i64> = match &ind.data {
        Data::F32(_) | Data::F64(_) => ind.to_f64_vec().iter().map(|&v| v as i64).collect(),
        _ => ind.to_i64_vec()?,
    };
    let outer: usize = ind.shape[..axis].iter().product();
    let inner: usize = ind.shape[axis..].iter().product();
    // Which of [off, on] every output element is.
    let mut pick = vec![0usize; checked_numel(&shape)?];
    let d = depth as i64;
    for o in 0..outer {
        for i in 0..inner {
            let v = ids[o * inner + i];
            let v = if v < 0 { v.saturating_add(d) } else { v };
            // Out of [-depth, depth - 1]: all off.
            if (0..d).contains(&v) {
                pick[(o * depth + v as usize) * inner + i] = 1;
            }
        }
    }
    Tensor::new(shape, values.data.gather(&pick))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::f32(shape.to_vec(), v.to_vec()).unwrap()
    }
    fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
        Tensor::i64(shape.to_vec(), v.to_vec()).unwrap()
    }
    fn run(op: IndexOp, ins: &[&Tensor]) -> OpResult<Vec<Tensor>> {
        let refs: Vec<Option<&Tensor>> = ins.iter().copied().map(Some).collect();
        op.eval(&refs)
    }
    fn ints(t: &Tensor) -> Vec<i64> {
        t.to_i64_vec().unwrap()
    }

    #[test]
    fn top_k_breaks_ties_by_position_both_ways() {
        let x = f32s(&[2, 4], &[1., 3., 3., 2., 5., f32::NAN, 0., 5.]);
        let k = i64s(&[1], &[3]);
        let largest = IndexOp::TopK {
            axis: -1,
            largest: true,
            k: None,
        };
        let out = run(largest, &[&x, &k]).unwrap();
        assert_eq!(out[0].shape, vec![2, 3]);
        assert_eq!(ints(&out[1]), vec![1, 2, 3, 1, 0, 3]);
        let v = out[0].as_f32().unwrap();
        assert!(v[3].is_nan() && v[4] == 5.0 && v[5] == 5.0);
        let smallest = IndexOp::TopK {
            axis: 0,
            largest: false,
            k: Some(1),
        };
        let out = run(smallest, &[&x]).unwrap();
        assert_eq!(ints(&out[1]), vec![0, 0, 1, 0]);
        // k past the axis, negative k, a k of several values, bool input: errors.
        for k in [5i64, -1, i64::MAX, i64::MIN] {
            let op = IndexOp::TopK {
                axis: 1,
                largest: true,
                k: Some(k),
            };
            assert!(matches!(run(op, &[&x]), Err(OpError::Shape(_))), "{k}");
        }
        let op = IndexOp::TopK {
            axis: 1,
            largest: true,
            k: None,
        };
        assert!(run(op.clone(), &[&x, &i64s(&[2], &[1, 2])]).is_err());
        assert!(run(op.clone(), &[&x, &Tensor::scalar_f32(1.0)]).is_err());
        let b = Tensor::new(vec![2], Data::Bool(vec![true, false])).unwrap();
        assert!(run(op, &[&b, &i64s(&[1], &[1])]).is_err());
        // k = 0 and an empty axis are fine.
        let empty = f32s(&[2, 0], &[]);
        let op = IndexOp::TopK {
            axis: 1,
            largest: true,
            k: Some(0),
        };
        assert_eq!(run(op, &[&empty]).unwrap()[0].shape, vec![2, 0]);
    }

    #[test]
    fn arg_extremes_pick_first_or_last_of_equals() {
        let x = i64s(&[2, 3], &[4, 9, 9, 1, 1, 0]);
        let arg = |max, axis, keepdims, last| IndexOp::ArgExtreme {
            max,
            axis,
            keepdims,
            last,
        };
        let out = run(arg(true, 1, true, false), &[&x]).unwrap();
        assert_eq!(
            (out[0].shape.clone(), ints(&out[0])),
            (vec![2, 1], vec![1, 0])
        );
        let out = run(arg(true, -1, false, true), &[&x]).unwrap();
        assert_eq!((out[0].shape.clone(), ints(&out[0])), (vec![2], vec![2, 1]));
        let out = run(arg(false, 0, false, true), &[&x]).unwrap();
        assert_eq!(ints(&out[0]), vec![1, 1, 1]);
        let nan = f32s(&[3], &[1., f32::NAN, 7.]);
        assert_eq!(
            ints(&run(arg(true, 0, false, false), &[&nan]).unwrap()[0]),
            [1]
        );
        assert_eq!(
            ints(&run(arg(false, 0, false, false), &[&nan]).unwrap()[0]),
            [1]
        );
        // An axis past the rank, a scalar, an empty axis: errors.
        assert!(run(arg(true, 2, true, false), &[&x]).is_err());
        assert!(run(arg(true, 0, true, false), &[&Tensor::scalar_f32(1.0)]).is_err());
        assert!(run(arg(true, 1, true, false), &[&f32s(&[2, 0], &[])]).is_err());
        assert_eq!(
            run(arg(true, 1, true, false), &[&f32s(&[0, 3], &[])]).unwrap()[0].shape,
            vec![0, 1]
        );
    }

    #[test]
    fn gathers_check_every_index() {
        let data = f32s(&[3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
        let ind = i64s(&[2, 3], &[1, 2, 0, 2, 0, -3]);
        let ge = IndexOp::GatherElements { axis: 0 };
        let out = run(ge.clone(), &[&data, &ind]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[4., 8., 3., 7., 2., 3.]);
        for bad in [3, -4, i64::MAX, i64::MIN] {
            let ind = i64s(&[1, 1], &[bad]);
            assert!(matches!(
                run(ge.clone(), &[&data, &ind]),
                Err(OpError::Shape(_))
            ));
        }
        // Indices wider than the data off the axis, or of another rank.
        assert!(run(ge.clone(), &[&data, &i64s(&[1, 4], &[0; 4])]).is_err());
        assert!(run(ge, &[&data, &i64s(&[3], &[0; 3])]).is_err());

        let data = Tensor::new(vec![2, 2, 2], Data::I32((0..8).collect())).unwrap();
        let nd = |b| IndexOp::GatherNd { batch_dims: b };
        let out = run(nd(0), &[&data, &i64s(&[2, 1, 2], &[0, 1, 1, 0])]).unwrap();
        assert_eq!(out[0].shape, vec![2, 1, 2]);
        assert_eq!(ints(&out[0]), vec![2, 3, 4, 5]);
        let out = run(nd(1), &[&data, &i64s(&[2, 1], &[1, -2])]).unwrap();
        assert_eq!(
            (out[0].shape.clone(), ints(&out[0])),
            (vec![2, 2], vec![2, 3, 4, 5])
        );
        // Out of range, tuples longer than the rank, batch dims that differ or reach too far.
        assert!(run(nd(0), &[&data, &i64s(&[1, 1], &[2])]).is_err());
        assert!(run(nd(0), &[&data, &i64s(&[1, 4], &[0; 4])]).is_err());
        assert!(run(nd(1), &[&data, &i64s(&[3, 1], &[0; 3])]).is_err());
        assert!(run(nd(2), &[&data, &i64s(&[2, 1], &[0; 2])]).is_err());
        assert!(run(nd(0), &[&data, &i64s(&[1, 0], &[])]).is_err());
    }

    #[test]
    fn scatters_reduce_in_order_and_check_every_index() {
        let data = f32s(&[1, 5], &[1., 2., 3., 4., 5.]);
        let ind = i64s(&[1, 2], &[1, -4]);
        let upd = f32s(&[1, 2], &[1.5, 2.5]);
        let se = |reduction| IndexOp::ScatterElements { axis: 1, reduction };
        let out = run(se(Reduction::Add), &[&data, &ind, &upd]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[1., 6., 3., 4., 5.]);
        let out = run(se(Reduction::None), &[&data, &ind, &upd]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[1., 2.5, 3., 4., 5.]);
        let out = run(se(Reduction::Min), &[&data, &ind, &upd]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[1., 1.5, 3., 4., 5.]);
        assert!(
            run(
                se(Reduction::None),
                &[&data, &i64s(&[1, 1], &[5]), &f32s(&[1, 1], &[0.])]
            )
            .is_err()
        );
        assert!(
            run(
                se(Reduction::None),
                &[&data, &ind, &f32s(&[2, 1], &[0., 0.])]
            )
            .is_err()
        );
        // Updates of another type than the data.
        assert!(run(se(Reduction::None), &[&data, &ind, &i64s(&[1, 2], &[0, 0])]).is_err());

        let data = i64s(&[4, 2], &[0; 8]);
        let nd = |reduction| IndexOp::ScatterNd { reduction };
        let ind = i64s(&[2, 1], &[3, -1]);
        let upd = i64s(&[2, 2], &[1, 2, 10, 20]);
        let out = run(nd(Reduction::Add), &[&data, &ind, &upd]).unwrap();
        assert_eq!(ints(&out[0]), vec![0, 0, 0, 0, 0, 0, 11, 22]);
        let ind = i64s(&[1, 2], &[1, 1]);
        let out = run(nd(Reduction::None), &[&data, &ind, &i64s(&[1], &[7])]).unwrap();
        assert_eq!(ints(&out[0]), vec![0, 0, 0, 7, 0, 0, 0, 0]);
        assert!(
            run(
                nd(Reduction::None),
                &[&data, &i64s(&[1, 2], &[4, 0]), &i64s(&[1], &[7])]
            )
            .is_err()
        );
        assert!(
            run(
                nd(Reduction::None),
                &[&data, &i64s(&[1, 3], &[0; 3]), &i64s(&[1], &[7])]
            )
            .is_err()
        );
        assert!(run(nd(Reduction::None), &[&data, &ind, &i64s(&[2], &[7, 7])]).is_err());
    }

    #[test]
    fn non_zero_lists_coordinates_by_axis() {
        let x = Tensor::new(vec![2, 2], Data::Bool(vec![true, false, true, true])).unwrap();
        let out = run(IndexOp::NonZero, &[&x]).unwrap();
        assert_eq!(out[0].shape, vec![2, 3]);
        assert_eq!(ints(&out[0]), vec![0, 1, 1, 0, 0, 1]);
        let s = run(IndexOp::NonZero, &[&Tensor::scalar_f32(3.0)]).unwrap();
        assert_eq!(s[0].shape, vec![0, 1]);
        let nan = run(IndexOp::NonZero, &[&f32s(&[3], &[0., -0., f32::NAN])]).unwrap();
        assert_eq!(ints(&nan[0]), vec![2]);
    }

    #[test]
    fn one_hot_inserts_the_depth_and_turns_off_out_of_range() {
        let ind = i64s(&[3], &[1, -1, 9]);
        let values = f32s(&[2], &[0., 5.]);
        let depth = Tensor::scalar_f32(3.0);
        let op = |axis| IndexOp::OneHot { axis };
        let out = run(op(-1), &[&ind, &depth, &values]).unwrap();
        assert_eq!(out[0].shape, vec![3, 3]);
        assert_eq!(
            out[0].as_f32().unwrap(),
            &[0., 5., 0., 0., 0., 5., 0., 0., 0.]
        );
        let out = run(op(0), &[&ind, &depth, &values]).unwrap();
        assert_eq!(
            out[0].as_f32().unwrap(),
            &[0., 0., 0., 5., 0., 0., 0., 5., 0.]
        );
        // Depth not positive, NaN, huge; values not a pair; an axis past rank + 1.
        for d in [0.0, -2.0, f32::NAN] {
            assert!(run(op(-1), &[&ind, &Tensor::scalar_f32(d), &values]).is_err());
        }
        let huge = i64s(&[], &[1 << 40]);
        assert!(matches!(
            run(op(-1), &[&ind, &huge, &values]),
            Err(OpError::TooLarge(_))
        ));
        assert!(run(op(-1), &[&ind, &depth, &f32s(&[3], &[0., 1., 2.])]).is_err());
        assert!(run(op(2), &[&ind, &depth, &values]).is_err());
    }

    #[test]
    fn compress_and_reverse_sequence_check_their_lengths() {
        let x = Tensor::i64(vec![2, 3], vec![0, 1, 2, 3, 4, 5]).unwrap();
        let cond = |v: Vec<bool>| Tensor::new(vec![v.len()], Data::Bool(v)).unwrap();
        let kept = compress(&x, &cond(vec![false, true]), Some(1)).unwrap();
        assert_eq!(
            (kept.shape.clone(), kept.to_i64_vec()),
            (vec![2, 1], Ok(vec![1, 4]))
        );
        let flat = compress(&x, &cond(vec![true, false, true]), None).unwrap();
        assert_eq!(flat.to_i64_vec(), Ok(vec![0, 2]));
        assert!(compress(&x, &cond(vec![true; 4]), Some(1)).is_err());
        let lens = |v: Vec<i64>| Tensor::i64(vec![v.len()], v).unwrap();
        let rev = reverse_sequence(&x, &lens(vec![3, 2]), 0, 1).unwrap();
        assert_eq!(rev.to_i64_vec(), Ok(vec![2, 1, 0, 4, 3, 5]));
        assert!(reverse_sequence(&x, &lens(vec![4, 0]), 0, 1).is_err());
        assert!(reverse_sequence(&x, &lens(vec![1]), 0, 1).is_err());
        assert!(reverse_sequence(&x, &lens(vec![1, 1]), 1, 1).is_err());
    }

    #[test]
    fn unique_groups_equal_slices_and_nans() {
        let x = Tensor::f32(vec![5], vec![2.0, f32::NAN, 1.0, 2.0, f32::NAN]).unwrap();
        let out = unique(&x, None, false).unwrap();
        let ints = |k: usize| out[k].to_i64_vec().unwrap();
        assert_eq!(out[0].shape, vec![3]);
        assert_eq!(out[0].as_f32().unwrap()[..1], [2.0]);
        assert_eq!(
            (ints(1), ints(2), ints(3)),
            (vec![0, 1, 2], vec![0, 1, 2, 0, 1], vec![2, 2, 1])
        );
        let rows = Tensor::i64(vec![3, 2], vec![5, 1, 0, 9, 5, 1]).unwrap();
        let out = unique(&rows, Some(0), true).unwrap();
        assert_eq!(out[0].to_i64_vec(), Ok(vec![0, 9, 5, 1]));
        assert_eq!(out[2].to_i64_vec(), Ok(vec![1, 0, 1]));
        assert!(unique(&rows, Some(2), true).is_err());
    }
}
