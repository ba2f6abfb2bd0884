//! Data-movement and shape ops: Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Expand, Tile,
//! Concat, Split, Slice, Gather, Pad, CenterCropPad, Shape, Size, ConstantOfShape, Range,
//! DepthToSpace, SpaceToDepth, Trilu and EyeLike. They work on any element type.

use super::elementwise::{Num, broadcast_map, broadcast_shape};
use super::{input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::map_data;
use crate::ops::attrs::Attrs;
use crate::tensor::{DType, Data, Tensor, axis_in, checked_numel, norm_axis, strides};

/// Slice before opset 10: starts, ends and optional axes as attributes.
pub type SliceAttrs = (Vec<i64>, Vec<i64>, Option<Vec<i64>>);

#[derive(Clone, Debug, PartialEq)]
pub enum ShapeOp {
    Reshape {
        allowzero: bool,
    },
    Flatten {
        axis: i64,
    },
    Transpose {
        perm: Option<Vec<usize>>,
    },
    Squeeze {
        axes: Option<Vec<i64>>,
    },
    Unsqueeze {
        axes: Option<Vec<i64>>,
    },
    Expand,
    Tile,
    Concat {
        axis: i64,
    },
    Split {
        axis: i64,
        split: Option<Vec<i64>>,
        outputs: usize,
    },
    Slice {
        attrs: Option<SliceAttrs>,
    },
    Gather {
        axis: i64,
    },
    Pad {
        mode: String,
        pads: Option<Vec<i64>>,
        value: f32,
    },
    /// The input cropped or zero-padded, centred, to the sizes of input 1 along `axes` (all
    /// axes if none).
    CenterCropPad {
        axes: Option<Vec<i64>>,
    },
    Shape {
        start: i64,
        end: Option<i64>,
    },
    Size,
    ConstantOfShape {
        value: Tensor,
    },
    Range,
    /// `crd`: the CRD mode (channel, then the block's row and column); DCR otherwise.
    DepthToSpace {
        blocksize: usize,
        crd: bool,
    },
    SpaceToDepth {
        blocksize: usize,
    },
    Trilu {
        upper: bool,
    },
    /// A matrix of the input's shape with ones on diagonal `k`, of element type `dtype` (the
    /// input's if none).
    EyeLike {
        dtype: Option<DType>,
        k: i64,
    },
    /// A window of the length its scalar input gives, of element type `dtype`; `periodic`
    /// windows are one sample of a window one longer (for spectral analysis), the others are
    /// symmetric.
    Window {
        window: Window,
        periodic: bool,
        dtype: DType,
    },
}

/// The window functions of ONNX's signal operators.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Window {
    Hann,
    Hamming,
    Blackman,
}

/// The required positive `blocksize` of DepthToSpace and SpaceToDepth.
fn blocksize(a: &Attrs) -> Result<usize, String> {
    a.int("blocksize")?
        .and_then(|b| usize::try_from(b).ok())
        .filter(|&b| b > 0)
        .ok_or_else(|| "attribute \"blocksize\" must be given and positive".into())
}

impl ShapeOp {
    pub fn parse(
        op: &str,
        a: &Attrs,
        opset: i64,
        _n_inputs: usize,
        n_outputs: usize,
    ) -> Result<Option<ShapeOp>, String> {
        Ok(Some(match op {
            "Reshape" => ShapeOp::Reshape {
                allowzero: a.int_or("allowzero", 0)? != 0,
            },
            "Flatten" => ShapeOp::Flatten {
                axis: a.int_or("axis", 1)?,
            },
            "Transpose" => ShapeOp::Transpose {
                perm: a.usizes("perm")?,
            },
            "Squeeze" => ShapeOp::Squeeze {
                axes: a.ints("axes")?,
            },
            "Unsqueeze" => ShapeOp::Unsqueeze {
                axes: a.ints("axes")?,
            },
            "Expand" => ShapeOp::Expand,
            "Tile" => ShapeOp::Tile,
            "Concat" => ShapeOp::Concat {
                axis: a.int("axis")?.ok_or("Concat needs an axis")?,
            },
            "Split" => ShapeOp::Split {
                axis: a.int_or("axis", 0)?,
                split: a.ints("split")?,
                outputs: match a.int("num_outputs")? {
                    // More parts than outputs would only allocate parts nobody reads.
                    Some(n) if usize::try_from(n).ok() != Some(n_outputs) => {
                        return Err(format!(
                            "num_outputs {n} for a node with {n_outputs} outputs"
                        ));
                    }
                    _ => n_outputs,
                },
            },
            "Slice" => ShapeOp::Slice {
                attrs: if opset < 10 {
                    Some((
                        a.ints("starts")?.ok_or("Slice needs starts")?,
                        a.ints("ends")?.ok_or("Slice needs ends")?,
                        a.ints("axes")?,
                    ))
                } else {
                    None
                },
            },
            "Gather" => ShapeOp::Gather {
                axis: a.int_or("axis", 0)?,
            },
            "Pad" => {
                let mode = a.string_or("mode", "constant")?;
                if !["constant", "reflect", "edge", "wrap"].contains(&mode.as_str()) {
                    return Err(format!("Pad mode {mode:?}"));
                }
                ShapeOp::Pad {
                    mode,
                    pads: a.ints("pads")?.or(a.ints("paddings")?),
                    value: a.float_or("value", 0.0)?,
                }
            }
            "CenterCropPad" => ShapeOp::CenterCropPad {
                axes: a.ints("axes")?,
            },
            "Shape" => ShapeOp::Shape {
                start: a.int_or("start", 0)?,
                end: a.int("end")?,
            },
            "Size" => ShapeOp::Size,
            "ConstantOfShape" => ShapeOp::ConstantOfShape {
                value: a
                    .tensor("value")?
                    .unwrap_or_else(|| Tensor::scalar_f32(0.0)),
            },
            "Range" => ShapeOp::Range,
            "DepthToSpace" => ShapeOp::DepthToSpace {
                blocksize: blocksize(a)?,
                crd: match a.string_or("mode", "DCR")?.as_str() {
                    "DCR" => false,
                    "CRD" => true,
                    m => return Err(format!("attribute \"mode\" is {m:?}, not DCR or CRD")),
                },
            },
            "SpaceToDepth" => ShapeOp::SpaceToDepth {
                blocksize: blocksize(a)?,
            },
            "Trilu" => ShapeOp::Trilu {
                upper: a.int_or("upper", 1)? != 0,
            },
            "EyeLike" => ShapeOp::EyeLike {
                dtype: match a.int("dtype")? {
                    None => None,
                    Some(d) => Some(DType::from_onnx(d as i32).ok_or_else(|| {
                        format!("attribute \"dtype\": element type {d} is not supported")
                    })?),
                },
                k: a.int_or("k", 0)?,
            },
            "HannWindow" | "HammingWindow" | "BlackmanWindow" => ShapeOp::Window {
                window: match op {
                    "HannWindow" => Window::Hann,
                    "HammingWindow" => Window::Hamming,
                    _ => Window::Blackman,
                },
                periodic: a.flag("periodic", true)?,
                dtype: {
                    let d = a.int_or("output_datatype", 1)?;
                    DType::from_onnx(d as i32).ok_or_else(|| {
                        format!("attribute \"output_datatype\": element type {d} is not supported")
                    })?
                },
            },
            _ => return Ok(None),
        }))
    }

