//! Builds the control plane's binaries from their Go modules, and sets up the load generators the
//! tests drive (`oha` built with cargo, Triton's prebuilt `perf_analyzer`), caching them outside
//! the repository, keyed by component and version: `<cache>/bin/<component>-<version>/`. A
//! directory counts only once its `.complete` marker exists, so an interrupted build is redone.

use crate::{Error, versions};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Paths of every control-plane binary.
#[derive(Debug, Clone)]
pub struct Tools {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kubectl: PathBuf,
    pub helm: PathBuf,
    pub kwok: PathBuf,
    /// kwok's node and pod lifecycle stages (initialise, heartbeat, ready, complete, delete).
    pub kwok_stages: PathBuf,
    /// One directory holding `kubectl` and `helm`, for `PATH`.
    pub path_dir: PathBuf,
    /// The `oha` HTTP load generator (built with cargo, not Go).
    pub oha: PathBuf,
    /// Triton's `perf_analyzer` (HTTP and gRPC): a wrapper script that runs the prebuilt binary
    /// with the libraries it needs.
    pub perf_analyzer: PathBuf,
}

/// The cache root: `$COTENANT_CACHE`, else `$XDG_CACHE_HOME/cotenant`, else `~/.cache/cotenant`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("COTENANT_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("cotenant");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache").join("cotenant")
}

/// Returns the tools, building whatever the cache lacks (a cold build takes tens of minutes).
pub fn ensure() -> Result<Tools, Error> {
    let cache = cache_dir();
    fs::create_dir_all(&cache)?;
    let _lock = FileLock::acquire(&cache.join("build.lock"))?;
    let bin = cache.join("bin");
    let k8s = component(&bin, "k8s", versions::KUBERNETES, build_kubernetes)?;
    let etcd = component(&bin, "etcd", versions::ETCD, build_etcd)?;
    let helm = component(&bin, "helm", versions::HELM, build_helm)?;
    let kwok = component(&bin, "kwok", versions::KWOK, build_kwok)?;
    let oha = component(&bin, "oha", versions::OHA, build_oha)?;
    let perf_analyzer = component(
        &bin,
        "perf_analyzer",
        &format!(
            "{}-cudart{}",
            versions::PERF_ANALYZER,
            versions::CUDA_RUNTIME
        ),
        build_perf_analyzer,
    )?;

    let path_dir = bin.join(format!("path-{}-{}", versions::KUBERNETES, versions::HELM));
    if !path_dir.join("helm").exists() {
        fs::create_dir_all(&path_dir)?;
        for (dir, name) in [(&k8s, "kubectl"), (&helm, "helm")] {
            let link = path_dir.join(name);
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(dir.join(name), &link)?;
        }
    }
    Ok(Tools {
        etcd: etcd.join("etcd"),
        kube_apiserver: k8s.join("kube-apiserver"),
        kube_controller_manager: k8s.join("kube-controller-manager"),
        kube_scheduler: k8s.join("kube-scheduler"),
        kubectl: k8s.join("kubectl"),
        helm: helm.join("helm"),
        kwok: kwok.join("kwok"),
        kwok_stages: kwok.join("stages.yaml"),
        path_dir,
        oha: oha.join("bin/oha"),
        perf_analyzer: perf_analyzer.join("bin/perf_analyzer"),
    })
}

/// The cached directory of one component, built by `build` into a fresh directory when missing.
fn component(
    bin: &Path,
    name: &str,
    version: &str,
    build: impl FnOnce(&Path) -> Result<(), Error>,
) -> Result<PathBuf, Error> {
    let out = bin.join(format!("{name}-{version}"));
    if out.join(".complete").exists() {
        return Ok(out);
    }
    eprintln!(
        "cotenant: building {name} {version} (cached in {})",
        out.display()
    );
    let started = Instant::now();
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;
    build(&out)?;
    fs::write(out.join(".complete"), "")?;
    eprintln!(
        "cotenant: built {name} {version} in {:.0?}",
        started.elapsed()
    );
    Ok(out)
}

/// `("1", "36")` for `v1.36.3`.
fn kubernetes_major_minor() -> Result<(&'static str, &'static str), Error> {
    let v = versions::KUBERNETES;
    let mut parts = v.trim_start_matches('v').split('.');
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => Ok((major, minor)),
        _ => Err(Error::Build {
            what: "kubernetes".into(),
            detail: format!("cannot parse version {v}"),
        }),
    }
}

