//! The agent's cache of downloaded models, shared by all its tenants. A file is named by a
//! digest of the model's SHA-256 and of where it came from (the URI, and the object-store
//! settings it was read with), so tenants that name the same model at the same place with the
//! same credentials share one download and one file, while a tenant that merely knows another
//! tenant's digest gets nothing from the cache: it downloads from its own source, with its own
//! credentials, or fails.
//!
//! - A download streams into a temporary file in the cache folder (`.part-*`), which is renamed
//!   only once the model's SHA-256 is checked; a failed or cut-off download leaves nothing
//!   behind (and stale `.part-*` files left by a crash are removed when the cache opens).
//! - Concurrent requests for the same file wait for one download.
//! - The cache holds at most `max_bytes`; the least recently used files go first, never one
//!   being read. Files being read may take it over the bound until they are let go.
//! - A hit is checked again: the caller reads the whole file anyway and hashes it on the way
//!   (`source::read_file`), and a file that no longer matches is removed and downloaded again.
//!   Hashing is cheap next to planning the model, and it catches a disk that went bad or a file
//!   someone changed.
//!
//! A cache folder is meant for one agent. Another agent sharing it costs downloads, not
//! correctness: each bounds what it knows of, and a file the other removed is downloaded again.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

/// Prefix of the temporary files of downloads in progress.
const PART_PREFIX: &str = ".part-";
/// A temporary file this old belongs to no download (a download lasts at most 30 minutes).
const STALE_PART: std::time::Duration = std::time::Duration::from_secs(3600);

/// A cached model file.
#[derive(Debug)]
struct Entry {
    size: u64,
    /// When it was last used, on the cache's clock (larger is more recent).
    used: u64,
    /// Pins held on it: a file being read is never evicted.
    readers: usize,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    total: u64,
    clock: u64,
}