    pub fn name(&self) -> &'static str {
        match self {
            ShapeOp::Reshape { .. } => "Reshape",
            ShapeOp::Flatten { .. } => "Flatten",
            ShapeOp::Transpose { .. } => "Transpose",
            ShapeOp::Squeeze { .. } => "Squeeze",
            ShapeOp::Unsqueeze { .. } => "Unsqueeze",
            ShapeOp::Expand => "Expand",
            ShapeOp::Tile => "Tile",
            ShapeOp::Concat { .. } => "Concat",
            ShapeOp::Split { .. } => "Split",
            ShapeOp::Slice { .. } => "Slice",
            ShapeOp::Gather { .. } => "Gather",
            ShapeOp::Pad { .. } => "Pad",
            ShapeOp::CenterCropPad { .. } => "CenterCropPad",
            ShapeOp::Shape { .. } => "Shape",
            ShapeOp::Size => "Size",
            ShapeOp::ConstantOfShape { .. } => "ConstantOfShape",
            ShapeOp::Range => "Range",
            ShapeOp::DepthToSpace { .. } => "DepthToSpace",
            ShapeOp::SpaceToDepth { .. } => "SpaceToDepth",
            ShapeOp::Trilu { .. } => "Trilu",
            ShapeOp::EyeLike { .. } => "EyeLike",
            ShapeOp::Window { window, .. } => match window {
                Window::Hann => "HannWindow",
                Window::Hamming => "HammingWindow",
                Window::Blackman => "BlackmanWindow",
            },
        }
    }

    /// True when the output is the input with a new shape (the plan may move instead of copy).
    pub fn is_reshape(&self) -> bool {
        matches!(
            self,
            ShapeOp::Reshape { .. }
                | ShapeOp::Flatten { .. }
                | ShapeOp::Squeeze { .. }
                | ShapeOp::Unsqueeze { .. }
        )
    }

    /// The output shape of a reshape-like op on an input of shape `x` (its data is never read,
    /// so a device-resident input is reshaped from its shape alone); `inputs` are the op's
    /// inputs, of which only the shape arguments (1 on) are read.
    pub fn reshape_target(&self, x: &[usize], inputs: &[Option<&Tensor>]) -> OpResult<Vec<usize>> {
        let rank = x.len();
        let len: usize = x.iter().product();
        match self {
            ShapeOp::Reshape { allowzero } => {
                let spec = input(inputs, 1)?.to_i64_vec()?;
                let mut out = Vec::with_capacity(spec.len());
                let mut infer = None;
                for (i, &d) in spec.iter().enumerate() {
                    out.push(match d {
                        0 if !allowzero => *x.get(i).ok_or_else(|| {
                            OpError::Shape(format!("Reshape copies dim {i} of {x:?}"))
                        })?,
                        -1 if infer.is_none() => {
                            infer = Some(i);
                            1
                        }
                        d if d >= 0 => d as usize,
                        d => return shape_err(format!("Reshape to {spec:?}: bad entry {d}")),
                    });
                }
                if let Some(i) = infer {
                    let known = checked_numel(&out)?;
                    if known == 0 || !len.is_multiple_of(known) {
                        return shape_err(format!("cannot reshape {x:?} to {spec:?}"));
                    }
                    out[i] = len / known;
                }
                if checked_numel(&out)? != len {
                    return shape_err(format!("cannot reshape {x:?} to {spec:?}"));
                }
                Ok(out)
            }
            ShapeOp::Flatten { axis } => {
                let a = if *axis < 0 {
                    *axis + rank as i64
                } else {
                    *axis
                };
                if a < 0 || a > rank as i64 {
                    return shape_err(format!("Flatten axis {axis} for rank {rank}"));
                }
                let a = a as usize;
                Ok(vec![checked_numel(&x[..a])?, checked_numel(&x[a..])?])
            }
            ShapeOp::Squeeze { axes } => {
                let axes = axes_of(axes, opt_input(inputs, 1))?;
                let drop: Vec<usize> = match axes {
                    None => (0..rank).filter(|&i| x[i] == 1).collect(),
                    Some(a) => a
                        .iter()
                        .map(|&v| axis_in(v, rank))
                        .collect::<OpResult<_>>()?,
                };
                for &d in &drop {
                    if x[d] != 1 {
                        return shape_err(format!("Squeeze axis {d} of {:?} is not 1", x));
                    }
                }
                Ok(x.iter()
                    .enumerate()
                    .filter(|(i, _)| !drop.contains(i))
                    .map(|(_, &d)| d)
                    .collect())
            }
            ShapeOp::Unsqueeze { axes } => {
                let axes = axes_of(axes, opt_input(inputs, 1))?.ok_or(OpError::MissingInput(1))?;
                let r = rank + axes.len();
                let mut ins: Vec<usize> = axes
                    .iter()
                    .map(|&v| norm_axis(v, r))
                    .collect::<OpResult<_>>()?;
                ins.sort_unstable();
                ins.dedup();
                if ins.len() != axes.len() {
                    return shape_err("Unsqueeze axes repeat");
                }
                let mut src = x.iter();
                Ok((0..r)
                    .map(|i| {
                        if ins.contains(&i) {
                            1
                        } else {
                            src.next().copied().unwrap_or(1)
                        }
                    })
                    .collect())
            }
            _ => shape_err("not a reshape"),
        }
    }

    pub fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let one = |t: OpResult<Tensor>| t.map(|t| vec![t]);
        match self {
            s if s.is_reshape() => {
                let shape = s.reshape_target(&input(inputs, 0)?.shape, inputs)?;
                one(input(inputs, 0)?.clone().reshaped(shape))
            }
            ShapeOp::Transpose { perm } => one(transpose(input(inputs, 0)?, perm.as_deref())),
            ShapeOp::Expand => {
                let x = input(inputs, 0)?;
                let out = expand_shape(&x.shape, input(inputs, 1)?)?;
                one(Ok(Tensor {
                    data: x.data.gather(&broadcast_index(&x.shape, &out)),
                    shape: out,
                }))
            }
            ShapeOp::Tile => one(tile(input(inputs, 0)?, &input(inputs, 1)?.to_i64_vec()?)),
            ShapeOp::Concat { axis } => one(concat(inputs, *axis)),
            ShapeOp::Split {
                axis,
                split,
                outputs,
            } => split_op(inputs, *axis, split.as_deref(), *outputs),
            ShapeOp::Slice { attrs } => one(slice(inputs, attrs.as_ref())),
            ShapeOp::Gather { axis } => one(gather(input(inputs, 0)?, input(inputs, 1)?, *axis)),
            ShapeOp::Pad { mode, pads, value } => one(pad(inputs, mode, pads.as_deref(), *value)),
            ShapeOp::CenterCropPad { axes } => one(center_crop_pad(
                input(inputs, 0)?,
                input(inputs, 1)?,
                axes.as_deref(),
            )),
            ShapeOp::Shape { start, end } => {
                let x = input(inputs, 0)?;
                let r = x.rank() as i64;
                let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let (s, e) = (clampi(*start), clampi(end.unwrap_or(r)));
                let dims: Vec<i64> = x.shape[s..e.max(s)].iter().map(|&d| d as i64).collect();
                one(Tensor::i64(vec![dims.len()], dims))
            }
            ShapeOp::Size => one(Tensor::i64(vec![], vec![input(inputs, 0)?.len() as i64])),
            ShapeOp::ConstantOfShape { value } => {
                let shape = to_dims(&input(inputs, 0)?.to_i64_vec()?)?;
                let n = checked_numel(&shape)?;
                let data =
                    map_data!(&value.data, v => vec![v.first().copied().unwrap_or_default(); n]);
                one(Tensor::new(shape, data))
            }
            ShapeOp::Range => one(range(
                input(inputs, 0)?,
                input(inputs, 1)?,
                input(inputs, 2)?,
            )),
            ShapeOp::DepthToSpace { blocksize, crd } => {
                one(depth_to_space(input(inputs, 0)?, *blocksize, *crd))
            }
            ShapeOp::SpaceToDepth { blocksize } => {
                one(space_to_depth(input(inputs, 0)?, *blocksize))
            }
            ShapeOp::Trilu { upper } => one(trilu(input(inputs, 0)?, opt_input(inputs, 1), *upper)),
            ShapeOp::EyeLike { dtype, k } => one(eye_like(input(inputs, 0)?, *dtype, *k)),
            ShapeOp::Window {
                window: w,
                periodic,
                dtype,
            } => one(window(input(inputs, 0)?, *w, *periodic, *dtype)),
            _ => Err(OpError::Unsupported(self.name().into())),
        }
    }
}

