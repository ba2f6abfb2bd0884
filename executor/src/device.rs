//! Where a tenant's instances compute: the CPU backend, or a GPU — a CUDA device (feature `cuda`)
//! or the simulated one, which runs the GPU path on the CPU for tests. An agent chooses once at
//! start-up ([`Device::choose`]); a tenant is then placed on it ([`Device::place`]: on a GPU its
//! weights become resident once, against its budget), and each instance gets an engine of its
//! own ([`Placed::engine`]: on the CPU a thread pool of its budget, on a GPU its own stream,
//! arena and staging).

use crate::backend::CpuBackend;
use crate::engine::{Engine, GpuEngine, HostEngine};
use crate::gacer::DeviceShape;
use crate::gpu::api::{DeviceApi, StreamId};
use crate::gpu::{Budget, SimDevice, Weights};
use crate::plan::Model;
use std::sync::Arc;

/// What the operator of the agent asked for (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceRequest {
    /// The GPU when one is usable, else the CPU (with the reason logged).
    Auto,
    Cpu,
    /// The GPU or nothing: no usable GPU is an error at start-up.
    Cuda,
    /// The simulated GPU: the GPU path (streams, events, device-resident execution) run on the
    /// CPU, for tests of that path on machines without a GPU. Slow.
    Sim,
}

impl std::str::FromStr for DeviceRequest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" => Ok(DeviceRequest::Cuda),
            "sim" => Ok(DeviceRequest::Sim),
            other => Err(format!(
                "unknown device {other:?}: expected auto, cpu, cuda or sim"
            )),
        }
    }
}

/// A device instances compute on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Device {
    #[default]
    Cpu,
    Gpu(Gpu),
}

/// A GPU and how tenants use it.
#[derive(Clone)]
pub struct Gpu {
    /// The device itself (CUDA, or simulated).
    pub api: Arc<dyn DeviceApi>,
    pub ordinal: usize,
    /// For example "NVIDIA H200", or "simulated".
    pub name: String,
    /// NVRTC architecture, for example "compute_90" (the simulated device says "sim").
    pub arch: String,
    pub total_bytes: u64,
    pub multiprocessors: usize,
    /// Device memory one tenant may hold: its weights once, plus each instance's arena.
    pub memory_per_tenant: u64,
    /// TF32 tensor-core math in cuBLAS (off: exact fp32).
    pub tf32: bool,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("arch", &self.arch)
            .field("total_bytes", &self.total_bytes)
            .field("multiprocessors", &self.multiprocessors)
            .field("memory_per_tenant", &self.memory_per_tenant)
            .field("tf32", &self.tf32)
            .finish()
    }
}

impl PartialEq for Gpu {
    fn eq(&self, o: &Gpu) -> bool {
        Arc::ptr_eq(&self.api, &o.api)
            && (self.ordinal, &self.name, self.memory_per_tenant, self.tf32)
                == (o.ordinal, &o.name, o.memory_per_tenant, o.tf32)
    }
}
impl Eq for Gpu {}

impl Gpu {
    /// The simulated GPU (H200-shaped: 132 SMs, 141 GB).
    pub fn simulated(memory_per_tenant: u64) -> Gpu {
        let api: Arc<dyn DeviceApi> = Arc::new(SimDevice::h200());
        let props = api.props().clone();
        Gpu {
            api,
            ordinal: 0,
            name: props.name,
            arch: "sim".into(),
            total_bytes: props.total_bytes,
            multiprocessors: props.multiprocessors,
            memory_per_tenant,
            tf32: false,
        }
    }

    pub fn is_simulated(&self) -> bool {
        self.arch == "sim"
    }
}

impl Device {
    /// The device for `request` and one line saying which and why. `memory_per_tenant` caps
    /// each tenant's device memory (`u64::MAX`: no cap but the device's). Asking for `cuda`
    /// where none is usable is an error with the reason; `auto` then gives the CPU.
    pub fn choose(
        request: DeviceRequest,
        ordinal: usize,
        memory_per_tenant: u64,
        tf32: bool,
    ) -> Result<(Device, String), String> {
        match request {
            DeviceRequest::Cpu => return Ok((Device::Cpu, "cpu: asked for".into())),
            DeviceRequest::Sim => {
                let gpu = Gpu::simulated(memory_per_tenant);
                let why = format!(
                    "sim: a simulated GPU ({} SMs) running the GPU path on the CPU",
                    gpu.multiprocessors
                );
                return Ok((Device::Gpu(gpu), why));
            }
            DeviceRequest::Auto | DeviceRequest::Cuda => {}
        }
        match probe_gpu(ordinal, memory_per_tenant, tf32) {
            Ok(gpu) => {
                let why = format!(
                    "cuda:{} {} ({}, {} SMs, {} MiB)",
                    gpu.ordinal,
                    gpu.name,
                    gpu.arch,
                    gpu.multiprocessors,
                    gpu.total_bytes >> 20
                );
                Ok((Device::Gpu(gpu), why))
            }
            Err(why) if request == DeviceRequest::Auto => Ok((Device::Cpu, format!("cpu: {why}"))),
            Err(why) => Err(format!("--device cuda: {why}")),
        }
    }

