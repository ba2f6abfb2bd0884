//! The kernels of `kernels/cuda/*.cu` (embedded by the kernels crate), compiled with NVRTC for the
//! device's architecture and cached on disk as PTX.
//!
//! Cache: `$COTENANT_PTX_CACHE`, else `$HOME/.cache/cotenant/ptx`; one file per source named by a
//! hash of (source, architecture, NVRTC version, options). Each file ends with a checksum line;
//! an entry whose checksum or kernel list does not match is compiled again and rewritten.

use cotenant_kernels::cuda::{Kernel, SOURCES, Source};
use std::path::{Path, PathBuf};

/// NVRTC options besides the architecture; the same as `kernels/cuda/compile_check.py`.
pub const NVRTC_OPTIONS: &[&str] = &["-default-device", "--std=c++17"];

/// FNV-1a 64: a stable content hash without a dependency.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The cache key of one source compiled for `arch` by NVRTC `nvrtc_version` ("12.9").
pub fn cache_key(code: &str, arch: &str, nvrtc_version: &str) -> String {
    let mut buf = Vec::with_capacity(code.len() + 64);
    for part in [code, arch, nvrtc_version, &NVRTC_OPTIONS.join(" ")] {
        buf.extend_from_slice(part.as_bytes());
        buf.push(0);
    }
    format!("{:016x}", fnv1a(&buf))
}

/// The cache folder: `$COTENANT_PTX_CACHE`, else `$HOME/.cache/cotenant/ptx`, else a folder
/// under the system temp dir.
pub fn cache_dir_from(env_dir: Option<&str>, home: Option<&str>) -> PathBuf {
    match (
        env_dir.filter(|d| !d.is_empty()),
        home.filter(|h| !h.is_empty()),
    ) {
        (Some(d), _) => PathBuf::from(d),
        (None, Some(h)) => Path::new(h).join(".cache/cotenant/ptx"),
        (None, None) => std::env::temp_dir().join("cotenant-ptx"),
    }
}

pub fn cache_dir() -> PathBuf {
    cache_dir_from(
        std::env::var("COTENANT_PTX_CACHE").ok().as_deref(),
        std::env::var("HOME").ok().as_deref(),
    )
}

/// `conv.cu` for compute_90 → `<dir>/conv-compute_90-<key>.ptx`.
pub fn cache_path(dir: &Path, file: &str, arch: &str, key: &str) -> PathBuf {
    let stem = file.strip_suffix(".cu").unwrap_or(file);
    dir.join(format!("{stem}-{arch}-{key}.ptx"))
}

const CHECKSUM_TAG: &str = "// cotenant-ptx-fnv1a ";

/// PTX plus a trailing checksum comment (PTX accepts `//` comments).
pub fn seal(ptx: &str) -> String {
    let body = ptx.trim_end_matches('\0');
    let mut s = String::with_capacity(body.len() + 48);
    s.push_str(body);
    if !s.ends_with('\n') {
        s.push('\n');
    }
    let sum = fnv1a(s.as_bytes());
    s.push_str(&format!("{CHECKSUM_TAG}{sum:016x}\n"));
    s
}

/// The PTX of a sealed cache entry, if its checksum holds and it defines every kernel.
pub fn unseal<'a>(text: &'a str, kernels: &[&str]) -> Option<&'a str> {
    let body_end = text.rfind(CHECKSUM_TAG)?;
    let (body, tail) = text.split_at(body_end);
    let sum = u64::from_str_radix(tail[CHECKSUM_TAG.len()..].trim(), 16).ok()?;
    if fnv1a(body.as_bytes()) != sum {
        return None;
    }
    let defines = |k: &str| {
        body.lines().any(|l| {
            l.contains(".entry")
                && l.contains(k)
                && l.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|w| w == k)
        })
    };
    if !body.contains(".version") || !kernels.iter().all(|k| defines(k)) {
        return None;
    }
    Some(body)
}