fn axes_of(attr: &Option<Vec<i64>>, inp: Option<&Tensor>) -> OpResult<Option<Vec<i64>>> {
    match (attr, inp) {
        (Some(a), _) => Ok(Some(a.clone())),
        (None, Some(t)) => Ok(Some(t.to_i64_vec()?)),
        (None, None) => Ok(None),
    }
}

/// The output shape of Expand: `x` broadcast with the target shape tensor `target`.
pub(crate) fn expand_shape(x: &[usize], target: &Tensor) -> OpResult<Vec<usize>> {
    broadcast_shape(x, &to_dims(&target.to_i64_vec()?)?)
}

pub(crate) fn to_dims(v: &[i64]) -> OpResult<Vec<usize>> {
    let d = v
        .iter()
        .map(|&x| usize::try_from(x).map_err(|_| OpError::Shape(format!("negative dimension {x}"))))
        .collect::<OpResult<Vec<_>>>()?;
    checked_numel(&d)?;
    Ok(d)
}

/// For every element of `out`, the flat index of the `shape` element broadcast onto it.
fn broadcast_index(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let iota: Vec<usize> = (0..shape.iter().product()).collect();
    broadcast_map(&iota, shape, &[0usize], &[1], out, |i, _| i)
}

/// Transpose's permutation of `r` axes: `perm`, or the axes reversed; an error unless it
/// names each axis once.
fn checked_perm(r: usize, perm: Option<&[usize]>) -> OpResult<Vec<usize>> {
    let perm: Vec<usize> = perm.map_or_else(|| (0..r).rev().collect(), <[usize]>::to_vec);
    let mut seen = vec![false; r];
    if perm.len() != r
        || perm
            .iter()
            .any(|&p| p >= r || std::mem::replace(&mut seen[p], true))
    {
        return shape_err(format!("Transpose perm {perm:?} for rank {r}"));
    }
    Ok(perm)
}

pub fn transpose(x: &Tensor, perm: Option<&[usize]>) -> OpResult<Tensor> {
    let perm = checked_perm(x.rank(), perm)?;
    let out: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    if let Some((batch, rows, cols)) = matrix_transposes(&x.shape, &perm) {
        return Ok(Tensor {
            data: map_data!(&x.data, v => transpose_matrices(v, batch, rows, cols)),
            shape: out,
        });
    }
    let st = strides(&x.shape);
    let pst: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    Ok(Tensor {
        data: map_data!(&x.data, v => permute(v, &out, &pst)),
        shape: out,
    })
}

/// `perm` as `batch` transposes of `rows × cols` matrices, when it is one: axes `..k` kept,
/// then the axes from `j` on, then those from `k` to `j` (NCHW to NHWC is `[0, 2, 3, 1]`:
/// `C × HW` matrices; back is `[0, 3, 1, 2]`), and both sides longer than one.
fn matrix_transposes(shape: &[usize], perm: &[usize]) -> Option<(usize, usize, usize)> {
    let r = perm.len();
    if shape.len() != r {
        return None;
    }
    let k = perm
        .iter()
        .enumerate()
        .take_while(|&(i, &p)| i == p)
        .count();
    let j = *perm.get(k)?;
    let moved = (j..r).chain(k..j);
    if j <= k || perm[k..].iter().copied().ne(moved) {
        return None;
    }
    let product = |axes: &[usize]| axes.iter().product::<usize>();
    let (rows, cols) = (product(&shape[k..j]), product(&shape[j..]));
    (rows > 1 && cols > 1).then(|| (product(&shape[..k]), rows, cols))
}

/// Each `rows × cols` matrix of `src` transposed, in tiles that stay in cache.
fn transpose_matrices<T: Copy>(src: &[T], batch: usize, rows: usize, cols: usize) -> Vec<T> {
    let mut dst = src[..batch * rows * cols].to_vec();
    transpose_matrices_into(src, &mut dst, rows, cols);
    dst
}

/// [`transpose`] of an f32 tensor into a buffer from the run's pool (a transpose between
/// layouts moves whole activations: a fresh buffer would be paged in on every run), split
/// across the threads.
pub fn transpose_pooled(cx: &super::Cx, x: &Tensor, perm: Option<&[usize]>) -> OpResult<Tensor> {
    let Ok(src) = x.as_f32() else {
        return transpose(x, perm);
    };
    let perm = &checked_perm(x.rank(), perm)?[..];
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let mut dst = cx.take_f32(src.len());
    if let Some((_, rows, cols)) = matrix_transposes(&x.shape, perm) {
        cx.in_pieces(&mut dst, rows * cols, |at, d| {
            transpose_matrices_into(&src[at..at + d.len()], d, rows, cols)
        });
        return Tensor::f32(shape, dst);
    }
    let st = strides(&x.shape);
    let pst: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let inner = shape.last().copied().unwrap_or(1).max(1);
    cx.in_pieces(&mut dst, inner, |at, d| {
        permute_rows(src, &shape, &pst, at / inner, d)
    });
    Tensor::f32(shape, dst)
}

/// Each `rows × cols` matrix of `src` transposed into `dst`, in tiles that stay in cache.
fn transpose_matrices_into<T: Copy>(src: &[T], dst: &mut [T], rows: usize, cols: usize) {
    let size = rows * cols;
    for (s, d) in src.chunks_exact(size).zip(dst.chunks_exact_mut(size)) {
        // Few rows (an image's three channels to NHWC): each output row gathered from the
        // input rows, all read in order; more in tiles.
        match rows {
            1 => d.copy_from_slice(s),
            2 => few_rows::<T, 2>(s, d),
            3 => few_rows::<T, 3>(s, d),
            4 => few_rows::<T, 4>(s, d),
            5 => few_rows::<T, 5>(s, d),
            6 => few_rows::<T, 6>(s, d),
            7 => few_rows::<T, 7>(s, d),
            _ => tiled(s, d, rows),
        }
    }
}

/// One `rows × cols` matrix `s` transposed into `d`, a square tile at a time.
fn tiled<T: Copy>(s: &[T], d: &mut [T], rows: usize) {
    const TILE: usize = 32;
    let cols = s.len() / rows;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    d[c * rows + r] = s[r * cols + c];
                }
            }
        }
    }
}

/// One `R × cols` matrix `s` transposed into `d`.
fn few_rows<T: Copy, const R: usize>(s: &[T], d: &mut [T]) {
    let cols = s.len() / R;
    let rows: [&[T]; R] = std::array::from_fn(|r| &s[r * cols..][..cols]);
    for (j, out) in d.chunks_exact_mut(R).enumerate() {
        for (o, row) in out.iter_mut().zip(&rows) {
            *o = row[j];
        }
    }
}

/// Rows `first..` of [`permute`] (rows of `out`'s last axis) into `dst`, as many as it holds.
fn permute_rows<T: Copy>(src: &[T], out: &[usize], pst: &[usize], first: usize, dst: &mut [T]) {
    let Some((&inner, outer)) = out.split_last() else {
        dst.copy_from_slice(&src[..dst.len()]);
        return;
    };
    if dst.is_empty() {
        return;
    }
    let is = pst[out.len() - 1];
    // Where row `first` starts: its index along each outer axis, and the element it reads.
    let mut pos = vec![0usize; outer.len()];
    let mut rest = first;
    for ax in (0..outer.len()).rev() {
        pos[ax] = rest % outer[ax];
        rest /= outer[ax];
    }
    let mut base: usize = pos.iter().zip(pst).map(|(p, s)| p * s).sum();
    for d in dst.chunks_exact_mut(inner) {
        if is == 1 {
            d.copy_from_slice(&src[base..base + inner]);
        } else {
            for (d, s) in d.iter_mut().zip(src[base..].iter().step_by(is)) {
                *d = *s;
            }
        }
        for ax in (0..outer.len()).rev() {
            pos[ax] += 1;
            base += pst[ax];
            if pos[ax] < out[ax] {
                break;
            }
            base -= pst[ax] * out[ax];
            pos[ax] = 0;
        }
    }
}