fn build_kubernetes(out: &Path) -> Result<(), Error> {
    let v = versions::KUBERNETES;
    let (major, minor) = kubernetes_major_minor()?;
    // k8s.io/kubernetes replaces its staging modules with local paths, so it cannot be required as
    // is: pin each staging module to its published v0.<minor>.<patch> instead.
    let info = go(
        &[
            "mod",
            "download",
            "-json",
            &format!("k8s.io/kubernetes@{v}"),
        ],
        None,
    )?;
    let info: serde_json::Value = serde_json::from_str(&info).map_err(|e| Error::Build {
        what: "kubernetes".into(),
        detail: format!("go mod download -json: {e}"),
    })?;
    let gomod_path = info["GoMod"].as_str().ok_or_else(|| Error::Build {
        what: "kubernetes".into(),
        detail: "go mod download -json printed no GoMod".into(),
    })?;
    let gomod = fs::read_to_string(gomod_path)?;
    let staging_version = format!("v0.{minor}.{}", v.rsplit('.').next().unwrap_or("0"));
    let replaces: String = gomod
        .lines()
        .filter(|l| l.contains("=> ./staging/"))
        .filter_map(|l| l.split_whitespace().next())
        .map(|module| format!("\t{module} => {module} {staging_version}\n"))
        .collect();
    let src = source_dir(out, "k8s", v)?;
    fs::write(
        src.join("go.mod"),
        format!(
            "module cotenant.local/k8s\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes {v}\n\nreplace (\n{replaces})\n"
        ),
    )?;
    let cmds = [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
    ];
    let imports: String = cmds
        .iter()
        .map(|c| format!("\t_ \"k8s.io/kubernetes/cmd/{c}\"\n"))
        .collect();
    fs::write(
        src.join("tools.go"),
        format!("//go:build tools\n\npackage tools\n\nimport (\n{imports})\n"),
    )?;
    go(&["mod", "tidy"], Some(&src))?;
    // Without these the binaries report v0.0.0 and Helm rejects charts with a kubeVersion constraint.
    let mut ldflags = String::from("-s -w");
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        ldflags.push_str(&format!(
            " -X {pkg}.gitVersion={v} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean -X {pkg}.buildDate=1970-01-01T00:00:00Z"
        ));
    }
    let mut args = vec![
        "build".to_string(),
        "-trimpath".into(),
        "-tags=selinux,notest".into(),
        format!("-ldflags={ldflags}"),
        "-o".into(),
        format!("{}/", out.display()),
    ];
    args.extend(cmds.iter().map(|c| format!("k8s.io/kubernetes/cmd/{c}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    go(&args, Some(&src)).map(drop)
}

fn build_etcd(out: &Path) -> Result<(), Error> {
    let v = versions::ETCD;
    let src = source_dir(out, "etcd", v)?;
    fs::write(
        src.join("go.mod"),
        format!(
            "module cotenant.local/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 {v}\n"
        ),
    )?;
    fs::write(
        src.join("tools.go"),
        "//go:build tools\n\npackage tools\n\nimport _ \"go.etcd.io/etcd/server/v3\"\n",
    )?;
    go(&["mod", "tidy"], Some(&src))?;
    let target = out.join("etcd");
    let target = target.to_string_lossy();
    go(
        &[
            "build",
            "-trimpath",
            "-ldflags=-s -w",
            "-o",
            &target,
            "go.etcd.io/etcd/server/v3",
        ],
        Some(&src),
    )
    .map(drop)
}

fn build_helm(out: &Path) -> Result<(), Error> {
    let (major, minor) = kubernetes_major_minor()?;
    // What Helm's own Makefile sets: without it `helm template` assumes Kubernetes v1.20 and
    // rejects our chart's kubeVersion constraint.
    let mut ldflags = format!(
        "-s -w -X helm.sh/helm/v3/internal/version.version={}",
        versions::HELM
    );
    for pkg in [
        "helm.sh/helm/v3/pkg/chartutil",
        "helm.sh/helm/v3/pkg/lint/rules",
    ] {
        ldflags.push_str(&format!(
            " -X {pkg}.k8sVersionMajor={major} -X {pkg}.k8sVersionMinor={minor}"
        ));
    }
    go_install("helm.sh/helm/v3/cmd/helm", versions::HELM, &ldflags, out)
}

fn build_kwok(out: &Path) -> Result<(), Error> {
    let v = versions::KWOK;
    go_install("sigs.k8s.io/kwok/cmd/kwok", v, "-s -w", out)?;
    // kwok v0.8 ships no default stages: take the node and pod lifecycles from its own module.
    let modcache = go(&["env", "GOMODCACHE"], None)?;
    let stage =
        PathBuf::from(modcache.trim()).join(format!("sigs.k8s.io/kwok@{v}/kustomize/stage"));
    let mut stages = String::new();
    for file in [
        "node/fast/node-initialize.yaml",
        "node/heartbeat/node-heartbeat.yaml",
        "pod/fast/pod-ready.yaml",
        "pod/fast/pod-complete.yaml",
        "pod/fast/pod-delete.yaml",
    ] {
        stages.push_str("---\n");
        stages.push_str(&fs::read_to_string(stage.join(file))?);
        stages.push('\n');
    }
    fs::write(out.join("stages.yaml"), stages)?;
    Ok(())
}

fn go_install(package: &str, version: &str, ldflags: &str, out: &Path) -> Result<(), Error> {
    let mut cmd = go_command(None);
    cmd.env("GOBIN", out)
        .args(["install", "-trimpath", &format!("-ldflags={ldflags}")])
        .arg(format!("{package}@{version}"));
    run(cmd, package).map(drop)
}

/// `cargo install` of the pinned oha, its own build directory removed afterwards so the cache
/// keeps only the binary.
fn build_oha(out: &Path) -> Result<(), Error> {
    let build = out.join("build");
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args([
        "install",
        "oha",
        "--locked",
        "--quiet",
        "--version",
        versions::OHA,
    ])
    .arg("--root")
    .arg(out)
    .arg("--target-dir")
    .arg(&build)
    .env_remove("CARGO_TARGET_DIR")
    .env_remove("RUSTFLAGS");
    run(cmd, "oha")?;
    let _ = fs::remove_dir_all(&build);
    Ok(())
}

/// Triton's `perf_analyzer`, prebuilt, without installing anything on the system: pip and apt
/// only download. The binary comes from the pinned `tritonclient` wheel, `libcudart.so.12` from the
/// `nvidia-cuda-runtime-cu12` wheel (no GPU is needed) and `libb64.so.0d` from Debian's
/// `libb64-0d`; `bin/perf_analyzer` is a wrapper that puts `lib/` on `LD_LIBRARY_PATH` and runs
/// `libexec/perf_analyzer`.
fn build_perf_analyzer(out: &Path) -> Result<(), Error> {
    let v = versions::PERF_ANALYZER;
    let work = out.join("download");
    let (bin, lib, libexec) = (out.join("bin"), out.join("lib"), out.join("libexec"));
    for dir in [&work, &bin, &lib, &libexec] {
        fs::create_dir_all(dir)?;
    }
    let python = python3()?;
    let mut pip = Command::new(&python);
    pip.args([
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
    ])
    .arg(&work)
    .arg(format!("tritonclient=={v}"))
    .arg(format!(
        "nvidia-cuda-runtime-cu12=={}",
        versions::CUDA_RUNTIME
    ));
    run(pip, "pip download")?;
    let real = libexec.join("perf_analyzer");
    unzip(
        &python,
        &find_file(&work, "tritonclient-", ".whl")?,
        &format!("tritonclient-{v}.data/data/bin/perf_analyzer"),
        &real,
    )?;
    unzip(
        &python,
        &find_file(&work, "nvidia_cuda_runtime_cu12-", ".whl")?,
        "nvidia/cuda_runtime/lib/libcudart.so.12",
        &lib.join("libcudart.so.12"),
    )?;
    libb64(&work, &lib)?;
    let wrapper = bin.join("perf_analyzer");
    fs::write(
        &wrapper,
        format!(
            r#"#!/bin/sh
# Triton's perf_analyzer {v} (the tritonclient wheel's), with the libraries it needs.
root=$(dirname "$(dirname "$(readlink -f "$0")")")
LD_LIBRARY_PATH="$root/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
export LD_LIBRARY_PATH
exec "$root/libexec/perf_analyzer" "$@"
"#
        ),
    )?;
    for exe in [&real, &wrapper] {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(exe, fs::Permissions::from_mode(0o755))?;
    }
    // A missing library shows here as the loader's error, not in the middle of a test.
    let version = Command::new(&wrapper)
        .arg("--version")
        .output()
        .map_err(|e| Error::Spawn {
            what: wrapper.display().to_string(),
            source: e,
        })?;
    // It prints its version on stderr.
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&version.stdout),
        String::from_utf8_lossy(&version.stderr)
    );
    if !version.status.success() || !printed.contains(&format!("Version {v}")) {
        return Err(Error::Build {
            what: "perf_analyzer".into(),
            detail: format!(
                "`perf_analyzer --version` ({}) printed:\n{printed}",
                version.status
            ),
        });
    }
    let _ = fs::remove_dir_all(&work);
    Ok(())
}

