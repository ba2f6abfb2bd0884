//! Fetching a tenant's model bytes from its URI, treating the URI as untrusted:
//!
//! - `file://` in Kubernetes mode reads only under the agent's model volume roots
//!   (`--model-root`; with none, `file://` is refused): `..` is refused, the path is resolved
//!   (symbolic links included) and must stay under its root, and only a regular file is read
//!   (never a device, a FIFO or a directory), and at most [`MAX_MODEL_BYTES`] of it. Standalone
//!   mode reads paths as given (relative ones from the tenant file's folder), with the same
//!   regular-file and size checks.
//! - `http(s)://` (see `download`) and `s3://`, `gs://`, `az://` (see `store`) need a SHA-256;
//!   they are downloaded into the agent's model cache (see `cache`) and read from there.
//! - At most a few models are fetched (and held in memory while they load) at once.

use super::cache::ModelCache;
use super::download;
use super::store::{self, Credentials, SecretReader};
use cotenant_crds::ModelSource;
use cotenant_crds::storage::Store;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::future::Future;
use std::io::Read;
use std::ops::Deref;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The largest model file the agent reads or downloads.
pub const MAX_MODEL_BYTES: u64 = 4 << 30;

/// Default number of models fetched and loading at once.
pub const DEFAULT_CONCURRENT_LOADS: usize = 2;

/// The default bound of the model cache (`--model-cache-max-bytes`): four of the largest models.
pub const DEFAULT_MODEL_CACHE_MAX_BYTES: &str = "16Gi";

/// A directory models may be read from, as given and as resolved.
#[derive(Clone, Debug)]
struct Root {
    given: PathBuf,
    resolved: PathBuf,
}

/// How this agent downloads models.
#[derive(Clone, Debug)]
pub struct Downloads {
    /// The model cache folder (`--model-cache-dir`).
    pub cache_dir: PathBuf,
    /// Bytes the cache may hold (`--model-cache-max-bytes`).
    pub cache_max_bytes: u64,
    /// Silence allowed between two reads of a body (`--download-read-timeout`).
    pub read_timeout: Duration,
    /// Models fetched and loading at once (`--max-concurrent-loads`).
    pub concurrent_loads: usize,
}

/// Where this agent may take models from, and how many it fetches at once.
pub struct Sources {
    /// `Some`: Kubernetes mode, `file://` only under these; `None`: standalone, any path.
    roots: Option<Vec<Root>>,
    download: download::Policy,
    cache: Arc<ModelCache>,
    credentials: Credentials,
    loads: Arc<Semaphore>,
}

impl Sources {
    /// Kubernetes mode: `file://` under `roots` only; downloads may not reach loopback; object
    /// stores are read anonymously until [`Sources::with_secrets`] gives a way to read the
    /// Secrets assignments name.
    pub fn kubernetes(roots: &[PathBuf], downloads: &Downloads) -> Result<Sources, String> {
        let roots = roots
            .iter()
            .map(|given| {
                let resolved = std::fs::canonicalize(given)
                    .map_err(|e| format!("--model-root {}: {e}", given.display()))?;
                if !resolved.is_dir() {
                    return Err(format!("--model-root {}: not a directory", given.display()));
                }
                Ok(Root {
                    given: given.clone(),
                    resolved,
                })
            })
            .collect::<Result<_, String>>()?;
        Sources::new(Some(roots), false, Credentials::Secrets(None), downloads)
    }

    /// Standalone mode: `file://` paths as given (this machine's user wrote the tenant files),
    /// downloads from loopback allowed (a model server on the same machine), object-store
    /// settings from the agent's environment.
    pub fn standalone(downloads: &Downloads) -> Result<Sources, String> {
        Sources::new(None, true, Credentials::Environment, downloads)
    }

