//! Typed access to a node's attributes while parsing it into an [`Op`](super::Op).

use crate::proto::{AttributeProto, GraphProto, attribute_type as at};
use crate::tensor::Tensor;
use crate::tensor_proto::decode_tensor;

pub struct Attrs<'a> {
    pub list: &'a [AttributeProto],
}

type R<T> = Result<T, String>;

impl<'a> Attrs<'a> {
    fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.list.iter().find(|a| a.name == name)
    }
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
    fn typed(&self, name: &str, ty: i32) -> R<Option<&'a AttributeProto>> {
        match self.get(name) {
            None => Ok(None),
            // Type 0 (UNDEFINED) appears in very old exporters; trust the field then.
            Some(a) if a.r#type == ty || a.r#type == 0 => Ok(Some(a)),
            Some(a) => Err(format!(
                "attribute {name:?} has type {} where {ty} was expected",
                a.r#type
            )),
        }
    }
    pub fn int(&self, name: &str) -> R<Option<i64>> {
        Ok(self.typed(name, at::INT)?.map(|a| a.i))
    }
    pub fn int_or(&self, name: &str, d: i64) -> R<i64> {
        Ok(self.int(name)?.unwrap_or(d))
    }
    /// A 0/1 integer attribute; any other value is an error naming it.
    pub fn flag(&self, name: &str, d: bool) -> R<bool> {
        match self.int_or(name, i64::from(d))? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(format!("attribute {name:?} is {v}, not 0 or 1")),
        }
    }
    pub fn float_or(&self, name: &str, d: f32) -> R<f32> {
        Ok(self.typed(name, at::FLOAT)?.map_or(d, |a| a.f))
    }
    pub fn float(&self, name: &str) -> R<Option<f32>> {
        Ok(self.typed(name, at::FLOAT)?.map(|a| a.f))
    }
    pub fn ints(&self, name: &str) -> R<Option<Vec<i64>>> {
        Ok(self.typed(name, at::INTS)?.map(|a| a.ints.clone()))
    }
    pub fn floats(&self, name: &str) -> R<Option<Vec<f32>>> {
        Ok(self.typed(name, at::FLOATS)?.map(|a| a.floats.clone()))
    }
    pub fn string(&self, name: &str) -> R<Option<String>> {
        Ok(self
            .typed(name, at::STRING)?
            .map(|a| String::from_utf8_lossy(&a.s).into_owned()))
    }
    pub fn strings(&self, name: &str) -> R<Option<Vec<String>>> {
        Ok(self.typed(name, at::STRINGS)?.map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        }))
    }
    /// A graph attribute (the body of If, Loop or Scan).
    pub fn graph(&self, name: &str) -> R<Option<&'a GraphProto>> {
        Ok(self.typed(name, at::GRAPH)?.and_then(|a| a.g.as_deref()))
    }
    pub fn string_or(&self, name: &str, d: &str) -> R<String> {
        Ok(self.string(name)?.unwrap_or_else(|| d.to_string()))
    }
    pub fn tensor(&self, name: &str) -> R<Option<Tensor>> {
        match self.typed(name, at::TENSOR)?.and_then(|a| a.t.as_ref()) {
            None => Ok(None),
            Some(t) => decode_tensor(t, None).map(Some).map_err(|e| e.to_string()),
        }
    }
    /// Non-negative integer list (kernel shapes, strides, ...).
    pub fn usizes(&self, name: &str) -> R<Option<Vec<usize>>> {
        match self.ints(name)? {
            None => Ok(None),
            Some(v) => v
                .iter()
                .map(|&x| {
                    usize::try_from(x)
                        .map_err(|_| format!("attribute {name:?} has negative entry {x}"))
                })
                .collect::<R<Vec<_>>>()
                .map(Some),
        }
    }
}