/// Copies `libb64.so.0d` out of Debian's `libb64-0d` package into `lib`. `apt-get download` only
/// fetches the `.deb`; when the system's package lists do not know it (a fresh container has
/// none), lists are fetched into `work` instead, leaving the system's as they are.
fn libb64(work: &Path, lib: &Path) -> Result<(), Error> {
    let debs = work.join("debs");
    fs::create_dir_all(&debs)?;
    let mut download = Command::new("apt-get");
    download
        .args(["-q", "download", "libb64-0d"])
        .current_dir(&debs);
    if let Err(system) = run(download, "apt-get download libb64-0d") {
        let lists = work.join("apt/lists");
        let cache = work.join("apt/cache");
        fs::create_dir_all(lists.join("partial"))?;
        fs::create_dir_all(cache.join("archives/partial"))?;
        let private = |args: &[&str]| {
            let mut cmd = Command::new("apt-get");
            cmd.arg("-q")
                .arg("-o")
                .arg(format!("Dir::State::Lists={}", lists.display()))
                .arg("-o")
                .arg(format!("Dir::Cache={}", cache.display()))
                .args(args)
                .current_dir(&debs);
            cmd
        };
        run(
            private(&["update"]),
            "apt-get update (into a private folder)",
        )
        .and_then(|_| run(private(&["download", "libb64-0d"]), "apt-get download"))
        .map_err(|e| Error::Build {
            what: "libb64-0d".into(),
            detail: format!("with the system's package lists: {system}\nwith fresh ones: {e}"),
        })?;
    }
    let unpacked = work.join("libb64");
    let mut extract = Command::new("dpkg-deb");
    extract
        .arg("-x")
        .arg(find_file(&debs, "libb64-0d_", ".deb")?)
        .arg(&unpacked);
    run(extract, "dpkg-deb -x")?;
    let so = find_named(&unpacked, "libb64.so.0d")?.ok_or_else(|| Error::Build {
        what: "libb64-0d".into(),
        detail: "the package holds no libb64.so.0d".into(),
    })?;
    fs::copy(so, lib.join("libb64.so.0d"))?;
    Ok(())
}