    fn new(
        roots: Option<Vec<Root>>,
        allow_loopback: bool,
        credentials: Credentials,
        downloads: &Downloads,
    ) -> Result<Sources, String> {
        let cache = ModelCache::open(&downloads.cache_dir, downloads.cache_max_bytes)?;
        tracing::info!(
            dir = %cache.dir().display(),
            cached_bytes = cache.total_bytes(),
            max_bytes = downloads.cache_max_bytes,
            "model cache"
        );
        Ok(Sources {
            roots,
            download: download::Policy::new(allow_loopback, downloads.read_timeout),
            cache: Arc::new(cache),
            credentials,
            loads: Arc::new(Semaphore::new(downloads.concurrent_loads.max(1))),
        })
    }

    /// Reads the Secrets that assignments name (`credentialsSecret`) with `reader`.
    pub fn with_secrets(mut self, reader: Arc<dyn SecretReader>) -> Sources {
        self.credentials = Credentials::Secrets(Some(reader));
        self
    }
}

/// Model bytes, checked. Holds one of the agent's concurrent-load slots until dropped, so keep
/// it until the model is loaded.
pub struct Fetched {
    bytes: Vec<u8>,
    _slot: OwnedSemaphorePermit,
}

impl Deref for Fetched {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Where a `file://` URI points: absolute paths as they are, relative ones from `base` (none in
/// Kubernetes mode, where a relative path names nothing).
pub fn resolve_file(uri: &str, base: Option<&Path>) -> Result<PathBuf, String> {
    let Some(path) = uri.strip_prefix("file://") else {
        return Err(format!("{uri}: not a file:// URI"));
    };
    let path = Path::new(path);
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    match base {
        Some(base) => Ok(base.join(path)),
        None => Err(format!(
            "{uri}: a relative file:// path means nothing to an agent pod; use an absolute path or http(s)://"
        )),
    }
}

/// Where a `file://` URI points under one of `roots`, resolved; refused without touching the
/// file system when it is not lexically under one (so nothing is learnt about other paths).
fn resolve_under(uri: &str, roots: &[Root]) -> Result<PathBuf, String> {
    let path = resolve_file(uri, None)?;
    if roots.is_empty() {
        return Err(format!(
            "{uri}: this agent reads file:// models only under its model volumes, and it has none (--model-root)"
        ));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{uri}: `..` is not allowed in a model path"));
    }
    let Some(root) = roots
        .iter()
        .find(|r| path.starts_with(&r.given) || path.starts_with(&r.resolved))
    else {
        return Err(format!(
            "{uri}: not under a model volume of this agent ({})",
            roots
                .iter()
                .map(|r| r.given.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let resolved = std::fs::canonicalize(&path).map_err(|e| format!("{uri}: {e}"))?;
    if !resolved.starts_with(&root.resolved) {
        return Err(format!(
            "{uri}: resolves outside its model volume {} (a symbolic link?)",
            root.given.display()
        ));
    }
    Ok(resolved)
}

/// Whether `uri` is fetched over HTTP.
fn is_http(uri: &str) -> bool {
    uri.starts_with("http://") || uri.starts_with("https://")
}

/// The model bytes behind `model` (`file://`, `http(s)://`, `s3://`, `gs://` or `az://`),
/// checked against its `sha256` (which all but `file://` need). Blocking: call it off the async
/// workers; `runtime` runs the downloads. Waits for a free load slot first.
#[tracing::instrument(name = "fetch", skip_all, fields(uri = %model.uri))]
pub fn model_bytes(
    model: &ModelSource,
    base: Option<&Path>,
    sources: &Sources,
    runtime: &tokio::runtime::Handle,
) -> Result<Fetched, String> {
    let uri = model.uri.as_str();
    let sha256 = model.sha256.as_deref();
    let slot = runtime
        .block_on(sources.loads.clone().acquire_owned())
        .map_err(|_| "the agent is shutting down".to_string())?;
    let pinned = |what: &str| {
        sha256.ok_or_else(|| {
            format!("{uri}: {what} model needs a sha256 to check the download against")
        })
    };
    let bytes = if let Some(store) = Store::of_uri(uri) {
        let sha256 = pinned("an object-store")?;
        let secret = model.credentials_secret.as_ref().map(|s| s.name.as_str());
        let settings = runtime
            .block_on(store::settings(store, secret, &sources.credentials))
            .map_err(|e| format!("{uri}: {e}"))?;
        // Whoever reads the object with other settings downloads it for themselves.
        let source: String = std::iter::once(uri.to_string())
            .chain(settings.iter().map(|(k, v)| format!("{k}={v}")))
            .collect::<Vec<_>>()
            .join("\n");
        cached(uri, sha256, &source, sources, runtime, |file| {
            store::fetch_into(uri, &settings, &sources.download, file)
        })?
    } else if is_http(uri) {
        let sha256 = pinned("an http(s)")?;
        cached(uri, sha256, uri, sources, runtime, |file| {
            download::fetch_into(uri, &sources.download, file)
        })?
    } else if uri.starts_with("file://") {
        match &sources.roots {
            Some(roots) => read_file(&resolve_under(uri, roots)?, sha256, true)?,
            None => read_file(&resolve_file(uri, base)?, sha256, false)?,
        }
    } else {
        return Err(format!(
            "{uri}: unsupported model URI (file://, http(s)://, s3://, gs:// and az:// are)"
        ));
    };
    Ok(Fetched { bytes, _slot: slot })
}

/// The bytes of the model `sha256` from `source` through the cache, downloaded by `fill` when
/// not cached; a cached file that no longer matches is dropped and downloaded once more.
fn cached<F, Fut>(
    uri: &str,
    sha256: &str,
    source: &str,
    sources: &Sources,
    runtime: &tokio::runtime::Handle,
    fill: F,
) -> Result<Vec<u8>, String>
where
    F: Fn(File) -> Fut,
    Fut: Future<Output = Result<[u8; 32], String>>,
{
    let mut tries = 2;
    loop {
        tries -= 1;
        let file = runtime.block_on(sources.cache.get_or_fill(sha256, source, uri, &fill))?;
        match read_file(file.path(), Some(sha256), true) {
            Ok(bytes) => return Ok(bytes),
            Err(e) if tries > 0 => {
                tracing::warn!(model = %uri, error = %e, "a cached model no longer matches its digest: downloading it again");
                file.discard();
            }
            Err(e) => return Err(format!("{uri}: the model cache: {e}")),
        }
    }
}

/// Reads the model file at `path`: a regular file of at most [`MAX_MODEL_BYTES`], checked
/// against `sha256` when given. `no_follow` refuses a symbolic link in its last component (a
/// path already resolved must not have become one since).
pub fn read_file(path: &Path, sha256: Option<&str>, no_follow: bool) -> Result<Vec<u8>, String> {
    let bytes = read_regular(path, MAX_MODEL_BYTES, no_follow)?;
    check_sha256(&bytes, sha256, &path.display().to_string())?;
    Ok(bytes)
}

/// Reads `path`, which must be a regular file of at most `limit` bytes (never a device, a FIFO
/// or a folder, and never more than `limit` even if it grows meanwhile).
pub fn read_regular(path: &Path, limit: u64, no_follow: bool) -> Result<Vec<u8>, String> {
    let what = path.display();
    // Non-blocking, so opening a FIFO returns at once instead of waiting for a writer.
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if no_follow {
        flags |= libc::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| format!("cannot read {what}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {what}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{what} is not a regular file"));
    }
    if meta.len() > limit {
        return Err(format!(
            "{what} is {} bytes, more than the limit of {limit}",
            meta.len()
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {what}: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "{what} grew past the limit of {limit} bytes while being read"
        ));
    }
    Ok(bytes)
}

/// Checks `bytes` against the expected SHA-256 (hex, any case), if there is one.
pub fn check_sha256(bytes: &[u8], sha256: Option<&str>, what: &str) -> Result<(), String> {
    let Some(expected) = sha256 else {
        return Ok(());
    };
    check_digest(&Sha256::digest(bytes).into(), expected, what)
}

/// Compares a computed digest with the expected one (hex, any case).
pub fn check_digest(actual: &[u8; 32], expected: &str, what: &str) -> Result<(), String> {
    let actual = crate::credentials::hex(actual);
    if actual.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        Err(format!(
            "{what}: sha256 is {actual}, the tenant expects {expected}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cotenant-source-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// Downloads into a cache in a scratch folder of its own.
    pub(crate) fn downloads(name: &str, concurrent_loads: usize) -> Downloads {
        static CACHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = CACHES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Downloads {
            cache_dir: scratch(&format!("{name}-cache-{n}")),
            cache_max_bytes: 1 << 30,
            read_timeout: download::DEFAULT_READ_TIMEOUT,
            concurrent_loads,
        }
    }

    fn in_cluster(roots: &[PathBuf]) -> Sources {
        Sources::kubernetes(roots, &downloads("cluster", 2)).expect("roots exist")
    }

    fn standalone(concurrent_loads: usize) -> Sources {
        Sources::standalone(&downloads("standalone", concurrent_loads)).expect("cache")
    }

    fn source(uri: &str, sha256: Option<&str>) -> ModelSource {
        ModelSource {
            uri: uri.to_string(),
            sha256: sha256.map(str::to_string),
            format: Default::default(),
            credentials_secret: None,
        }
    }

    fn fetch(uri: &str, sources: &Sources) -> Result<Vec<u8>, String> {
        model_bytes(&source(uri, None), None, sources, runtime().handle()).map(|f| f.to_vec())
    }

    #[test]
    fn relative_file_uris_need_a_base() {
        let base = Path::new("/tenants");
        assert_eq!(
            resolve_file("file://models/m.onnx", Some(base)),
            Ok(PathBuf::from("/tenants/models/m.onnx"))
        );
        assert_eq!(
            resolve_file("file:///srv/m.onnx", None),
            Ok(PathBuf::from("/srv/m.onnx"))
        );
        let e = resolve_file("file://models/m.onnx", None).expect_err("no base");
        assert!(e.contains("absolute"), "{e}");
    }

    #[test]
    fn sha256_mismatch_names_both_digests() {
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(check_sha256(b"", Some(empty), "x"), Ok(()));
        assert_eq!(check_sha256(b"", Some(&empty.to_uppercase()), "x"), Ok(()));
        let e = check_sha256(b"a", Some(empty), "m.onnx").expect_err("differs");
        assert!(e.contains(empty) && e.starts_with("m.onnx"), "{e}");
    }

    #[test]
    fn other_schemes_and_unpinned_downloads_are_refused() {
        let sources = standalone(1);
        let e = fetch("ftp://host/m.onnx", &sources).expect_err("ftp");
        assert!(e.contains("unsupported"), "{e}");
        for uri in [
            "http://127.0.0.1:9/m.onnx",
            "s3://bucket/m.onnx",
            "gs://b/m",
            "az://c/m",
        ] {
            let e = fetch(uri, &sources).expect_err("no sha256");
            assert!(e.starts_with(uri) && e.contains("needs a sha256"), "{e}");
        }
    }

    /// A tenant naming a Secret on an agent that cannot read Secrets fails, naming it; the
    /// message names the model.
    #[test]
    fn a_credentials_secret_needs_a_way_to_read_it() {
        let sources = in_cluster(&[]);
        let mut model = source("s3://bucket/m.onnx", Some(&"0".repeat(64)));
        model.credentials_secret = Some(cotenant_crds::SecretName {
            name: "s3-reader".into(),
        });
        let e = model_bytes(&model, None, &sources, runtime().handle())
            .err()
            .expect("no reader");
        assert!(
            e.starts_with("s3://bucket/m.onnx: ") && e.contains("\"s3-reader\""),
            "{e}"
        );
    }

    /// http(s) downloads go through the cache: the second tenant of a model reads the file the
    /// first one downloaded, and a file changed on disk is downloaded again.
    #[test]
    fn downloads_are_cached_and_a_changed_file_is_fetched_again() {
        use std::io::Write;
        let body = b"model bytes".to_vec();
        let digest = crate::credentials::hex(&Sha256::digest(&body).into());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = served.clone();
        let response = body.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut buf = [0u8; 2048];
                let _ = stream.read(&mut buf);
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    response.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&response);
            }
        });
        let sources = standalone(2);
        let model = source(&format!("http://{addr}/m.onnx"), Some(&digest));
        // Downloads need a runtime whose I/O runs without this thread.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let get = || {
            model_bytes(&model, None, &sources, rt.handle())
                .map(|f| f.to_vec())
                .expect("model")
        };
        assert_eq!(get(), body);
        assert_eq!(get(), body);
        assert_eq!(
            served.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one download"
        );
        let file = sources
            .cache
            .dir()
            .join(super::super::cache::file_name(&digest, &model.uri));
        std::fs::write(&file, b"tampered").expect("tamper");
        assert_eq!(get(), body);
        assert_eq!(
            served.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "downloaded again"
        );
    }

    #[test]
    fn kubernetes_mode_reads_only_regular_files_under_its_roots() {
        let dir = scratch("roots");
        let root = dir.join("models");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::write(root.join("m.onnx"), b"model").expect("model");
        std::fs::write(dir.join("secret"), b"not yours").expect("secret");
        std::os::unix::fs::symlink(dir.join("secret"), root.join("link.onnx")).expect("link");
        std::os::unix::fs::symlink("/dev/zero", root.join("zero.onnx")).expect("zero link");
        std::fs::create_dir_all(root.join("sub.onnx")).expect("dir");
        let fifo = root.join("fifo.onnx");
        let c_path = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).expect("path");
        // SAFETY: mkfifo reads a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
        let sources = in_cluster(std::slice::from_ref(&root));
        let uri = |p: &Path| format!("file://{}", p.display());

        assert_eq!(
            fetch(&uri(&root.join("m.onnx")), &sources),
            Ok(b"model".to_vec())
        );
        let refused = [
            (uri(&dir.join("secret")), "not under a model volume"),
            ("file:///dev/zero".to_string(), "not under a model volume"),
            (
                "file:///etc/hostname".to_string(),
                "not under a model volume",
            ),
            (format!("file://{}/../secret", root.display()), "`..`"),
            (uri(&root.join("link.onnx")), "outside its model volume"),
            (uri(&root.join("zero.onnx")), "outside its model volume"),
            (uri(&root.join("sub.onnx")), "not a regular file"),
            (uri(&fifo), "not a regular file"),
            ("file://models/m.onnx".to_string(), "relative"),
        ];
        for (u, says) in refused {
            let e = fetch(&u, &sources).expect_err(&u);
            assert!(e.contains(says), "{u}: {e}");
        }
        // With no root at all, file:// is refused outright.
        let e = fetch(&uri(&root.join("m.onnx")), &in_cluster(&[])).expect_err("no roots");
        assert!(e.contains("--model-root"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn standalone_reads_any_path_but_only_regular_files() {
        let sources = standalone(1);
        let e = fetch("file:///dev/zero", &sources).expect_err("a device");
        assert!(e.contains("not a regular file"), "{e}");
        let e = fetch("file:///", &sources).expect_err("a directory");
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_missing_root_is_an_error_at_start_up() {
        let e = Sources::kubernetes(&[PathBuf::from("/no/such/root")], &downloads("missing", 1))
            .err()
            .expect("missing root");
        assert!(e.contains("/no/such/root"), "{e}");
    }

    #[test]
    fn loads_wait_for_a_free_slot() {
        let dir = scratch("slots");
        std::fs::write(dir.join("m.onnx"), b"model").expect("model");
        let sources = standalone(1);
        let rt = runtime();
        let uri = format!("file://{}", dir.join("m.onnx").display());
        let held = model_bytes(&source(&uri, None), None, &sources, rt.handle()).expect("first");
        assert_eq!(sources.loads.available_permits(), 0);
        drop(held);
        assert_eq!(sources.loads.available_permits(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
