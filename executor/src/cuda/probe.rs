//! Is there a usable CUDA device? Answered without ever panicking: cudarc's first driver call
//! panics when libcuda is missing, so the library is looked for first and every driver call of
//! the probe runs inside `catch_unwind`.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// What the probe found.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0) on an H200.
    pub capability: (i32, i32),
    pub total_bytes: usize,
    /// Streaming multiprocessors.
    pub multiprocessors: usize,
    pub device_count: usize,
}

impl DeviceInfo {
    /// The NVRTC virtual architecture for this device, e.g. `compute_90`.
    pub fn arch(&self) -> String {
        arch_of(self.capability)
    }
}

/// `compute_XY` for compute capability (X, Y).
pub fn arch_of((major, minor): (i32, i32)) -> String {
    format!("compute_{major}{minor}")
}

/// Why there is no CUDA device to use, in one line.
#[derive(Clone, Debug, PartialEq)]
pub struct Unavailable(pub String);

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// The text of a caught panic.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f`, turning a panic into an `Unavailable` that starts with `what`.
pub(crate) fn guarded<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, String>,
) -> Result<T, Unavailable> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Unavailable(format!("{what}: {e}"))),
        Err(p) => Err(Unavailable(format!("{what} panicked: {}", panic_text(&*p)))),
    }
}

/// Looks for device `ordinal`: libcuda present, at least one device, its properties readable.
pub fn probe_device(ordinal: usize) -> Result<DeviceInfo, Unavailable> {
    // SAFETY: only tries to dlopen the library by its usual names.
    let present = guarded("looking for libcuda", || {
        Ok(unsafe { cudarc::driver::sys::is_culib_present() })
    })?;
    if !present {
        return Err(Unavailable("no libcuda.so found (no NVIDIA driver)".into()));
    }
    let count = guarded("cuDeviceGetCount", || {
        cudarc::driver::CudaContext::device_count().map_err(|e| e.to_string())
    })?;
    if count <= 0 {
        return Err(Unavailable("no CUDA device".into()));
    }
    if ordinal >= count as usize {
        return Err(Unavailable(format!(
            "CUDA device {ordinal} asked for, only {count} present"
        )));
    }
    guarded("opening the CUDA device", || {
        let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(|e| e.to_string())?;
        Ok(DeviceInfo {
            ordinal,
            name: ctx.name().map_err(|e| e.to_string())?,
            capability: ctx.compute_capability().map_err(|e| e.to_string())?,
            total_bytes: ctx.total_mem().map_err(|e| e.to_string())?,
            multiprocessors: ctx
                .attribute(
                    cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                )
                .map_err(|e| e.to_string())?
                .max(1) as usize,
            device_count: count as usize,
        })
    })
}

/// Device 0.
pub fn probe() -> Result<DeviceInfo, Unavailable> {
    probe_device(0)
}

/// Is NVRTC loadable (needed to compile the kernels)?
pub fn nvrtc_present() -> Result<(), Unavailable> {
    library_present("libnvrtc", "nvidia-cuda-nvrtc", || unsafe {
        cudarc::nvrtc::sys::is_culib_present()
    })
}

/// Is cuBLAS loadable?
pub fn cublas_present() -> Result<(), Unavailable> {
    library_present("libcublas", "nvidia-cublas", || unsafe {
        cudarc::cublas::sys::is_culib_present()
    })
}

/// Whether `library` can be loaded, checked by `present` under the panic guard; if not, says
/// where it could come from (`wheel`).
fn library_present(
    library: &str,
    wheel: &str,
    present: impl FnOnce() -> bool,
) -> Result<(), Unavailable> {
    if guarded(&format!("looking for {library}"), || Ok(present()))? {
        Ok(())
    } else {
        Err(Unavailable(format!(
            "no {library}.so found (put the CUDA toolkit's or the {wheel} wheel's lib folder on \
             LD_LIBRARY_PATH)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_explains_itself() {
        match probe() {
            Ok(info) => {
                assert!(info.device_count >= 1);
                assert!(info.arch().starts_with("compute_"));
            }
            Err(Unavailable(why)) => {
                assert!(!why.trim().is_empty());
                assert!(!why.contains('\n'), "one line: {why}");
                eprintln!("probe: {why}");
            }
        }
        // A second probe answers the same way (cached library handles must not break it).
        assert_eq!(probe().is_ok(), probe().is_ok());
    }

    #[test]
    fn guarded_turns_panics_into_reasons() {
        let r: Result<(), _> = guarded("step", || panic!("boom"));
        assert_eq!(r, Err(Unavailable("step panicked: boom".into())));
        let r: Result<(), _> = guarded("step", || Err("bad".into()));
        assert_eq!(r, Err(Unavailable("step: bad".into())));
        assert_eq!(arch_of((9, 0)), "compute_90");
    }
}