/// The elements of `src` in the order of an `out`-shaped walk whose axis `a` steps `pst[a]`
/// elements through `src`: row by row, copying whole rows where the last axis stays innermost
/// (attention's `[B, S, H, D] -> [B, H, S, D]`).
fn permute<T: Copy>(src: &[T], out: &[usize], pst: &[usize]) -> Vec<T> {
    let n: usize = out.iter().product();
    let mut dst = src[..n].to_vec();
    permute_rows(src, out, pst, 0, &mut dst);
    dst
}

/// The output shape of Tile: every dimension times its repeat count.
pub(crate) fn tile_shape(x: &[usize], reps: &[i64]) -> OpResult<Vec<usize>> {
    if reps.len() != x.len() {
        return shape_err(format!("Tile repeats {reps:?} for rank {}", x.len()));
    }
    let out = x
        .iter()
        .zip(to_dims(reps)?)
        .map(|(d, r)| d.checked_mul(r).ok_or(OpError::TooLarge(usize::MAX)))
        .collect::<OpResult<Vec<usize>>>()?;
    checked_numel(&out)?;
    Ok(out)
}

fn tile(x: &Tensor, reps: &[i64]) -> OpResult<Tensor> {
    let out = tile_shape(&x.shape, reps)?;
    let n = checked_numel(&out)?;
    let st = strides(&x.shape);
    let ost = strides(&out);
    let idx: Vec<usize> = (0..n)
        .map(|i| {
            (0..out.len())
                .map(|a| ((i / ost[a]) % out[a] % x.shape[a].max(1)) * st[a])
                .sum()
        })
        .collect();
    Ok(Tensor {
        shape: out,
        data: x.data.gather(&idx),
    })
}

pub(crate) fn concat(inputs: &[Option<&Tensor>], axis: i64) -> OpResult<Tensor> {
    concat_into(None, inputs, axis)
}

/// [`concat`] of float32 tensors into a buffer from the run's pool (a Concat of NHWC
/// channels writes megabytes, whose fresh pages would be faulted in on every run).
pub fn concat_pooled(cx: &super::Cx, inputs: &[Option<&Tensor>], axis: i64) -> OpResult<Tensor> {
    concat_into(Some(cx), inputs, axis)
}

fn concat_into(cx: Option<&super::Cx>, inputs: &[Option<&Tensor>], axis: i64) -> OpResult<Tensor> {
    let ts: Vec<&Tensor> = inputs.iter().flatten().copied().collect();
    let first = *ts.first().ok_or(OpError::MissingInput(0))?;
    let r = first.rank();
    if r == 0 {
        return shape_err("Concat of scalars");
    }
    let axis = norm_axis(axis, r)?;
    let mut out = first.shape.clone();
    out[axis] = 0;
    for t in &ts {
        if t.dtype() != first.dtype() {
            return Err(OpError::DType(format!(
                "Concat of {:?} and {:?}",
                first.dtype(),
                t.dtype()
            )));
        }
        if t.rank() != r || (0..r).any(|i| i != axis && t.shape[i] != first.shape[i]) {
            return shape_err(format!(
                "Concat of {:?} and {:?} on axis {axis}",
                first.shape, t.shape
            ));
        }
        out[axis] = out[axis]
            .checked_add(t.shape[axis])
            .ok_or(OpError::TooLarge(usize::MAX))?;
    }
    let outer: usize = out[..axis].iter().product();
    let blocks: Vec<usize> = ts
        .iter()
        .map(|t| t.shape[axis..].iter().product())
        .collect();
    if let Ok(parts) = ts.iter().map(|t| t.as_f32()).collect::<OpResult<Vec<_>>>() {
        // Float32 (an NHWC Concat of channels copies one short run per pixel and input): the
        // runs straight into one vector.
        let total = checked_numel(&out)?;
        let mut v = cx.map_or_else(|| vec![0.0; total], |cx| cx.take_f32(total));
        let mut runs = v.iter_mut();
        for o in 0..outer {
            for (p, &blk) in parts.iter().zip(&blocks) {
                for (d, &x) in runs.by_ref().take(blk).zip(&p[o * blk..(o + 1) * blk]) {
                    *d = x;
                }
            }
        }
        return Tensor::f32(out, v);
    }
    let mut data = Data::with_capacity(first.dtype(), checked_numel(&out)?);
    for o in 0..outer {
        for (t, &blk) in ts.iter().zip(&blocks) {
            data.extend_from(&t.data, o * blk..(o + 1) * blk);
        }
    }
    Tensor::new(out, data)
}

fn split_op(
    inputs: &[Option<&Tensor>],
    axis: i64,
    split: Option<&[i64]>,
    outputs: usize,
) -> OpResult<Vec<Tensor>> {
    let x = input(inputs, 0)?;
    if x.rank() == 0 {
        return shape_err("Split of a scalar");
    }
    let axis = norm_axis(axis, x.rank())?;
    let d = x.shape[axis];
    let parts: Vec<usize> = match split
        .map(<[i64]>::to_vec)
        .or(opt_input(inputs, 1).map(|t| t.to_i64_vec()).transpose()?)
    {
        // Lengths along one axis, not a shape: their sum is checked below, not their product.
        Some(s) => s
            .iter()
            .map(|&p| usize::try_from(p).map_err(|_| OpError::Shape(format!("Split length {p}"))))
            .collect::<OpResult<_>>()?,
        None => {
            let n = outputs.max(1);
            let chunk = d.div_ceil(n);
            (0..n)
                .map(|i| chunk.min(d.saturating_sub(i * chunk)))
                .collect()
        }
    };
    if parts.iter().try_fold(0usize, |a, &p| a.checked_add(p)) != Some(d) {
        return shape_err(format!("Split {parts:?} of dimension {d}"));
    }
    let mut res = Vec::with_capacity(parts.len());
    let mut off = 0i64;
    for p in parts {
        let starts = Tensor::i64(vec![1], vec![off])?;
        let ends = Tensor::i64(vec![1], vec![off + p as i64])?;
        let axes = Tensor::i64(vec![1], vec![axis as i64])?;
        res.push(slice(
            &[Some(x), Some(&starts), Some(&ends), Some(&axes)],
            None,
        )?);
        off += p as i64;
    }
    Ok(res)
}

/// Slice bounds as ONNX defines them (negative indices, clamping, negative steps): the output
/// shape and the start and step of every axis. Shared with the CUDA backend.
pub(crate) fn slice_plan(
    shape: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<Vec<i64>>,
    steps: Option<Vec<i64>>,
) -> OpResult<(Vec<usize>, Vec<i64>, Vec<i64>)> {
    let r = shape.len();
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return shape_err("Slice starts/ends/axes/steps lengths differ");
    }
    let mut start = vec![0i64; r];
    let mut step = vec![1i64; r];
    let mut out = shape.to_vec();
    for i in 0..starts.len() {
        let a = axis_in(axes[i], r)?;
        let d = shape[a] as i64;
        let st = steps[i];
        if st == 0 {
            return shape_err("Slice step 0");
        }
        let fix = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        let (mut s, mut e) = (fix(starts[i]), fix(ends[i]));
        if st > 0 {
            s = s.clamp(0, d);
            e = e.clamp(0, d);
        } else {
            s = s.clamp(0, (d - 1).max(0));
            e = e.clamp(-1, (d - 1).max(-1));
            if d == 0 {
                s = 0;
                e = 0;
            }
        }
        // In i128: a step of i64::MIN or MAX must not overflow the ceiling division.
        let (span, st128) = (if st > 0 { e - s } else { s - e }, i128::from(st));
        let len = (i128::from(span.max(0)) + st128.abs() - 1) / st128.abs();
        out[a] = usize::try_from(len).unwrap_or(0);
        start[a] = s;
        step[a] = st;
    }
    Ok((out, start, step))
}