/// The cache; see the module docs.
#[derive(Debug)]
pub struct ModelCache {
    dir: PathBuf,
    max_bytes: u64,
    state: Mutex<State>,
    /// One lock per digest being downloaded, so concurrent requests wait for one download.
    downloads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A cached file held for reading: it is not evicted until this is dropped.
#[derive(Debug)]
pub struct Pinned {
    cache: Arc<ModelCache>,
    /// The file's name in the cache folder.
    name: String,
    path: PathBuf,
    discarded: bool,
}

impl Pinned {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file (its content no longer matches its digest).
    pub fn discard(mut self) {
        self.discarded = true;
        let mut state = self.cache.lock();
        if let Some(entry) = state.entries.remove(&self.name) {
            state.total -= entry.size;
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.discarded {
            return;
        }
        let mut state = self.cache.lock();
        if let Some(entry) = state.entries.get_mut(&self.name) {
            entry.readers = entry.readers.saturating_sub(1);
        }
        self.cache.evict(&mut state);
    }
}

/// The name of the cached file of the model with SHA-256 `sha256` fetched from `source` (the
/// URI and whatever else decides who may read it).
pub fn file_name(sha256: &str, source: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(sha256.to_ascii_lowercase().as_bytes());
    hasher.update(b"\n");
    hasher.update(source.as_bytes());
    crate::credentials::hex(&hasher.finalize().into())
}

/// Whether `name` is a digest as the cache names files: 64 lowercase hex characters.
fn is_digest(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl ModelCache {
    /// Opens (creating it, private to this user) the cache folder `dir`, takes in the files
    /// already there (oldest first out), removes unfinished downloads and evicts down to
    /// `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<ModelCache, String> {
        let what = dir.display();
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(|e| format!("model cache {what}: {e}"))?;
        let mut found: Vec<(SystemTime, String, u64)> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| format!("model cache {what}: {e}"))? {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = entry.metadata() else { continue };
            let age = meta
                .modified()
                .ok()
                .and_then(|m| m.elapsed().ok())
                .unwrap_or_default();
            if name.starts_with(PART_PREFIX) {
                // Older than any download may last: left by a crash, not another agent's.
                if age > STALE_PART {
                    let _ = std::fs::remove_file(entry.path());
                }
            } else if is_digest(&name) && meta.is_file() {
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                found.push((modified, name, meta.len()));
            }
        }
        found.sort();
        let mut state = State::default();
        for (_, name, size) in found {
            state.clock += 1;
            state.total += size;
            state.entries.insert(
                name,
                Entry {
                    size,
                    used: state.clock,
                    readers: 0,
                },
            );
        }
        let cache = ModelCache {
            dir: dir.to_path_buf(),
            max_bytes,
            state: Mutex::new(State::default()),
            downloads: Mutex::new(HashMap::new()),
        };
        cache.evict(&mut state);
        *cache.lock() = state;
        Ok(cache)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes of the files cached now.
    pub fn total_bytes(&self) -> u64 {
        self.lock().total
    }

    /// Pins the cached file `name`, if there is one.
    fn pin(self: &Arc<Self>, name: &str) -> Option<Pinned> {
        let mut state = self.lock();
        state.clock += 1;
        let now = state.clock;
        let entry = state.entries.get_mut(name)?;
        entry.readers += 1;
        entry.used = now;
        let path = self.dir.join(name);
        // The order survives a restart through the files' modification times.
        let _ = File::open(&path).and_then(|f| f.set_modified(SystemTime::now()));
        Some(Pinned {
            cache: self.clone(),
            name: name.to_string(),
            path,
            discarded: false,
        })
    }

    /// Removes the least recently used files nobody reads until the cache fits its bound.
    fn evict(&self, state: &mut State) {
        while state.total > self.max_bytes {
            let Some(victim) = state
                .entries
                .iter()
                .filter(|(_, e)| e.readers == 0)
                .min_by_key(|(_, e)| e.used)
                .map(|(d, _)| d.clone())
            else {
                return;
            };
            if let Some(entry) = state.entries.remove(&victim) {
                state.total -= entry.size;
                tracing::info!(file = %victim, bytes = entry.size, "model cache: evicted");
            }
            let _ = std::fs::remove_file(self.dir.join(&victim));
        }
    }

    /// The cached file of the model `sha256` from `source`, pinned; when it is not cached,
    /// `fill` downloads it into the (empty) temporary file it is given and returns the SHA-256
    /// of what it wrote. The file is kept only when that is `sha256`; otherwise the error names
    /// `what` and both digests. Concurrent calls for one file wait for one download.
    pub async fn get_or_fill<F, Fut>(
        self: &Arc<Self>,
        sha256: &str,
        source: &str,
        what: &str,
        fill: F,
    ) -> Result<Pinned, String>
    where
        F: FnOnce(File) -> Fut,
        Fut: Future<Output = Result<[u8; 32], String>>,
    {
        if !is_digest(&sha256.to_ascii_lowercase()) {
            return Err(format!("{what}: {sha256:?} is not a SHA-256 digest"));
        }
        let name = file_name(sha256, source);
        if let Some(pinned) = self.pin(&name) {
            tracing::info!(model = %what, file = %name, "model cache: hit");
            return Ok(pinned);
        }
        let lock = self
            .downloads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.clone())
            .or_default()
            .clone();
        let result = {
            let _downloading = lock.lock().await;
            // Someone else may have downloaded it while this waited.
            match self.pin(&name) {
                Some(pinned) => {
                    tracing::info!(model = %what, file = %name, "model cache: hit after waiting for a download");
                    Ok(pinned)
                }
                None => self.fill(&name, sha256, what, fill).await,
            }
        };
        // The last one out removes the lock (a holder of another clone keeps it alive).
        let mut downloads = self.downloads.lock().unwrap_or_else(|e| e.into_inner());
        if Arc::strong_count(&lock) == 2 {
            downloads.remove(&name);
        }
        result
    }