    /// Places `tenant`'s model on the device: on a GPU its weights go up once, against its
    /// budget. The error says why it cannot (over budget, a device failure).
    pub fn place(&self, tenant: &str, model: &Arc<Model>) -> Result<Placed, String> {
        match self {
            Device::Cpu => Ok(Placed {
                model: model.clone(),
                on: On::Cpu,
            }),
            Device::Gpu(gpu) => {
                let budget = Budget::new(tenant, gpu.memory_per_tenant);
                let weights = Weights::upload(gpu.api.clone(), &model.plan.constants, &budget)
                    .map_err(|e| format!("the weights cannot be placed on the device: {e}"))?;
                Ok(Placed {
                    model: model.clone(),
                    on: On::Gpu {
                        api: gpu.api.clone(),
                        weights,
                        budget,
                    },
                })
            }
        }
    }

    /// The device's parallel resources, for the GACER cost model; `threads` is one stream's CPU
    /// budget on the CPU.
    pub fn shape(&self, cores: usize, threads: usize) -> DeviceShape {
        match self {
            Device::Cpu => DeviceShape::cpu(cores, threads),
            Device::Gpu(gpu) => DeviceShape::gpu(&gpu.name, gpu.multiprocessors),
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self, Device::Gpu(_))
    }

    /// What a model to run here is planned for.
    pub fn target(&self) -> crate::plan::Target {
        match self {
            Device::Gpu(_) => crate::plan::Target::Gpu,
            _ => crate::plan::Target::Cpu,
        }
    }

    /// The GPU's device API, when this is a GPU.
    pub fn api(&self) -> Option<&Arc<dyn DeviceApi>> {
        match self {
            Device::Gpu(g) => Some(&g.api),
            Device::Cpu => None,
        }
    }
}

/// One tenant's model placed on a device, from which its instances are made.
pub struct Placed {
    model: Arc<Model>,
    on: On,
}

enum On {
    Cpu,
    Gpu {
        api: Arc<dyn DeviceApi>,
        weights: Arc<Weights>,
        budget: Arc<Budget>,
    },
}

impl Placed {
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// An engine for one instance: `threads` CPU threads on the CPU; on a GPU its own stream
    /// (or `stream`, shared, under the sequential schedule), arena and staging. The error says
    /// why the device cannot serve it.
    pub fn engine(
        &self,
        threads: usize,
        stream: Option<StreamId>,
    ) -> Result<Box<dyn Engine>, String> {
        match &self.on {
            On::Cpu => Ok(Box::new(HostEngine::new(
                self.model.clone(),
                Box::new(CpuBackend::new(threads)),
            ))),
            On::Gpu {
                api,
                weights,
                budget,
            } => GpuEngine::new(
                api.clone(),
                self.model.clone(),
                weights.clone(),
                budget.clone(),
                stream,
            )
            .map(|e| Box::new(e) as Box<dyn Engine>)
            .map_err(|e| format!("the device cannot serve it: {e}")),
        }
    }

    /// On a GPU, the steps that run on the host between a copy down and up at `batch`, as
    /// "node (op): why"; none on the CPU, where everything does.
    pub fn host_fallbacks(&self, batch: usize) -> Result<Vec<String>, String> {
        if matches!(self.on, On::Cpu) {
            return Ok(Vec::new());
        }
        let shapes: Vec<Vec<usize>> = self
            .model
            .plan
            .example_inputs(batch)
            .into_iter()
            .map(|(_, t)| t.shape)
            .collect();
        let layout =
            crate::gpu::layout::build(&self.model.plan, &shapes).map_err(|e| e.to_string())?;
        Ok(layout
            .fallbacks(&self.model.plan)
            .into_iter()
            .map(|(node, op, why)| format!("{node} ({op}): {why}"))
            .collect())
    }

    /// Device bytes the tenant holds now (weights plus its instances' arenas); 0 on the CPU.
    pub fn device_bytes(&self) -> u64 {
        match &self.on {
            On::Cpu => 0,
            On::Gpu { budget, .. } => budget.in_use(),
        }
    }
}