/// [`slice_plan`] for a Slice node: its starts, ends, axes and steps from its attributes
/// (opset 1) or from its inputs 1–4 (opset 10 on).
pub(crate) fn slice_of(
    shape: &[usize],
    inputs: &[Option<&Tensor>],
    attrs: Option<&SliceAttrs>,
) -> OpResult<(Vec<usize>, Vec<i64>, Vec<i64>)> {
    let (starts, ends, axes, steps) = match attrs {
        Some((s, e, a)) => (s.clone(), e.clone(), a.clone(), None),
        None => (
            input(inputs, 1)?.to_i64_vec()?,
            input(inputs, 2)?.to_i64_vec()?,
            opt_input(inputs, 3).map(|t| t.to_i64_vec()).transpose()?,
            opt_input(inputs, 4).map(|t| t.to_i64_vec()).transpose()?,
        ),
    };
    slice_plan(shape, &starts, &ends, axes, steps)
}

fn slice(inputs: &[Option<&Tensor>], attrs: Option<&SliceAttrs>) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let (out, start, step) = slice_of(&x.shape, inputs, attrs)?;
    let data = match checked_numel(&out)? {
        0 => x.data.gather(&[]),
        _ => slice_runs(x, &out, &start, &step),
    };
    Ok(Tensor { shape: out, data })
}

/// A slice of `x` (shape `out`, from `start` by `step`) as runs of the input: the trailing axes
/// it keeps whole at step 1, and the last axis before them if it takes that at step 1, make one
/// contiguous run for each index of the axes before them, which it walks at their steps. A step
/// along the last axis makes runs along it at that step. A slice that keeps everything is a
/// copy.
fn slice_runs(x: &Tensor, out: &[usize], start: &[i64], step: &[i64]) -> Data {
    let xs = strides(&x.shape);
    let mut k = out.len();
    while k > 0 && out[k - 1] == x.shape[k - 1] && step[k - 1] == 1 {
        k -= 1;
    }
    // Axis k - 1 (if any), cut at step 1: its kept part is contiguous too.
    if k > 0 && step[k - 1] == 1 {
        k -= 1;
    }
    // A step along the last axis: runs along it at that step.
    let r = out.len();
    let (k, run_step) = match k == r && r > 0 {
        true => (r - 1, step[r - 1]),
        false => (k, 1),
    };
    let len = out[k..].iter().product::<usize>();
    let outer = out[..k].iter().product::<usize>();
    // An odometer over the outer axes, `at` the run's first element.
    let mut at: i64 = (0..out.len()).map(|a| start[a] * xs[a] as i64).sum();
    let mut index = vec![0; k];
    let mut starts = Vec::with_capacity(outer);
    for _ in 0..outer {
        starts.push(at as usize);
        for a in (0..k).rev() {
            let stride = step[a] * xs[a] as i64;
            index[a] += 1;
            at += stride;
            if index[a] < out[a] {
                break;
            }
            at -= stride * out[a] as i64;
            index[a] = 0;
        }
    }
    match run_step {
        1 => x.data.runs(&starts, len),
        _ => x.data.strided_runs(&starts, len, run_step as isize),
    }
}

/// The output shape of Gather: `x`'s axes before `axis`, the indices' axes, `x`'s after it.
pub(crate) fn gather_shape(x: &[usize], ind: &[usize], axis: i64) -> OpResult<Vec<usize>> {
    let axis = norm_axis(axis, x.len())?;
    if x.is_empty() {
        return shape_err("Gather from a scalar");
    }
    let mut out = x[..axis].to_vec();
    out.extend(ind);
    out.extend(&x[axis + 1..]);
    checked_numel(&out)?;
    Ok(out)
}

fn gather(x: &Tensor, ind: &Tensor, axis: i64) -> OpResult<Tensor> {
    let out = gather_shape(&x.shape, &ind.shape, axis)?;
    let axis = norm_axis(axis, x.rank())?;
    let d = x.shape[axis] as i64;
    let ids = ind.to_i64_vec()?;
    let mut fixed = Vec::with_capacity(ids.len());
    for &i in &ids {
        let j = if i < 0 { i + d } else { i };
        if j < 0 || j >= d {
            return shape_err(format!("Gather index {i} out of range for dimension {d}"));
        }
        fixed.push(j as usize);
    }
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    checked_numel(&out)?;
    let rows = (outer, x.shape[axis], inner);
    Ok(Tensor {
        shape: out,
        data: map_data!(&x.data, v => gather_rows(v, rows, &fixed)),
    })
}

/// Rows `picked` of each of the `outer` blocks of `d` rows of `inner` elements in `v`: whole
/// rows copied at a time (an embedding's), not an index per element (BERT's 1024 token rows of
/// 768 took 1.9 ms through an index vector).
fn gather_rows<T: Copy>(
    v: &[T],
    (outer, d, inner): (usize, usize, usize),
    picked: &[usize],
) -> Vec<T> {
    let mut y = Vec::with_capacity(outer * picked.len() * inner);
    for o in 0..outer {
        for &j in picked {
            let base = (o * d + j) * inner;
            y.extend_from_slice(&v[base..base + inner]);
        }
    }
    y
}

/// The padding before each axis and the output shape of Pad (pads from the attribute or input
/// 1, restricted to the axes of input 3), with every sum checked.
pub(crate) fn pad_shape(
    x: &[usize],
    inputs: &[Option<&Tensor>],
    pads_attr: Option<&[i64]>,
) -> OpResult<(Vec<i64>, Vec<usize>)> {
    let r = x.len();
    let pads_in = match pads_attr {
        Some(p) => p.to_vec(),
        None => input(inputs, 1)?.to_i64_vec()?,
    };
    let axes: Vec<usize> = match opt_input(inputs, 3) {
        Some(t) => t
            .to_i64_vec()?
            .iter()
            .map(|&a| axis_in(a, r))
            .collect::<OpResult<_>>()?,
        None => (0..r).collect(),
    };
    if pads_in.len() != 2 * axes.len() {
        return shape_err(format!(
            "Pad has {} pads for {} axes",
            pads_in.len(),
            axes.len()
        ));
    }
    let (mut b, mut e) = (vec![0i64; r], vec![0i64; r]);
    for (i, &a) in axes.iter().enumerate() {
        b[a] = pads_in[i];
        e[a] = pads_in[i + axes.len()];
    }
    let mut out = vec![0usize; r];
    for a in 0..r {
        let o = i64::try_from(x[a])
            .ok()
            .and_then(|d| d.checked_add(b[a])?.checked_add(e[a]))
            .ok_or(OpError::TooLarge(usize::MAX))?;
        out[a] = usize::try_from(o)
            .map_err(|_| OpError::Shape("Pad crops more than the input".into()))?;
        checked_numel(&out[..=a])?;
    }
    Ok((b, out))
}

fn pad(
    inputs: &[Option<&Tensor>],
    mode: &str,
    pads_attr: Option<&[i64]>,
    value_attr: f32,
) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let r = x.rank();
    let value = opt_input(inputs, 2)
        .filter(|t| !t.is_empty())
        .map_or(value_attr as f64, |t| t.to_f64_vec()[0]);
    let (b, out) = pad_shape(&x.shape, inputs, pads_attr)?;
    // Per axis: the source index for every output position (None: fill with the constant).
    let mut maps: Vec<Vec<Option<usize>>> = Vec::with_capacity(r);
    for a in 0..r {
        let d = x.shape[a] as i64;
        let o = out[a] as i64;
        let map = (0..o)
            .map(|i| {
                // Saturating: a pad of i64::MIN before is legal when as much follows.
                let s = i.saturating_sub(b[a]);
                if (0..d).contains(&s) {
                    return Some(s as usize);
                }
                if d == 0 {
                    return None;
                }
                match mode {
                    "edge" => Some(s.clamp(0, d - 1) as usize),
                    "wrap" => Some(s.rem_euclid(d) as usize),
                    "reflect" if d > 1 => {
                        let p = 2 * (d - 1);
                        let m = s.rem_euclid(p);
                        Some(if m < d { m } else { p - m } as usize)
                    }
                    "reflect" => Some(0),
                    _ => None,
                }
            })
            .collect();
        maps.push(map);
    }
    gather_or_fill(x, out, &maps, value)
}

