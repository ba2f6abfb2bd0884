//! GPU metrics from NVML, loaded at run time like CUDA (`libnvidia-ml.so.1`, which the NVIDIA
//! container runtime mounts next to the driver), so one binary runs with and without a GPU. An
//! agent computing on a GPU opens it once at start ([`start`]); every scrape then reads each
//! device NVML sees: utilisation, memory used and total, power draw and limit, and temperature.
//! Without NVML (no driver, a CPU agent) the metric families are still described, with no
//! samples, so dashboards and tests see one catalogue everywhere.

use libloading::{Library, Symbol};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::path::Path;
use std::sync::OnceLock;

/// NVML's name on Linux.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

const SUCCESS: c_int = 0;
/// `NVML_TEMPERATURE_GPU`.
const TEMPERATURE_GPU: c_int = 0;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const UUID_BUFFER: usize = 96;

type Device = *mut c_void;

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Default)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// One device at one moment. A reading NVML refuses (power on some boards) is `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub uuid: String,
    /// Fraction of the last sample period a kernel ran, 0 to 1.
    pub utilization: Option<f64>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub power_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    pub temperature_celsius: Option<f64>,
}

/// An opened NVML.
pub struct Nvml {
    library: Library,
}

// SAFETY: NVML's API is thread-safe once initialised (its documentation says so).
unsafe impl Sync for Nvml {}
unsafe impl Send for Nvml {}

static OPENED: OnceLock<Nvml> = OnceLock::new();

/// Opens NVML for the scrapes of this process when it computes on a real GPU, logging why
/// when it cannot.
pub fn start_for(device: &cotenant_executor::Device) {
    match device {
        cotenant_executor::Device::Gpu(gpu) if gpu.arch != "sim" => start(),
        _ => {}
    }
}

fn start() {
    match Nvml::open(Path::new(LIBRARY)) {
        Ok(nvml) => {
            let devices = nvml.samples().len();
            tracing::info!(devices, "GPU metrics from NVML");
            let _ = OPENED.set(nvml);
        }
        Err(why) => tracing::warn!(reason = %why, "no GPU metrics"),
    }
}

impl Nvml {
    /// Loads the library at `path` and initialises it.
    pub fn open(path: &Path) -> Result<Nvml, String> {
        // SAFETY: loading NVML runs its initialisers, which have no preconditions.
        let library =
            unsafe { Library::new(path) }.map_err(|e| format!("{}: {e}", path.display()))?;
        let nvml = Nvml { library };
        // SAFETY: nvmlInit_v2 takes nothing and may be called more than once.
        let init: Symbol<unsafe extern "C" fn() -> c_int> = nvml.symbol(b"nvmlInit_v2\0")?;
        match unsafe { init() } {
            SUCCESS => Ok(nvml),
            code => Err(format!("nvmlInit_v2 failed with NVML error {code}")),
        }
    }