    async fn fill<F, Fut>(
        self: &Arc<Self>,
        name: &str,
        sha256: &str,
        what: &str,
        fill: F,
    ) -> Result<Pinned, String>
    where
        F: FnOnce(File) -> Fut,
        Fut: Future<Output = Result<[u8; 32], String>>,
    {
        // Dropped on any error: the partial file goes with it.
        let part = tempfile::Builder::new()
            .prefix(PART_PREFIX)
            .tempfile_in(&self.dir)
            .map_err(|e| {
                format!(
                    "{what}: cannot make a file in the model cache {}: {e}",
                    self.dir.display()
                )
            })?;
        let writer = part
            .as_file()
            .try_clone()
            .map_err(|e| format!("{what}: model cache: {e}"))?;
        tracing::info!(model = %what, file = %name, "model cache: downloading");
        let actual = fill(writer).await?;
        super::source::check_digest(&actual, sha256, what)?;
        let size = part
            .as_file()
            .sync_all()
            .and_then(|()| part.as_file().metadata())
            .map_err(|e| format!("{what}: model cache: {e}"))?
            .len();
        let path = self.dir.join(name);
        part.persist(&path)
            .map_err(|e| format!("{what}: model cache: cannot keep the download: {e}"))?;
        let mut state = self.lock();
        state.clock += 1;
        let used = state.clock;
        if let Some(old) = state.entries.insert(
            name.to_string(),
            Entry {
                size,
                used,
                readers: 1,
            },
        ) {
            state.total -= old.size;
        }
        state.total += size;
        self.evict(&mut state);
        Ok(Pinned {
            cache: self.clone(),
            name: name.to_string(),
            path,
            discarded: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cotenant-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn sha(bytes: &[u8]) -> String {
        crate::credentials::hex(&Sha256::digest(bytes).into())
    }

    /// The cache file of `bytes` from the tests' source.
    fn cached(bytes: &[u8]) -> String {
        file_name(&sha(bytes), "src")
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// A fill that writes `bytes` and counts its calls.
    fn writes<'a>(
        bytes: &'static [u8],
        calls: &'a AtomicUsize,
    ) -> impl FnOnce(File) -> std::future::Ready<Result<[u8; 32], String>> + 'a {
        move |mut file: File| {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(
                file.write_all(bytes)
                    .map(|()| Sha256::digest(bytes).into())
                    .map_err(|e| e.to_string()),
            )
        }
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_verified_download_is_kept_under_its_digest_and_hit_after() {
        let dir = scratch("hit");
        let cache = Arc::new(ModelCache::open(&dir, 1 << 20).expect("open"));
        let rt = runtime();
        let calls = AtomicUsize::new(0);
        let digest = sha(b"model");
        let pinned = rt
            .block_on(cache.get_or_fill(
                &digest.to_uppercase(),
                "src",
                "m",
                writes(b"model", &calls),
            ))
            .expect("downloaded");
        assert_eq!(std::fs::read(pinned.path()).expect("file"), b"model");
        assert_eq!(pinned.path(), dir.join(file_name(&digest, "src")));
        drop(pinned);
        let again = rt
            .block_on(cache.get_or_fill(&digest, "src", "m", |_| async {
                Err::<[u8; 32], String>("must not download".into())
            }))
            .expect("a hit");
        assert_eq!(std::fs::read(again.path()).expect("file"), b"model");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(cache.total_bytes(), 5);
        // Knowing the digest is not enough: another source downloads for itself.
        let e = rt
            .block_on(
                cache.get_or_fill(&digest, "another bucket", "m", |_| async {
                    Err::<[u8; 32], String>("403 from another bucket".into())
                }),
            )
            .expect_err("not shared with another source");
        assert_eq!(e, "403 from another bucket");
        // A restarted agent finds it.
        drop(again);
        drop(cache);
        let reopened = Arc::new(ModelCache::open(&dir, 1 << 20).expect("reopen"));
        assert_eq!(reopened.total_bytes(), 5);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_wrong_digest_or_a_failed_download_leaves_no_file() {
        let dir = scratch("wrong");
        let cache = Arc::new(ModelCache::open(&dir, 1 << 20).expect("open"));
        let rt = runtime();
        let calls = AtomicUsize::new(0);
        let expected = sha(b"the model");
        let e = rt
            .block_on(cache.get_or_fill(
                &expected,
                "src",
                "s3://b/m.onnx",
                writes(b"another", &calls),
            ))
            .expect_err("digest differs");
        assert!(
            e.starts_with("s3://b/m.onnx: sha256 is ") && e.contains(&expected),
            "{e}"
        );
        let e = rt
            .block_on(
                cache.get_or_fill(&expected, "src", "m", |mut file: File| async move {
                    let _ = file.write_all(b"half of it");
                    Err::<[u8; 32], String>("the connection was cut".into())
                }),
            )
            .expect_err("cut");
        assert_eq!(e, "the connection was cut");
        assert_eq!(files(&dir), Vec::<String>::new(), "no partial file");
        assert_eq!(cache.total_bytes(), 0);
        let e = rt
            .block_on(cache.get_or_fill("abc", "src", "m", writes(b"x", &calls)))
            .expect_err("not a digest");
        assert!(e.contains("not a SHA-256"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn stale_unfinished_downloads_are_removed_and_other_files_left_alone_on_open() {
        let dir = scratch("open");
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join(".part-abc"), b"half").expect("part");
        let long_ago = SystemTime::now() - std::time::Duration::from_secs(2 * 3600);
        File::options()
            .write(true)
            .open(dir.join(".part-abc"))
            .and_then(|f| f.set_modified(long_ago))
            .expect("age the part");
        std::fs::write(dir.join(".part-now"), b"another agent's").expect("part");
        std::fs::write(dir.join("notes.txt"), b"mine").expect("other");
        std::fs::write(dir.join(sha(b"m")), b"m").expect("cached");
        let cache = ModelCache::open(&dir, 100).expect("open");
        assert_eq!(
            files(&dir),
            vec![".part-now".to_string(), sha(b"m"), "notes.txt".to_string()]
        );
        assert_eq!(cache.total_bytes(), 1);
        let mode = std::fs::metadata(&dir).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_least_recently_used_file_nobody_reads_is_evicted() {
        let dir = scratch("lru");
        // Room for two of the three 4-byte files.
        let cache = Arc::new(ModelCache::open(&dir, 8).expect("open"));
        let rt = runtime();
        let calls = AtomicUsize::new(0);
        let get = |bytes: &'static [u8]| {
            rt.block_on(cache.get_or_fill(&sha(bytes), "src", "m", writes(bytes, &calls)))
                .expect("get")
        };
        drop(get(b"aaaa"));
        drop(get(b"bbbb"));
        drop(get(b"aaaa")); // a is now more recent than b
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        drop(get(b"cccc")); // b goes
        assert_eq!(files(&dir), {
            let mut v = vec![cached(b"aaaa"), cached(b"cccc")];
            v.sort();
            v
        });
        assert_eq!(cache.total_bytes(), 8);
        // A file being read stays, even past the bound; it goes once let go.
        let a = get(b"aaaa");
        let c = get(b"cccc");
        let d = get(b"dddd");
        assert_eq!(files(&dir).len(), 3, "all three are being read");
        assert_eq!(cache.total_bytes(), 12);
        drop(a);
        assert!(!dir.join(cached(b"aaaa")).exists(), "evicted once let go");
        assert!(dir.join(cached(b"cccc")).exists() && dir.join(cached(b"dddd")).exists());
        drop((c, d));
        assert_eq!(cache.total_bytes(), 8);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn concurrent_requests_for_one_digest_download_once() {
        let dir = scratch("once");
        let cache = Arc::new(ModelCache::open(&dir, 1 << 20).expect("open"));
        let rt = runtime();
        let downloads = Arc::new(AtomicUsize::new(0));
        let digest = sha(b"shared model");
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (cache, downloads, digest) = (cache.clone(), downloads.clone(), digest.clone());
                rt.spawn(async move {
                    let pinned = cache
                        .get_or_fill(&digest, "src", "m", |mut file: File| async move {
                            downloads.fetch_add(1, Ordering::SeqCst);
                            // Slow enough that the others arrive while it runs.
                            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                            file.write_all(b"shared model").map_err(|e| e.to_string())?;
                            Ok(Sha256::digest(b"shared model").into())
                        })
                        .await?;
                    std::fs::read(pinned.path()).map_err(|e| e.to_string())
                })
            })
            .collect();
        for task in tasks {
            let bytes = rt.block_on(task).expect("joined").expect("read");
            assert_eq!(bytes, b"shared model");
        }
        assert_eq!(downloads.load(Ordering::SeqCst), 1);
        assert!(cache.downloads.lock().expect("locks").is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_discarded_file_is_downloaded_again() {
        let dir = scratch("discard");
        let cache = Arc::new(ModelCache::open(&dir, 1 << 20).expect("open"));
        let rt = runtime();
        let calls = AtomicUsize::new(0);
        let digest = sha(b"m");
        drop(rt.block_on(cache.get_or_fill(&digest, "src", "m", writes(b"m", &calls))));
        let pinned = rt
            .block_on(cache.get_or_fill(&digest, "src", "m", writes(b"m", &calls)))
            .expect("hit");
        pinned.discard();
        assert!(!dir.join(cached(b"m")).exists());
        assert_eq!(cache.total_bytes(), 0);
        drop(rt.block_on(cache.get_or_fill(&digest, "src", "m", writes(b"m", &calls))));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
