//! Where a tenant's instances compute: the CPU backend, or (feature `cuda`) an NVIDIA GPU. An
//! agent chooses once at start-up ([`Device::choose`]); each instance then gets a backend of its
//! own ([`Device::backend`]): on the CPU a thread pool of its budget, on a GPU its own stream,
//! cuBLAS handle and device memory pool (so instances overlap on the device, and one instance
//! over its memory budget fails alone).

use crate::backend::{Backend, CpuBackend};
use crate::gacer::DeviceShape;
use crate::tensor::Tensor;
use std::sync::Arc;

/// What the operator of the agent asked for (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceRequest {
    /// The GPU when one is usable, else the CPU (with the reason logged).
    Auto,
    Cpu,
    /// The GPU or nothing: no usable GPU is an error at start-up.
    Cuda,
}

impl std::str::FromStr for DeviceRequest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" => Ok(DeviceRequest::Cuda),
            other => Err(format!(
                "unknown device {other:?}: expected auto, cpu or cuda"
            )),
        }
    }
}

/// A device instances compute on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Device {
    #[default]
    Cpu,
    /// CUDA device `ordinal`, as probed when it was chosen.
    Cuda(Gpu),
}

/// A probed GPU and how instances use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub ordinal: usize,
    /// For example "NVIDIA H200".
    pub name: String,
    /// NVRTC architecture, for example "compute_90".
    pub arch: String,
    pub total_bytes: u64,
    pub multiprocessors: usize,
    /// Device memory one instance may hold (its weights, activations and scratch).
    pub memory_per_instance: u64,
    /// TF32 tensor-core math in cuBLAS (off: exact fp32).
    pub tf32: bool,
}

impl Gpu {
    /// A GPU that no machine has (ordinal 4096): making a backend on it always fails, with or
    /// without the `cuda` feature, so tests can see how a device failure is handled.
    #[cfg(test)]
    pub(crate) fn absent() -> Gpu {
        Gpu {
            ordinal: 4096,
            name: "absent".into(),
            arch: "compute_90".into(),
            total_bytes: 1 << 30,
            multiprocessors: 1,
            memory_per_instance: u64::MAX,
            tf32: false,
        }
    }
}

impl Device {
    /// The device for `request` and one line saying which and why. `memory_per_instance` caps
    /// each GPU instance's pool (`u64::MAX`: no cap but the device's). Asking for `cuda` where
    /// none is usable is an error with the reason; `auto` then gives the CPU.
    pub fn choose(
        request: DeviceRequest,
        ordinal: usize,
        memory_per_instance: u64,
        tf32: bool,
    ) -> Result<(Device, String), String> {
        if request == DeviceRequest::Cpu {
            return Ok((Device::Cpu, "cpu: asked for".into()));
        }
        match probe_gpu(ordinal, memory_per_instance, tf32) {
            Ok(gpu) => {
                let why = format!(
                    "cuda:{} {} ({}, {} SMs, {} MiB)",
                    gpu.ordinal,
                    gpu.name,
                    gpu.arch,
                    gpu.multiprocessors,
                    gpu.total_bytes >> 20
                );
                Ok((Device::Cuda(gpu), why))
            }
            Err(why) if request == DeviceRequest::Auto => Ok((Device::Cpu, format!("cpu: {why}"))),
            Err(why) => Err(format!("--device cuda: {why}")),
        }
    }

    /// The backend of one instance of `tenant`. `threads` is the instance's CPU budget (on a
    /// GPU, for the ops that run on the CPU). Errors say why the device cannot serve it.
    pub fn backend(&self, tenant: &str, threads: usize) -> Result<Box<dyn Backend>, String> {
        match self {
            Device::Cpu => Ok(Box::new(CpuBackend::new(threads))),
            Device::Cuda(gpu) => gpu_backend(gpu, tenant, threads, &[]),
        }
    }

    /// [`Device::backend`] readied for a plan's `constants` (resident on a GPU); the error says
    /// which of the two failed.
    pub fn backend_for(
        &self,
        tenant: &str,
        threads: usize,
        constants: &[Arc<Tensor>],
    ) -> Result<Box<dyn Backend>, String> {
        match self {
            Device::Cpu => Ok(Box::new(CpuBackend::new(threads))),
            Device::Cuda(gpu) => gpu_backend(gpu, tenant, threads, constants),
        }
    }