    fn symbol<T>(&self, name: &[u8]) -> Result<Symbol<'_, T>, String> {
        // SAFETY: each name is used with the signature NVML's header gives it.
        unsafe { self.library.get(name) }.map_err(|e| {
            let name = String::from_utf8_lossy(&name[..name.len() - 1]).into_owned();
            format!("NVML lacks {name}: {e}")
        })
    }

    /// A reading of every device; empty when NVML cannot count them.
    pub fn samples(&self) -> Vec<Sample> {
        self.try_samples().unwrap_or_else(|why| {
            tracing::debug!(reason = %why, "reading NVML failed");
            Vec::new()
        })
    }

    fn try_samples(&self) -> Result<Vec<Sample>, String> {
        type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
        type Handle = unsafe extern "C" fn(c_uint, *mut Device) -> c_int;
        type Uuid = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int;
        type Rates = unsafe extern "C" fn(Device, *mut Utilization) -> c_int;
        type MemoryInfo = unsafe extern "C" fn(Device, *mut Memory) -> c_int;
        type Milliwatts = unsafe extern "C" fn(Device, *mut c_uint) -> c_int;
        type Temperature = unsafe extern "C" fn(Device, c_int, *mut c_uint) -> c_int;
        let count: Symbol<Count> = self.symbol(b"nvmlDeviceGetCount_v2\0")?;
        let handle: Symbol<Handle> = self.symbol(b"nvmlDeviceGetHandleByIndex_v2\0")?;
        let uuid: Symbol<Uuid> = self.symbol(b"nvmlDeviceGetUUID\0")?;
        let rates: Symbol<Rates> = self.symbol(b"nvmlDeviceGetUtilizationRates\0")?;
        let memory: Symbol<MemoryInfo> = self.symbol(b"nvmlDeviceGetMemoryInfo\0")?;
        let power: Symbol<Milliwatts> = self.symbol(b"nvmlDeviceGetPowerUsage\0")?;
        let limit: Symbol<Milliwatts> = self.symbol(b"nvmlDeviceGetEnforcedPowerLimit\0")?;
        let temperature: Symbol<Temperature> = self.symbol(b"nvmlDeviceGetTemperature\0")?;

        let mut n: c_uint = 0;
        // SAFETY: NVML writes one count through the pointer.
        check(unsafe { count(&mut n) }, "nvmlDeviceGetCount_v2")?;
        let mut out = Vec::new();
        for index in 0..n {
            let mut device: Device = std::ptr::null_mut();
            // SAFETY: NVML writes one handle through the pointer.
            check(unsafe { handle(index, &mut device) }, "nvmlDeviceGetHandle")?;
            let mut name = [0 as c_char; UUID_BUFFER];
            // SAFETY: the buffer holds UUID_BUFFER bytes, as its length says.
            let uuid = match unsafe { uuid(device, name.as_mut_ptr(), UUID_BUFFER as c_uint) } {
                SUCCESS => {
                    // NVML writes a NUL-terminated string; the last byte stays NUL regardless.
                    name[UUID_BUFFER - 1] = 0;
                    // SAFETY: NUL-terminated within the buffer (above).
                    unsafe { CStr::from_ptr(name.as_ptr()) }
                        .to_string_lossy()
                        .into_owned()
                }
                _ => format!("gpu-{index}"),
            };
            let mut u = Utilization::default();
            let mut m = Memory::default();
            let (mut mw, mut limit_mw, mut celsius) = (0, 0, 0);
            // SAFETY (each call below): NVML writes one value of the pointed-to type.
            let utilization = (unsafe { rates(device, &mut u) } == SUCCESS)
                .then(|| f64::from(u.gpu.min(100)) / 100.0);
            let memory_ok = unsafe { memory(device, &mut m) } == SUCCESS;
            let power_watts =
                (unsafe { power(device, &mut mw) } == SUCCESS).then(|| f64::from(mw) / 1e3);
            let power_limit_watts = (unsafe { limit(device, &mut limit_mw) } == SUCCESS)
                .then(|| f64::from(limit_mw) / 1e3);
            let temperature_celsius =
                (unsafe { temperature(device, TEMPERATURE_GPU, &mut celsius) } == SUCCESS)
                    .then(|| f64::from(celsius));
            out.push(Sample {
                uuid,
                utilization,
                memory_total_bytes: memory_ok.then_some(m.total),
                memory_used_bytes: memory_ok.then_some(m.used),
                power_watts,
                power_limit_watts,
                temperature_celsius,
            });
        }
        Ok(out)
    }
}

fn check(code: c_int, call: &str) -> Result<(), String> {
    match code {
        SUCCESS => Ok(()),
        code => Err(format!("{call} failed with NVML error {code}")),
    }
}

/// The GPU metric families, sampled at each scrape from the NVML [`start`] opened.
#[derive(Debug)]
pub struct GpuMetrics;

impl Collector for GpuMetrics {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let samples = OPENED.get().map(Nvml::samples).unwrap_or_default();
        encode(&samples, encoder)
    }
}