#[cfg(feature = "cuda")]
fn probe_gpu(ordinal: usize, memory_per_tenant: u64, tf32: bool) -> Result<Gpu, String> {
    // The whole device, not just a probe: it compiles (and caches) the kernels and opens
    // cuBLAS, so everything a tenant needs is known to work before the first one loads.
    let dev = crate::cuda::CudaDevice::new(ordinal, tf32).map_err(|e| e.to_string())?;
    let info = dev.info().clone();
    Ok(Gpu {
        api: Arc::new(dev),
        ordinal,
        name: info.name.clone(),
        arch: info.arch(),
        total_bytes: info.total_bytes as u64,
        multiprocessors: info.multiprocessors,
        memory_per_tenant,
        tf32,
    })
}

#[cfg(not(feature = "cuda"))]
fn probe_gpu(_ordinal: usize, _memory_per_tenant: u64, _tf32: bool) -> Result<Gpu, String> {
    Err("built without the cuda feature".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_a_typo_names_the_choices() {
        assert_eq!("auto".parse(), Ok(DeviceRequest::Auto));
        assert_eq!("cpu".parse(), Ok(DeviceRequest::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceRequest::Cuda));
        assert_eq!("sim".parse(), Ok(DeviceRequest::Sim));
        let e = "gpu".parse::<DeviceRequest>().unwrap_err();
        assert!(
            e.contains("\"gpu\"") && e.contains("auto, cpu, cuda or sim"),
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
            Device::Gpu(gpu) => {
                assert!(why.starts_with("cuda:") && why.contains(&gpu.name), "{why}")
            }
        }
        // A device that does not exist is never chosen.
        let e = Device::choose(DeviceRequest::Cuda, 4096, u64::MAX, false).unwrap_err();
        assert!(e.starts_with("--device cuda: "), "{e}");
    }

    /// Whatever the device, a placed tenant's engine runs its model.
    #[test]
    fn every_device_runs_a_placed_model() {
        let bytes = crate::zoo::build("squeezenet", &Default::default())
            .map(|m| prost::Message::encode_to_vec(&m))
            .unwrap();
        for request in [DeviceRequest::Cpu, DeviceRequest::Sim] {
            let (device, _) = Device::choose(request, 0, u64::MAX, false).unwrap();
            let model = Arc::new(Model::from_bytes_for(&bytes, device.target()).unwrap());
            let inputs = model.plan.example_inputs(1);
            let placed = device.place("t", &model).unwrap();
            let mut engine = placed.engine(1, None).unwrap();
            let out = engine.run(inputs.clone()).unwrap();
            assert_eq!(out[0].1.shape, [1, 1000], "{request:?}");
        }
    }

    /// A token id past the vocabulary is the request's error on every device (the agent answers
    /// 400), never the device's (503), and the engine serves the next request.
    #[test]
    fn an_index_out_of_range_is_the_requests_error_on_every_device() {
        let options = crate::zoo::ZooOptions {
            seed: 1,
            bert: crate::zoo::BertOptions {
                layers: 1,
                hidden: 32,
                heads: 2,
                seq: 8,
                vocab: 50,
            },
        };
        let bytes = crate::zoo::build("bert", &options)
            .map(|m| prost::Message::encode_to_vec(&m))
            .unwrap();
        let model = Arc::new(Model::from_bytes(&bytes).unwrap());
        use crate::{RunError, Tensor};
        let ids = |v: i64| {
            vec![(
                "input_ids".to_string(),
                Tensor::i64(vec![1, 8], vec![v; 8]).unwrap(),
            )]
        };
        for request in [DeviceRequest::Cpu, DeviceRequest::Sim] {
            let (device, _) = Device::choose(request, 0, u64::MAX, false).unwrap();
            let mut engine = device.place("t", &model).unwrap().engine(1, None).unwrap();
            match engine.run(ids(1_000_000_000)) {
                Err(RunError::Node { node, source, .. }) => {
                    assert!(
                        source.to_string().contains("1000000000"),
                        "{request:?}: {node}: {source}"
                    )
                }
                other => panic!("{request:?}: {other:?}"),
            }
            assert!(engine.run(ids(3)).is_ok(), "{request:?}");
        }
    }

    /// A tenant whose weights do not fit its budget is refused at placement, and the device
    /// still places another.
    #[test]
    fn weights_over_the_budget_are_refused_at_placement() {
        let bytes = crate::zoo::build("squeezenet", &Default::default())
            .map(|m| prost::Message::encode_to_vec(&m))
            .unwrap();
        let (device, _) = Device::choose(DeviceRequest::Sim, 0, 1 << 20, false).unwrap();
        let model = Model::from_bytes_for(&bytes, device.target()).unwrap();
        let model = Arc::new(model);
        let e = device.place("small", &model).err().unwrap();
        assert!(e.contains("over budget") && e.contains("\"small\""), "{e}");
        let (roomy, _) = Device::choose(DeviceRequest::Sim, 0, 64 << 20, false).unwrap();
        assert!(roomy.place("big", &model).is_ok());
    }
}