/// The tensor of shape `out` whose element at each multi-index takes, along every axis `a`,
/// position `maps[a][i]` of `x`, or `value` where any axis maps to `None`.
pub(crate) fn gather_or_fill(
    x: &Tensor,
    out: Vec<usize>,
    maps: &[Vec<Option<usize>>],
    value: f64,
) -> OpResult<Tensor> {
    let n = checked_numel(&out)?;
    let xs = strides(&x.shape);
    // Each axis's positions as offsets into `x`.
    let offsets: Vec<Vec<Option<usize>>> = maps
        .iter()
        .zip(&xs)
        .map(|(m, &s)| m.iter().map(|i| i.map(|i| i * s)).collect())
        .collect();
    let mut idx = Vec::with_capacity(n);
    // The fill value goes after the input so that padding is just one more gather index.
    gather_indices(&offsets, Some(0), x.len(), &mut idx);
    let fill = super::elementwise::cast(
        &Tensor {
            shape: vec![1],
            data: Data::F64(vec![value]),
        },
        x.dtype(),
    );
    let mut all = x.data.clone();
    all.extend_from(&fill.data, 0..1);
    let data = all.gather(&idx);
    Tensor::new(out, data)
}

/// Appends the offsets of every output element, the last axis fastest: the sum of the axes'
/// offsets after `base`, or `fill` where an axis has none.
fn gather_indices(
    axes: &[Vec<Option<usize>>],
    base: Option<usize>,
    fill: usize,
    idx: &mut Vec<usize>,
) {
    match axes {
        [] => idx.push(base.unwrap_or(fill)),
        [last] => idx.extend(
            last.iter()
                .map(|&o| base.zip(o).map_or(fill, |(b, o)| b + o)),
        ),
        [first, rest @ ..] => {
            for &o in first {
                gather_indices(rest, base.zip(o).map(|(b, o)| b + o), fill, idx);
            }
        }
    }
}

/// The output shape of CenterCropPad on an input of shape `x`, and along each axis the input
/// position of the output's first element (negative where the output starts with padding).
pub(crate) fn center_crop_pad_shape(
    x: &[usize],
    sizes: &Tensor,
    axes: Option<&[i64]>,
) -> OpResult<(Vec<usize>, Vec<i64>)> {
    let r = x.len();
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis_in(a, r)).collect::<OpResult<_>>()?,
        None => (0..r).collect(),
    };
    let sizes = sizes.to_i64_vec()?;
    if sizes.len() != axes.len() {
        return shape_err(format!(
            "CenterCropPad has {} sizes for {} axes",
            sizes.len(),
            axes.len()
        ));
    }
    let (mut out, mut first) = (x.to_vec(), vec![0i64; r]);
    for (&a, &s) in axes.iter().zip(&sizes) {
        let s = usize::try_from(s)
            .map_err(|_| OpError::Shape(format!("CenterCropPad to a size of {s}")))?;
        // The odd element of a crop is taken from the end, of a pad added at the end.
        first[a] = match s <= x[a] {
            true => ((x[a] - s) / 2) as i64,
            false => -(((s - x[a]) / 2) as i64),
        };
        out[a] = s;
    }
    checked_numel(&out)?;
    Ok((out, first))
}

fn center_crop_pad(x: &Tensor, sizes: &Tensor, axes: Option<&[i64]>) -> OpResult<Tensor> {
    let (out, first) = center_crop_pad_shape(&x.shape, sizes, axes)?;
    let maps: Vec<Vec<Option<usize>>> = (0..x.rank())
        .map(|a| {
            (0..out[a])
                .map(|i| {
                    usize::try_from(i as i64 + first[a])
                        .ok()
                        .filter(|&s| s < x.shape[a])
                })
                .collect()
        })
        .collect();
    gather_or_fill(x, out, &maps, 0.0)
}

/// The element count of Range: `ceil((limit - start) / delta)`, at least 0.
pub(crate) fn range_len(start: &Tensor, limit: &Tensor, delta: &Tensor) -> OpResult<usize> {
    let (s, l, d) = (
        range_scalar(start)?,
        range_scalar(limit)?,
        range_scalar(delta)?,
    );
    if d == 0.0 {
        return shape_err("Range delta 0");
    }
    let n = ((l - s) / d).ceil().max(0.0);
    // NaN (infinite bounds) is refused too.
    if n.is_nan() || n > crate::tensor::MAX_ELEMENTS as f64 {
        return Err(OpError::TooLarge(usize::MAX));
    }
    Ok(n as usize)
}

fn range_scalar(t: &Tensor) -> OpResult<f64> {
    t.to_f64_vec()
        .first()
        .copied()
        .ok_or(OpError::Shape("Range needs scalars".into()))
}

fn range(start: &Tensor, limit: &Tensor, delta: &Tensor) -> OpResult<Tensor> {
    let n = range_len(start, limit, delta)?;
    let (s, d) = (range_scalar(start)?, range_scalar(delta)?);
    let data = match start.data {
        Data::F32(_) => {
            let (s, d) = (s as f32, d as f32);
            Data::F32((0..n).map(|i| s + i as f32 * d).collect())
        }
        Data::F64(_) => Data::F64((0..n).map(|i| s + i as f64 * d).collect()),
        // Wrapping, as integer tensors do elsewhere: hostile bounds must not panic.
        ref other => crate::map_int!(other, v => int_range(v, s, d, n), t => {
            return Err(OpError::DType(format!("Range of {:?}", t.dtype())));
        }),
    };
    Tensor::new(vec![n], data)
}

/// `n` integers from `s` in steps of `d` (each converted to `T` first, as Cast does), wrapping;
/// `_like` only names the type.
fn int_range<T: Num>(_like: &[T], s: f64, d: f64, n: usize) -> Vec<T> {
    let (s, d) = (T::from_f64(s), T::from_f64(d));
    let mut at = s;
    (0..n)
        .map(|_| {
            let v = at;
            at = at.add(d);
            v
        })
        .collect()
}

/// The four axes of an [N, C, H, W] input of DepthToSpace or SpaceToDepth.
fn nchw(x: &Tensor, op: &str) -> OpResult<[usize; 4]> {
    match x.shape.as_slice() {
        &[n, c, h, w] => Ok([n, c, h, w]),
        s => shape_err(format!("{op} needs an [N, C, H, W] input, not {s:?}")),
    }
}

fn depth_to_space(x: &Tensor, b: usize, crd: bool) -> OpResult<Tensor> {
    let [n, c, h, w] = nchw(x, "DepthToSpace")?;
    let bb = b.checked_mul(b).ok_or(OpError::TooLarge(usize::MAX))?;
    if !c.is_multiple_of(bb) {
        return shape_err(format!(
            "DepthToSpace of {c} channels into blocks of {b}x{b}"
        ));
    }
    let c2 = c / bb;
    let out = vec![n, c2, h.saturating_mul(b), w.saturating_mul(b)];
    checked_numel(&out)?;
    let (blocks, perm) = if crd {
        (vec![n, c2, b, b, h, w], [0, 1, 4, 2, 5, 3])
    } else {
        (vec![n, b, b, c2, h, w], [0, 3, 4, 1, 5, 2])
    };
    transpose(&x.clone().reshaped(blocks)?, Some(&perm))?.reshaped(out)
}

fn space_to_depth(x: &Tensor, b: usize) -> OpResult<Tensor> {
    let [n, c, h, w] = nchw(x, "SpaceToDepth")?;
    if !h.is_multiple_of(b) || !w.is_multiple_of(b) {
        return shape_err(format!("SpaceToDepth of {h}x{w} into blocks of {b}x{b}"));
    }
    let out = vec![n, c.saturating_mul(b).saturating_mul(b), h / b, w / b];
    checked_numel(&out)?;
    let blocks = vec![n, c, h / b, b, w / b, b];
    transpose(&x.clone().reshaped(blocks)?, Some(&[0, 3, 5, 1, 2, 4]))?.reshaped(out)
}