/// The one file in `dir` named `<prefix>…<suffix>`.
fn find_file(dir: &Path, prefix: &str, suffix: &str) -> Result<PathBuf, Error> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with(prefix) && name.ends_with(suffix) {
            return Ok(path);
        }
    }
    Err(Error::Build {
        what: format!("{prefix}*{suffix}"),
        detail: format!("not downloaded into {}", dir.display()),
    })
}

/// The first file called `name` anywhere under `dir`.
fn find_named(dir: &Path, name: &str) -> Result<Option<PathBuf>, Error> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            if let Some(found) = find_named(&path, name)? {
                return Ok(Some(found));
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Extracts `member` of the zip archive (wheel) `archive` to `dest`, with Python's `zipfile`.
fn unzip(python: &Path, archive: &Path, member: &str, dest: &Path) -> Result<(), Error> {
    const SCRIPT: &str = r#"
import shutil, sys, zipfile
archive, member, dest = sys.argv[1:]
with zipfile.ZipFile(archive) as z:
    if member not in z.namelist():
        sys.exit(f"{archive} holds no {member}")
    with z.open(member) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out)
"#;
    let mut cmd = Command::new(python);
    cmd.args(["-c", SCRIPT]).arg(archive).arg(member).arg(dest);
    run(cmd, "unzip").map(drop)
}

/// `python3` (else `python`) from `PATH`.
fn python3() -> Result<PathBuf, Error> {
    ["python3", "python"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(PathBuf::from)
        .ok_or_else(|| Error::Build {
            what: "perf_analyzer".into(),
            detail: "no python3 on PATH (pip downloads its wheels)".into(),
        })
}

fn source_dir(out: &Path, name: &str, version: &str) -> Result<PathBuf, Error> {
    let src = out
        .parent()
        .and_then(Path::parent)
        .unwrap_or(out)
        .join("src")
        .join(format!("{name}-{version}"));
    fs::create_dir_all(&src)?;
    Ok(src)
}

fn go_command(dir: Option<&Path>) -> Command {
    let mut cmd = Command::new("go");
    cmd.env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-buildvcs=false");
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    cmd
}

fn go(args: &[&str], dir: Option<&Path>) -> Result<String, Error> {
    let mut cmd = go_command(dir);
    cmd.args(args);
    run(
        cmd,
        &format!("go {}", args.first().copied().unwrap_or_default()),
    )
}

fn run(mut cmd: Command, what: &str) -> Result<String, Error> {
    let output = cmd.output().map_err(|e| Error::Spawn {
        what: format!("{what} ({})", cmd.get_program().to_string_lossy()),
        source: e,
    })?;
    if !output.status.success() {
        return Err(Error::Build {
            what: what.to_string(),
            detail: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// An exclusive `flock` on a file, so concurrent test binaries do not build the same thing twice.
struct FileLock(fs::File);

impl FileLock {
    fn acquire(path: &Path) -> Result<FileLock, Error> {
        use std::os::fd::AsRawFd;
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(FileLock(file))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}