    /// The device's parallel resources, for the GACER cost model; `threads` is one stream's CPU
    /// budget on the CPU.
    pub fn shape(&self, cores: usize, threads: usize) -> DeviceShape {
        match self {
            Device::Cpu => DeviceShape::cpu(cores, threads),
            Device::Cuda(gpu) => DeviceShape::gpu(&gpu.name, gpu.multiprocessors),
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

#[cfg(feature = "cuda")]
fn probe_gpu(ordinal: usize, memory_per_instance: u64, tf32: bool) -> Result<Gpu, String> {
    use crate::cuda::{CudaBackend, CudaOptions};
    // A whole backend, not just a probe: it compiles (and caches) the kernels and opens cuBLAS,
    // so everything an instance needs is known to work before the first tenant loads.
    let backend = CudaBackend::new(CudaOptions {
        ordinal,
        tf32,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let info = backend.info();
    Ok(Gpu {
        ordinal,
        name: info.name.clone(),
        arch: info.arch(),
        total_bytes: info.total_bytes as u64,
        multiprocessors: info.multiprocessors,
        memory_per_instance,
        tf32,
    })
}

#[cfg(not(feature = "cuda"))]
fn probe_gpu(_ordinal: usize, _memory_per_instance: u64, _tf32: bool) -> Result<Gpu, String> {
    Err("built without the cuda feature".into())
}

#[cfg(feature = "cuda")]
fn gpu_backend(
    gpu: &Gpu,
    tenant: &str,
    threads: usize,
    constants: &[Arc<Tensor>],
) -> Result<Box<dyn Backend>, String> {
    use crate::cuda::{CudaBackend, CudaOptions};
    let backend = CudaBackend::new(CudaOptions {
        ordinal: gpu.ordinal,
        tenant: tenant.to_string(),
        budget_bytes: gpu.memory_per_instance,
        cpu_threads: threads,
        tf32: gpu.tf32,
    })
    .map_err(|e| format!("the device cannot serve it: {e}"))?;
    backend
        .register_constants(constants)
        .map_err(|e| format!("the weights cannot be placed on the device: {e}"))?;
    Ok(Box::new(backend))
}

#[cfg(not(feature = "cuda"))]
fn gpu_backend(
    _gpu: &Gpu,
    _tenant: &str,
    _threads: usize,
    _constants: &[Arc<Tensor>],
) -> Result<Box<dyn Backend>, String> {
    Err("the device cannot serve it: built without the cuda feature".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_a_typo_names_the_choices() {
        assert_eq!("auto".parse(), Ok(DeviceRequest::Auto));
        assert_eq!("cpu".parse(), Ok(DeviceRequest::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceRequest::Cuda));
        let e = "gpu".parse::<DeviceRequest>().unwrap_err();
        assert!(
            e.contains("\"gpu\"") && e.contains("auto, cpu or cuda"),
            "{e}"
        );
    }

    #[test]
    fn auto_always_gives_a_device_and_cuda_only_a_usable_one() {
        let (cpu, why) = Device::choose(DeviceRequest::Cpu, 0, u64::MAX, false).unwrap();
        assert_eq!((cpu, why.as_str()), (Device::Cpu, "cpu: asked for"));
        let (auto, why) = Device::choose(DeviceRequest::Auto, 0, u64::MAX, false).unwrap();
        assert!(!why.contains('\n'), "one line: {why}");
        match &auto {
            Device::Cpu => {
                assert!(why.starts_with("cpu: ") && why.len() > 5, "{why}");
                // Where auto found no GPU, asking for one is an error with the same reason.
                let e = Device::choose(DeviceRequest::Cuda, 0, u64::MAX, false).unwrap_err();
                assert_eq!(e, format!("--device cuda: {}", &why["cpu: ".len()..]));
            }
            Device::Cuda(gpu) => {
                assert!(why.starts_with("cuda:") && why.contains(&gpu.name), "{why}")
            }
        }
        // A device that does not exist is never chosen.
        let e = Device::choose(DeviceRequest::Cuda, 4096, u64::MAX, false).unwrap_err();
        assert!(e.starts_with("--device cuda: "), "{e}");
        // Whatever auto chose runs an op.
        let b = auto.backend("t", 1).expect("a backend");
        let x = crate::Tensor::f32(vec![2], vec![-1.0, 3.0]).unwrap();
        let relu = crate::ops::Op::Unary(crate::ops::elementwise::Unary::Relu);
        let out = b.execute(&relu, &[Some(&x)]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[0.0, 3.0]);
    }
}
