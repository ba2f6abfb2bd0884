//! A model's constants resident on the device: uploaded once into one buffer when the tenant
//! loads, then read in place by every instance of that tenant (shared through an `Arc`, never
//! written). Counted once against the tenant's budget.

use super::api::{BufferId, DevPtr, DeviceApi, DeviceError};
use super::budget::{Budget, OverBudget, Reservation};
use super::layout::ALIGN;
use crate::tensor::Tensor;
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum WeightsError {
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
    #[error("uploading the weights: {0}")]
    Device(#[from] DeviceError),
}

pub struct Weights {
    device: Arc<dyn DeviceApi>,
    buffer: Option<BufferId>,
    /// Where each constant of the plan is (None for empty ones).
    at: Vec<Option<DevPtr>>,
    bytes: u64,
    _reserved: Reservation,
}

impl Weights {
    /// Uploads `constants` (a plan's, in its order) once, against `budget`.
    pub fn upload(
        device: Arc<dyn DeviceApi>,
        constants: &[Arc<Tensor>],
        budget: &Arc<Budget>,
    ) -> Result<Arc<Weights>, WeightsError> {
        let mut offsets = Vec::with_capacity(constants.len());
        let mut total = 0u64;
        for t in constants {
            if t.is_empty() {
                offsets.push(None);
            } else {
                offsets.push(Some(total));
                total += (t.bytes() as u64).div_ceil(ALIGN) * ALIGN;
            }
        }
        let reserved = budget.reserve(total)?;
        let buffer = match total {
            0 => None,
            b => Some(device.alloc(b)?),
        };
        let at: Vec<Option<DevPtr>> = offsets
            .iter()
            .map(|o| o.zip(buffer).map(|(o, b)| DevPtr::new(b, o)))
            .collect();
        let weights = Weights {
            device: device.clone(),
            buffer,
            at,
            bytes: total,
            _reserved: reserved,
        };
        for (t, at) in constants.iter().zip(&weights.at) {
            if let Some(at) = at {
                device.upload_now(*at, &crate::tensor_proto::to_le_bytes(&t.data))?;
            }
        }
        Ok(Arc::new(weights))
    }

    /// Constant `index` of the plan on the device.
    pub fn at(&self, index: usize) -> Option<DevPtr> {
        self.at.get(index).copied().flatten()
    }

    /// Device bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Weights {
    fn drop(&mut self) {
        if let Some(b) = self.buffer.take() {
            self.device.free(b);
        }
    }
}