/// Reads a valid cache entry.
pub fn read_cached(path: &Path, kernels: &[&str]) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    unseal(&text, kernels).map(str::to_string)
}

/// Writes an entry atomically (temp file + rename); failures only cost a recompile later.
pub fn write_cached(path: &Path, ptx: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, seal(ptx))?;
    std::fs::rename(&tmp, path)
}

/// The NVRTC version as "major.minor".
pub fn nvrtc_version() -> Result<String, String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters; callers checked that libnvrtc is present.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed: {rc:?}"));
    }
    Ok(format!("{major}.{minor}"))
}

/// Compiles one source (its headers resolved) to PTX text for `arch` (e.g. `compute_90`).
pub fn compile(src: &Source, arch: &str) -> Result<String, String> {
    let mut options: Vec<String> = NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    let opts = cudarc::nvrtc::CompileOptions {
        options,
        name: Some(src.file.to_string()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src.code(), opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            format!("{}: NVRTC: {}", src.file, log.to_string_lossy())
        }
        other => format!("{}: NVRTC: {other}", src.file),
    })?;
    let bytes = ptx
        .as_bytes()
        .ok_or_else(|| format!("{}: NVRTC returned no PTX image", src.file))?;
    let text = String::from_utf8_lossy(bytes);
    Ok(text.trim_end_matches('\0').to_string())
}

/// Where the PTX of one source came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Cache,
    Compiled,
}

/// The PTX of `src` for `arch`: from the cache when valid, else compiled (and cached).
pub fn ptx_for(src: &Source, arch: &str, dir: &Path) -> Result<(String, Origin), String> {
    let version = nvrtc_version()?;
    let path = cache_path(dir, src.file, arch, &cache_key(&src.code(), arch, &version));
    let names: Vec<&str> = src.kernels.iter().map(|k| k.name()).collect();
    if let Some(ptx) = read_cached(&path, &names) {
        return Ok((ptx, Origin::Cache));
    }
    let ptx = compile(src, arch)?;
    if let Err(e) = write_cached(&path, &ptx) {
        tracing::debug!("cuda: could not cache PTX at {}: {e}", path.display());
    }
    Ok((ptx, Origin::Compiled))
}

/// Every kernel loaded into one context.
pub struct Loaded {
    functions: std::collections::HashMap<Kernel, cudarc::driver::CudaFunction>,
    pub compiled: usize,
    pub cached: usize,
}

impl Loaded {
    /// Compiles (or reads from the cache) and loads every source into `ctx`.
    pub fn load(
        ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
        arch: &str,
    ) -> Result<Loaded, String> {
        let dir = cache_dir();
        let mut functions = std::collections::HashMap::new();
        let (mut compiled, mut cached) = (0, 0);
        for src in SOURCES {
            let (ptx, origin) = ptx_for(src, arch, &dir)?;
            match origin {
                Origin::Cache => cached += 1,
                Origin::Compiled => compiled += 1,
            }
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .map_err(|e| format!("{}: loading PTX: {e}", src.file))?;
            for k in src.kernels {
                let f = module
                    .load_function(k.name())
                    .map_err(|e| format!("{}: kernel {}: {e}", src.file, k.name()))?;
                functions.insert(*k, f);
            }
        }
        Ok(Loaded {
            functions,
            compiled,
            cached,
        })
    }

