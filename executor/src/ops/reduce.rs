//! Reductions over a set of axes (ReduceMean/Sum/Max/Min/Prod/L1/L2/SumSquare).

use super::{input, opt_input};
use crate::error::{OpError, OpResult};
use crate::ops::attrs::Attrs;
use crate::tensor::{Data, Tensor, axis_in, strides};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceKind {
    ReduceMean,
    ReduceSum,
    ReduceMax,
    ReduceMin,
    ReduceProd,
    ReduceL1,
    ReduceL2,
    ReduceSumSquare,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ReduceAttrs {
    pub kind: ReduceKind,
    pub axes: Option<Vec<i64>>,
    pub keepdims: bool,
    pub noop_with_empty_axes: bool,
}

impl ReduceAttrs {
    pub fn parse(op: &str, a: &Attrs, _opset: i64) -> Result<ReduceAttrs, String> {
        use ReduceKind::*;
        let kind = match op {
            "ReduceMean" => ReduceMean,
            "ReduceSum" => ReduceSum,
            "ReduceMax" => ReduceMax,
            "ReduceMin" => ReduceMin,
            "ReduceProd" => ReduceProd,
            "ReduceL1" => ReduceL1,
            "ReduceL2" => ReduceL2,
            _ => ReduceSumSquare,
        };
        Ok(ReduceAttrs {
            kind,
            axes: a.ints("axes")?,
            keepdims: a.int_or("keepdims", 1)? != 0,
            noop_with_empty_axes: a.int_or("noop_with_empty_axes", 0)? != 0,
        })
    }
}

pub fn reduce(r: &ReduceAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    // Since opsets 13 (ReduceSum) and 18 (the rest) the axes arrive as an optional input.
    let axes = match (&r.axes, opt_input(inputs, 1)) {
        (Some(a), _) => a.clone(),
        (None, Some(t)) => t.to_i64_vec()?,
        (None, None) => vec![],
    };
    if axes.is_empty() && r.noop_with_empty_axes {
        return Ok(x.clone());
    }
    let rank = x.rank();
    let mut red = vec![axes.is_empty(); rank];
    for a in &axes {
        red[axis_in(*a, rank)?] = true;
    }
    let out_full: Vec<usize> = x
        .shape
        .iter()
        .zip(&red)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    let ostr = strides(&out_full);
    let n_out: usize = out_full.iter().product();
    let count: usize = x
        .shape
        .iter()
        .zip(&red)
        .filter(|(_, r)| **r)
        .map(|(d, _)| *d)
        .product();
    let vals = x.to_f64_vec();
    let init = match r.kind {
        ReduceKind::ReduceMax => f64::NEG_INFINITY,
        ReduceKind::ReduceMin => f64::INFINITY,
        ReduceKind::ReduceProd => 1.0,
        _ => 0.0,
    };
    let mut acc = vec![init; n_out];
    let mut idx = vec![0usize; rank];
    for &v in &vals {
        let o: usize = (0..rank)
            .map(|i| if red[i] { 0 } else { idx[i] * ostr[i] })
            .sum();
        let a = &mut acc[o];
        match r.kind {
            ReduceKind::ReduceMax => *a = a.max(v),
            ReduceKind::ReduceMin => *a = a.min(v),
            ReduceKind::ReduceProd => *a *= v,
            ReduceKind::ReduceL1 => *a += v.abs(),
            ReduceKind::ReduceL2 | ReduceKind::ReduceSumSquare => *a += v * v,
            ReduceKind::ReduceMean | ReduceKind::ReduceSum => *a += v,
        }
        for i in (0..rank).rev() {
            idx[i] += 1;
            if idx[i] < x.shape[i] {
                break;
            }
            idx[i] = 0;
        }
    }
    match r.kind {
        ReduceKind::ReduceMean => acc.iter_mut().for_each(|a| *a /= count.max(1) as f64),
        ReduceKind::ReduceL2 => acc.iter_mut().for_each(|a| *a = a.sqrt()),
        _ => {}
    }
    let shape: Vec<usize> = if r.keepdims {
        out_full
    } else {
        x.shape
            .iter()
            .zip(&red)
            .filter(|(_, r)| !**r)
            .map(|(d, _)| *d)
            .collect()
    };
    let data = match x.data {
        Data::F32(_) => Data::F32(acc.iter().map(|&v| v as f32).collect()),
        Data::F64(_) => Data::F64(acc),
        Data::I64(_) => Data::I64(acc.iter().map(|&v| v as i64).collect()),
        Data::I32(_) => Data::I32(acc.iter().map(|&v| v as i32).collect()),
        Data::U8(_) => Data::U8(acc.iter().map(|&v| v as u8).collect()),
        Data::I8(_) => Data::I8(acc.iter().map(|&v| v as i8).collect()),
        Data::Bool(_) => return Err(OpError::DType("reduction of bool".into())),
    };
    Tensor::new(shape, data)
}
