//! `--device`: where the agent's tenants compute. Chosen once at start-up; the choice and why
//! are logged in one line (for example "cpu: no libcuda.so found (no NVIDIA driver)").

use clap::Args;
use cotenant_executor::{Device, DeviceRequest};

#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// `auto` (the GPU when one is usable, else the CPU), `cpu`, `cuda` (the GPU or a start-up
    /// error saying why not), or `sim` (a simulated GPU running the GPU path on the CPU, for
    /// tests; slow). The GPU needs a build with the `cuda` feature.
    #[arg(long, default_value = "auto")]
    pub device: DeviceRequest,
    /// Which GPU, when there are several.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Device memory each tenant may hold on the GPU, in MiB: its weights once (shared by its
    /// instances) plus every instance's activation arena. Over it, that tenant fails to load or
    /// to add an instance, with the numbers, and the others keep serving. Default: no cap.
    #[arg(long)]
    pub device_memory_per_tenant_mib: Option<u64>,
    /// TF32 tensor-core math for matrix products on the GPU (faster, about 1e-3 relative error).
    #[arg(long)]
    pub tf32: bool,
}

impl DeviceArgs {
    /// The device, logged with the reason; an error for a bad budget, or for `--device cuda`
    /// without a usable GPU.
    pub fn choose(&self) -> anyhow::Result<Device> {
        self.choose_or_why()?.map_err(anyhow::Error::msg)
    }

    /// The device, or why the GPU asked for is unusable (the outer error is a bad flag).
    pub fn choose_or_why(&self) -> anyhow::Result<Result<Device, String>> {
        let budget = match self.device_memory_per_tenant_mib {
            Some(0) => anyhow::bail!("--device-memory-per-tenant-mib must be at least 1"),
            Some(mib) => mib.saturating_mul(1 << 20),
            None => u64::MAX,
        };
        Ok(
            Device::choose(self.device, self.gpu, budget, self.tf32).map(|(device, why)| {
                tracing::info!(device = %why, "tenants compute on this device");
                device
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(device: DeviceRequest, mib: Option<u64>) -> DeviceArgs {
        DeviceArgs {
            device,
            gpu: 0,
            device_memory_per_tenant_mib: mib,
            tf32: false,
        }
    }

    #[test]
    fn cpu_is_always_there_and_a_zero_budget_is_refused() {
        assert_eq!(
            args(DeviceRequest::Cpu, None).choose().unwrap(),
            Device::Cpu
        );
        let e = args(DeviceRequest::Auto, Some(0)).choose().unwrap_err();
        assert!(
            e.to_string().contains("--device-memory-per-tenant-mib"),
            "{e}"
        );
        // auto never fails: a GPU, or the CPU with the reason logged.
        args(DeviceRequest::Auto, Some(512)).choose().unwrap();
    }
}