/// The GPU metric families, in Triton's names where Triton has one, one series per device.
pub fn encode(samples: &[Sample], mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
    type Read = (&'static str, &'static str, fn(&Sample) -> Option<f64>);
    let families: [Read; 6] = [
        (
            "nv_gpu_utilization",
            "GPU utilisation, 0 to 1 (Triton's name).",
            |s| s.utilization,
        ),
        (
            "nv_gpu_memory_total_bytes",
            "GPU memory, in bytes (Triton's name).",
            |s| s.memory_total_bytes.map(|b| b as f64),
        ),
        (
            "nv_gpu_memory_used_bytes",
            "GPU memory in use by every process, in bytes (Triton's name).",
            |s| s.memory_used_bytes.map(|b| b as f64),
        ),
        (
            "nv_gpu_power_usage",
            "GPU power draw, in watts (Triton's name).",
            |s| s.power_watts,
        ),
        (
            "nv_gpu_power_limit",
            "GPU power limit, in watts (Triton's name).",
            |s| s.power_limit_watts,
        ),
        (
            "cotenant_agent_gpu_temperature_celsius",
            "GPU core temperature, in degrees Celsius.",
            |s| s.temperature_celsius,
        ),
    ];
    for (name, help, value) in families {
        let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for s in samples {
            if let Some(v) = value(s) {
                let labels = [("gpu_uuid", s.uuid.as_str())];
                metric.encode_family(&labels)?.encode_gauge(&v)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[derive(Debug)]
    struct Fixed(Vec<Sample>);

    impl Collector for Fixed {
        fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode(&self.0, encoder)
        }
    }

    fn text(samples: Vec<Sample>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed(samples)));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
        out
    }

    #[test]
    fn without_a_gpu_the_families_are_described_with_no_samples() {
        let out = text(Vec::new());
        for name in [
            "nv_gpu_utilization",
            "cotenant_agent_gpu_temperature_celsius",
        ] {
            assert!(out.contains(&format!("# TYPE {name} gauge")), "{out}");
            assert!(!out.contains(&format!("{name}{{")), "{out}");
        }
    }

    #[test]
    fn each_device_is_a_series_and_refused_readings_are_left_out() {
        let out = text(vec![Sample {
            uuid: "GPU-1234".into(),
            utilization: Some(0.5),
            memory_total_bytes: Some(1 << 30),
            memory_used_bytes: Some(1 << 20),
            power_watts: None,
            power_limit_watts: Some(700.0),
            temperature_celsius: Some(41.0),
        }]);
        assert!(
            out.contains(r#"nv_gpu_utilization{gpu_uuid="GPU-1234"} 0.5"#),
            "{out}"
        );
        assert!(
            out.contains(r#"nv_gpu_memory_total_bytes{gpu_uuid="GPU-1234"} 1073741824"#),
            "{out}"
        );
        assert!(!out.contains("nv_gpu_power_usage{"), "{out}");
    }

    /// NVML's signatures and layouts, checked against a C library written from `nvml.h`
    /// (`tests/fake_nvml.c`), built here with the system C compiler.
    #[test]
    fn the_binding_reads_what_nvml_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let library = dir.path().join(LIBRARY);
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nvml.c");
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .expect("a C compiler (cc)");
        assert!(built.status.success(), "{built:?}");
        let samples = Nvml::open(&library).expect("open").samples();
        assert_eq!(
            samples,
            vec![
                Sample {
                    uuid: "GPU-fake-0".into(),
                    utilization: Some(0.37),
                    memory_total_bytes: Some(150_754_820_096),
                    memory_used_bytes: Some(1 << 30),
                    power_watts: Some(312.5),
                    power_limit_watts: Some(700.0),
                    temperature_celsius: Some(45.0),
                },
                Sample {
                    uuid: "GPU-fake-1".into(),
                    utilization: Some(0.38),
                    memory_total_bytes: Some(150_754_820_096),
                    memory_used_bytes: Some(1 << 30),
                    power_watts: None,
                    power_limit_watts: Some(700.0),
                    temperature_celsius: Some(45.0),
                },
            ]
        );
    }

    #[test]
    fn a_missing_library_is_named() {
        let e = Nvml::open(Path::new("/nonexistent/libnvidia-ml.so.1"))
            .err()
            .expect("no NVML there");
        assert!(e.contains("/nonexistent/libnvidia-ml.so.1"), "{e}");
    }
}