    pub fn get(&self, kernel: Kernel) -> Result<&cudarc::driver::CudaFunction, String> {
        self.functions
            .get(&kernel)
            .ok_or_else(|| format!("kernel {} is not loaded", kernel.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_change_with_source_arch_and_version() {
        let k = cache_key("src", "compute_90", "12.9");
        assert_eq!(k.len(), 16);
        assert_eq!(k, cache_key("src", "compute_90", "12.9"));
        assert_ne!(k, cache_key("src2", "compute_90", "12.9"));
        assert_ne!(k, cache_key("src", "compute_80", "12.9"));
        assert_ne!(k, cache_key("src", "compute_90", "13.0"));
        let p = cache_path(Path::new("/c"), "conv.cu", "compute_90", &k);
        assert_eq!(p, PathBuf::from(format!("/c/conv-compute_90-{k}.ptx")));
        assert_eq!(
            cache_dir_from(Some("/x"), Some("/home/u")),
            PathBuf::from("/x")
        );
        assert_eq!(
            cache_dir_from(Some(""), Some("/home/u")),
            PathBuf::from("/home/u/.cache/cotenant/ptx")
        );
        assert!(cache_dir_from(None, None).ends_with("cotenant-ptx"));
    }

    #[test]
    fn sealed_entries_round_trip_and_corruption_is_detected() {
        let ptx = ".version 8.0\n.target sm_90\n.visible .entry foo(\n.param .u64 a\n)\n{ ret; }\n";
        let sealed = seal(ptx);
        assert_eq!(unseal(&sealed, &["foo"]), Some(ptx));
        // A kernel the entry lacks, a flipped byte, a truncation: all rejected.
        assert_eq!(unseal(&sealed, &["foo", "bar"]), None);
        assert_eq!(unseal(&sealed, &["fo"]), None);
        assert_eq!(unseal(&sealed.replace("sm_90", "sm_80"), &["foo"]), None);
        assert_eq!(unseal(&sealed[..sealed.len() / 2], &["foo"]), None);
        assert_eq!(unseal("", &[]), None);

        let dir = std::env::temp_dir().join(format!("cotenant-ptx-test-{}", std::process::id()));
        let path = cache_path(&dir, "x.cu", "compute_90", "k");
        assert_eq!(read_cached(&path, &["foo"]), None, "a miss");
        write_cached(&path, ptx).unwrap();
        assert_eq!(read_cached(&path, &["foo"]).as_deref(), Some(ptx));
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(read_cached(&path, &["foo"]), None, "corrupt → recompile");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Compiles every kernel through cudarc's NVRTC when libnvrtc is loadable (e.g. with
    /// LD_LIBRARY_PATH at the nvidia-cuda-nvrtc wheel's lib folder); says so and passes otherwise,
    /// unless `COTENANT_REQUIRE_NVRTC` is set (`cargo xtask test` sets it and the library path).
    #[test]
    fn nvrtc_compiles_every_kernel_when_present() {
        if let Err(why) = super::super::probe::nvrtc_present() {
            assert!(
                std::env::var_os("COTENANT_REQUIRE_NVRTC").is_none(),
                "COTENANT_REQUIRE_NVRTC is set but NVRTC cannot be loaded: {why}"
            );
            eprintln!("skipped: {why}");
            return;
        }
        let dir = std::env::temp_dir().join(format!("cotenant-ptx-nvrtc-{}", std::process::id()));
        for src in SOURCES {
            let (ptx, origin) = ptx_for(src, "compute_90", &dir).unwrap();
            assert_eq!(origin, Origin::Compiled);
            for k in src.kernels {
                assert!(
                    ptx.contains(k.name()),
                    "{}: {k:?} missing from PTX",
                    src.file
                );
            }
            let (again, origin) = ptx_for(src, "compute_90", &dir).unwrap();
            assert_eq!((again.as_str(), origin), (ptx.as_str(), Origin::Cache));
        }
        // A corrupt entry is compiled again.
        let version = nvrtc_version().unwrap();
        let s = &SOURCES[0];
        let path = cache_path(
            &dir,
            s.file,
            "compute_90",
            &cache_key(&s.code(), "compute_90", &version),
        );
        std::fs::write(&path, "corrupt").unwrap();
        assert_eq!(ptx_for(s, "compute_90", &dir).unwrap().1, Origin::Compiled);
        eprintln!("NVRTC {version} compiled {} sources", SOURCES.len());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