/// The upper (on and above diagonal `k`) or lower (on and below) triangle of every matrix in
/// the last two axes; `k` from the optional input 1, 0 without it.
fn trilu(x: &Tensor, k: Option<&Tensor>, upper: bool) -> OpResult<Tensor> {
    let r = x.rank();
    if r < 2 {
        return shape_err(format!("Trilu needs a matrix, not {:?}", x.shape));
    }
    let k = match k.map(|t| t.to_i64_vec()).transpose()?.as_deref() {
        None => 0,
        Some([k]) => *k,
        Some(v) => return shape_err(format!("Trilu k must be one value, not {}", v.len())),
    };
    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
    // Diagonal offsets fit in i64: both sizes are within the executor's element limit.
    let keep = |i: usize, j: usize| {
        let d = j as i64 - i as i64;
        if upper { d >= k } else { d <= k }
    };
    let data = crate::map_data!(&x.data, v => {
        let mut out = v.clone();
        if rows * cols > 0 {
            for m in out.chunks_mut(rows * cols) {
                for i in 0..rows {
                    for j in 0..cols {
                        if !keep(i, j) {
                            m[i * cols + j] = Default::default();
                        }
                    }
                }
            }
        }
        out
    });
    Tensor::new(x.shape.clone(), data)
}

fn eye_like(x: &Tensor, dtype: Option<DType>, k: i64) -> OpResult<Tensor> {
    let &[rows, cols] = x.shape.as_slice() else {
        return shape_err(format!("EyeLike needs a matrix, not {:?}", x.shape));
    };
    let mut eye = vec![0.0; rows * cols];
    for i in 0..rows {
        // Diagonal offsets fit in i64: both sizes are within the executor's element limit.
        let j = i as i64 + k;
        if (0..cols as i64).contains(&j) {
            eye[i * cols + j as usize] = 1.0;
        }
    }
    let eye = Tensor::new(x.shape.clone(), Data::F64(eye))?;
    Ok(super::elementwise::cast(&eye, dtype.unwrap_or(x.dtype())))
}

/// The length a window operator's scalar `size` input asks for.
pub(crate) fn window_len(size: &Tensor) -> OpResult<usize> {
    let n = match size.to_i64_vec()?.as_slice() {
        &[n] => n,
        _ => {
            return shape_err(format!(
                "a window's size must be a scalar, not {:?}",
                size.shape
            ));
        }
    };
    let n = usize::try_from(n).map_err(|_| OpError::Shape(format!("window size {n}")))?;
    checked_numel(&[n])?;
    Ok(n)
}

