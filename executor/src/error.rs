//! Typed errors of the executor: importing a model, building its plan, and running it.

use thiserror::Error;

/// Why a model could not be imported.
#[derive(Debug, Error)]
pub enum ImportError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("not a valid ONNX model (protobuf decode failed): {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("model has no graph")]
    NoGraph,
    #[error("model imports opset {opset} of the default domain; supported are 1..=27")]
    Opset { opset: i64 },
    #[error("node {node:?}: operator {op} (opset {opset}) is not supported")]
    UnsupportedOp {
        node: String,
        op: String,
        opset: i64,
    },
    #[error("node {node:?}: operator {domain}.{op} is not supported{known}")]
    UnsupportedDomainOp {
        node: String,
        op: String,
        domain: String,
        /// What of that domain is supported, when any.
        known: String,
    },
    #[error("node {node:?} ({op}, opset {opset}): {reason}")]
    BadNode {
        node: String,
        op: String,
        opset: i64,
        reason: String,
    },
    #[error("tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("inconsistent graph: {0}")]
    Graph(String),
}

/// Why one operator could not run; the plan wraps it with the node it came from.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum OpError {
    #[error("shape: {0}")]
    Shape(String),
    #[error("type: {0}")]
    DType(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("missing input {0}")]
    MissingInput(usize),
    #[error("tensor of {0} elements exceeds the executor's limit")]
    TooLarge(usize),
    /// The device failed or refused, not the op's inputs: over the tenant's memory budget, a
    /// launch or copy error.
    #[error("device: {0}")]
    Device(String),
}

/// Why a run failed.
#[derive(Debug, Error)]
pub enum RunError {
    #[error("unknown input {name:?}; the model's inputs are {expected:?}")]
    UnknownInput { name: String, expected: Vec<String> },
    #[error("input {0:?} was not given")]
    MissingInput(String),
    #[error("input {name:?}: expected {expected}, got {got}")]
    BadInput {
        name: String,
        expected: String,
        got: String,
    },
    #[error("node {node:?} ({op}): {source}")]
    Node {
        node: String,
        op: String,
        source: OpError,
    },
    #[error("output {0:?} was not produced")]
    MissingOutput(String),
    /// A step would take the run's live activations past the memory budget of its plan on its
    /// own (see `memory`); refused before anything was allocated.
    #[error(
        "node {node:?} ({op}) needs {needed} bytes of activations with what this run holds, over the memory budget of {limit} bytes"
    )]
    MemoryBudget {
        node: String,
        op: String,
        needed: usize,
        limit: usize,
    },
    /// The device cannot run this instance (no stream, weights over its memory budget).
    #[error("device: {0}")]
    Device(String),
    /// A measurement ran out of time.
    #[error("deadline: {0}")]
    Deadline(String),
}

pub type OpResult<T> = Result<T, OpError>;

pub(crate) fn shape_err<T>(msg: impl Into<String>) -> OpResult<T> {
    Err(OpError::Shape(msg.into()))
}