fn window(size: &Tensor, w: Window, periodic: bool, dtype: DType) -> OpResult<Tensor> {
    let n = window_len(size)?;
    // A symmetric window of n samples is a periodic one of n - 1, plus its last sample.
    let period = if periodic { n } else { n.saturating_sub(1) } as f64;
    let values = (0..n)
        .map(|i| {
            let x = std::f64::consts::TAU * i as f64 / period;
            match w {
                Window::Hann => 0.5 - 0.5 * x.cos(),
                Window::Hamming => 25.0 / 46.0 - 21.0 / 46.0 * x.cos(),
                Window::Blackman => 0.42 - 0.5 * x.cos() + 0.08 * (2.0 * x).cos(),
            }
        })
        .collect();
    let window = Tensor::new(vec![n], Data::F64(values))?;
    Ok(super::elementwise::cast(&window, dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_lengths_are_checked_by_their_sum_not_their_product() {
        // RetinaNet's anchors per level, as onnxruntime's Gather/Slice-to-Split fusion writes
        // them: their product is past any tensor's size.
        let parts = [90_000i64, 22_500, 5_625, 1_521, 441];
        let x = Tensor::f32(vec![1, 120_087], vec![0.5; 120_087]).unwrap();
        let split = Tensor::i64(vec![5], parts.to_vec()).unwrap();
        let ys = split_op(&[Some(&x), Some(&split)], 1, None, 5).unwrap();
        let lens: Vec<usize> = ys.iter().map(|y| y.shape[1]).collect();
        assert_eq!(lens, [90_000, 22_500, 5_625, 1_521, 441]);
        let short = Tensor::i64(vec![2], vec![3, 4]).unwrap();
        assert!(split_op(&[Some(&x), Some(&short)], 1, None, 2).is_err());
        let negative = Tensor::i64(vec![2], vec![120_088, -1]).unwrap();
        assert!(split_op(&[Some(&x), Some(&negative)], 1, None, 2).is_err());
    }

    #[test]
    fn slices_copy_the_runs_the_element_walk_picks() {
        let shape = [3usize, 4, 5, 2];
        let xv: Vec<i32> = (0..120).collect();
        let x = Tensor::new(shape.to_vec(), Data::I32(xv.clone())).unwrap();
        let i64s = |v: &[i64]| Tensor::i64(vec![v.len()], v.to_vec()).unwrap();
        // (starts, ends, axes, steps): a cut inner axis, a cut outer one, several, negative
        // bounds, everything (a copy), the last axis alone; then steps: YOLOv5's every other row
        // and column, a reversed outer axis, a reversed last axis, a step past the end, and
        // steps on every axis at once.
        for (starts, ends, axes, steps) in [
            (vec![1], vec![3], vec![1], vec![1]),
            (vec![1], vec![3], vec![0], vec![1]),
            (vec![1, 0, 2], vec![3, 4, 5], vec![0, 1, 2], vec![1, 1, 1]),
            (vec![-2, 1], vec![i64::MAX, -1], vec![2, 3], vec![1, 1]),
            (vec![0], vec![i64::MAX], vec![0], vec![1]),
            (vec![1], vec![2], vec![3], vec![1]),
            (vec![0, 1], vec![i64::MAX, i64::MAX], vec![1, 2], vec![2, 2]),
            (vec![-1], vec![i64::MIN], vec![0], vec![-1]),
            (vec![-1, 1], vec![i64::MIN, 4], vec![3, 1], vec![-1, 2]),
            (vec![0], vec![5], vec![2], vec![7]),
            (
                vec![2, 3, 4, 1],
                vec![-9, -9, -9, -9],
                vec![0, 1, 2, 3],
                vec![-2, -2, -3, -1],
            ),
        ] {
            let (s, e, a, st) = (i64s(&starts), i64s(&ends), i64s(&axes), i64s(&steps));
            let got = slice(&[Some(&x), Some(&s), Some(&e), Some(&a), Some(&st)], None).unwrap();
            let (out, start, step) =
                slice_plan(&shape, &starts, &ends, Some(axes), Some(steps.clone())).unwrap();
            assert_eq!(got.shape, out);
            let mut want = Vec::new();
            for i in 0..out[0] {
                for j in 0..out[1] {
                    for k in 0..out[2] {
                        for l in 0..out[3] {
                            let at = |a: usize, v: usize| (start[a] + step[a] * v as i64) as usize;
                            want.push(
                                xv[((at(0, i) * 4 + at(1, j)) * 5 + at(2, k)) * 2 + at(3, l)],
                            );
                        }
                    }
                }
            }
            assert_eq!(got.data, Data::I32(want), "{starts:?} {ends:?} {steps:?}");
        }
    }

    #[test]
    fn transposes_of_whole_axis_groups_match_the_element_walk() {
        let shape = [2, 3, 37, 35];
        let x: Vec<u8> = (0..2 * 3 * 37 * 35).map(|i| (i * 7 % 251) as u8).collect();
        let t = Tensor::new(shape.to_vec(), Data::U8(x.clone())).unwrap();
        for perm in [
            [0, 2, 3, 1],
            [0, 3, 1, 2],
            [1, 2, 3, 0],
            [2, 3, 0, 1],
            [0, 1, 3, 2],
        ] {
            assert!(matrix_transposes(&shape, &perm).is_some(), "{perm:?}");
            let st = strides(&shape);
            let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let pst: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
            let y = transpose(&t, Some(&perm)).unwrap();
            assert_eq!(y.shape, out);
            assert_eq!(y.data, Data::U8(permute(&x, &out, &pst)), "{perm:?}");
        }
        // Channels to NHWC for every count of few rows, and the first of the tiled ones.
        for c in 1..=9 {
            let shape = [2, c, 5, 3];
            let x: Vec<f32> = (0..2 * c * 15).map(|i| i as f32).collect();
            let t = Tensor::f32(shape.to_vec(), x.clone()).unwrap();
            let y = transpose(&t, Some(&[0, 2, 3, 1])).unwrap();
            let pst = [c * 15, 3, 1, 15];
            assert_eq!(
                y.data,
                Data::F32(permute(&x, &[2, 5, 3, c], &pst)),
                "C = {c}"
            );
        }
        // Not whole groups swapped: the element walk.
        for perm in [[0, 2, 1, 3], [3, 2, 1, 0], [0, 1, 2, 3]] {
            assert!(matrix_transposes(&shape, &perm).is_none(), "{perm:?}");
        }
        // A side of one: nothing moves.
        assert!(matrix_transposes(&[4, 1, 5], &[0, 2, 1]).is_none());
        // A perm of another rank than the tensor's is no matrix transpose (the op refuses it).
        assert!(matrix_transposes(&[6], &[0, 3, 1, 2]).is_none());
        let cx = crate::ops::Cx::new(1);
        let x = Tensor::f32(vec![6], vec![0.0; 6]).unwrap();
        let e = transpose_pooled(&cx, &x, Some(&[0, 3, 1, 2])).unwrap_err();
        assert!(e.to_string().contains("Transpose perm"), "{e}");
    }

    #[test]
    fn pooled_transposes_split_across_threads_match_the_element_walk() {
        // Large enough to split: attention's heads, NCHW to NHWC, the axes reversed (no perm),
        // and a row of one element; and empty ones, and a scalar.
        let cases: [(&[usize], Option<&[usize]>); 7] = [
            (&[2, 128, 4, 64], Some(&[0, 2, 1, 3])),
            (&[4, 16, 32, 33], Some(&[0, 2, 3, 1])),
            (&[17, 45, 60], None),
            (&[40_000, 1], Some(&[0, 1])),
            (&[0, 5, 3], Some(&[1, 0, 2])),
            (&[4, 0], None),
            (&[], None),
        ];
        for (shape, perm) in cases {
            let n: usize = shape.iter().product();
            let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
            let t = Tensor::f32(shape.to_vec(), x.clone()).unwrap();
            let want = transpose(&t, perm).unwrap();
            for threads in [1, 3] {
                let got = transpose_pooled(&crate::ops::Cx::new(threads), &t, perm).unwrap();
                assert_eq!(got.shape, want.shape, "{shape:?} {perm:?}");
                assert_eq!(
                    got.data, want.data,
                    "{shape:?} {perm:?} on {threads} threads"
                );
            }
        }
    }

    #[test]
    fn windows_are_symmetric_or_periodic_and_refuse_bad_sizes() {
        let size = |n: i64| Tensor::i64(vec![], vec![n]).unwrap();
        let hann = window(&size(5), Window::Hann, false, DType::F64).unwrap();
        let v = hann.to_f64_vec();
        assert_eq!(hann.shape, [5]);
        for (got, want) in v.iter().zip([0.0, 0.5, 1.0, 0.5, 0.0]) {
            assert!((got - want).abs() < 1e-12, "{v:?}");
        }
        // Periodic: the first n samples of the symmetric window one longer.
        let periodic = window(&size(4), Window::Blackman, true, DType::F64).unwrap();
        let longer = window(&size(5), Window::Blackman, false, DType::F64).unwrap();
        assert_eq!(periodic.to_f64_vec(), longer.to_f64_vec()[..4]);
        let hamming = window(&size(3), Window::Hamming, false, DType::F32).unwrap();
        assert_eq!(hamming.dtype(), DType::F32);
        assert!(window(&size(-1), Window::Hann, true, DType::F32).is_err());
        assert!(window(&size(1 << 40), Window::Hann, true, DType::F32).is_err());
        let two = Tensor::i64(vec![2], vec![3, 4]).unwrap();
        assert!(window(&two, Window::Hann, true, DType::F32).is_err());
    }

    fn iota(shape: &[usize]) -> Tensor {
        let n = shape.iter().product::<usize>();
        Tensor::i64(shape.to_vec(), (0..n as i64).collect()).unwrap()
    }

    #[test]
    fn depth_and_space_round_trip_in_both_modes() {
        let x = iota(&[1, 8, 2, 3]);
        for crd in [false, true] {
            let d = depth_to_space(&x, 2, crd).unwrap();
            assert_eq!(d.shape, vec![1, 2, 4, 6]);
            if !crd {
                assert_eq!(space_to_depth(&d, 2).unwrap(), x);
            }
        }
        // DCR: the first output row interleaves channels 0 and 2 (the block's column 0 and 1).
        let d = depth_to_space(&x, 2, false).unwrap().to_i64_vec().unwrap();
        assert_eq!(&d[..6], &[0, 12, 1, 13, 2, 14]);
        let c = depth_to_space(&x, 2, true).unwrap().to_i64_vec().unwrap();
        assert_eq!(&c[..6], &[0, 6, 1, 7, 2, 8]);
        // Channels or sides that do not divide, ranks other than 4, huge blocks.
        assert!(depth_to_space(&iota(&[1, 6, 2, 2]), 2, false).is_err());
        assert!(space_to_depth(&iota(&[1, 1, 3, 4]), 2).is_err());
        assert!(depth_to_space(&iota(&[8, 2, 3]), 2, false).is_err());
        assert!(depth_to_space(&iota(&[1, 0, 2, 2]), usize::MAX, false).is_err());
        assert!(depth_to_space(&iota(&[1, 0, 2, 2]), 1 << 20, false).is_err());
    }

    #[test]
    fn trilu_keeps_a_triangle_of_every_matrix() {
        let x = iota(&[2, 2, 3]);
        let k = |v: i64| Tensor::i64(vec![], vec![v]).unwrap();
        let up = trilu(&x, None, true).unwrap().to_i64_vec().unwrap();
        assert_eq!(up, vec![0, 1, 2, 0, 4, 5, 6, 7, 8, 0, 10, 11]);
        let low = trilu(&x, Some(&k(-1)), false)
            .unwrap()
            .to_i64_vec()
            .unwrap();
        assert_eq!(low, vec![0, 0, 0, 3, 0, 0, 0, 0, 0, 9, 0, 0]);
        for extreme in [i64::MIN, i64::MAX] {
            assert!(trilu(&x, Some(&k(extreme)), true).is_ok());
        }
        assert!(trilu(&iota(&[3]), None, true).is_err());
        assert!(trilu(&x, Some(&iota(&[2])), true).is_err());
        assert_eq!(
            trilu(&iota(&[0, 5]), None, false).unwrap().shape,
            vec![0, 5]
        );
    }

    #[test]
    fn center_crop_pad_crops_and_pads_about_the_centre() {
        let x = iota(&[3, 4]);
        let sizes = |v: Vec<i64>| Tensor::i64(vec![v.len()], v).unwrap();
        let y = center_crop_pad(&x, &sizes(vec![1, 7]), None).unwrap();
        assert_eq!(y.shape, vec![1, 7]);
        assert_eq!(y.to_i64_vec(), Ok(vec![0, 4, 5, 6, 7, 0, 0]));
        let cols = center_crop_pad(&x, &sizes(vec![2]), Some(&[-1])).unwrap();
        assert_eq!(cols.to_i64_vec(), Ok(vec![1, 2, 5, 6, 9, 10]));
        assert!(center_crop_pad(&x, &sizes(vec![1 << 40, 1 << 40]), None).is_err());
        assert!(center_crop_pad(&x, &sizes(vec![-1, 2]), None).is_err());
        assert!(center_crop_pad(&x, &sizes(vec![2]), None).is_err());
    }
}
