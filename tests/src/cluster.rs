//! A local control plane on loopback: etcd, kube-apiserver (RBAC on), kube-controller-manager,
//! kube-scheduler and kwok with fake GPU nodes, started the way controller-runtime's envtest does.

use crate::process::{Lifetime, Process};
use crate::toolchain::Tools;
use crate::{Error, pki};
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How to start a control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory for certificates, etcd data, kubeconfig and logs.
    pub dir: PathBuf,
    pub lifetime: Lifetime,
    /// Fake GPU nodes to create, each with `gpus_per_node` GPUs.
    pub gpu_nodes: u32,
    pub gpus_per_node: u32,
}

/// A running control plane. Dropping it stops every process.
#[derive(Debug)]
pub struct ControlPlane {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub server: String,
    pub tools: Tools,
    processes: Vec<Process>,
}

/// Audit requests by ServiceAccounts when they complete, with their metadata only.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  userGroups: [\"system:serviceaccounts\"]
- level: None
";

/// Generous: kube-apiserver takes tens of seconds to become ready on 2 busy cores.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

impl ControlPlane {
    /// Starts every component and waits until the API server is ready and the nodes are Ready.
    pub fn start(tools: Tools, options: &Options) -> Result<ControlPlane, Error> {
        let dir = options.dir.clone();
        std::fs::create_dir_all(dir.join("logs"))?;
        let logs = dir.join("logs");
        let pki = pki::write(&dir.join("pki"))?;
        let (etcd_client, etcd_peer, api_port) = (free_port()?, free_port()?, free_port()?);
        let server = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = dir.join("admin.kubeconfig");
        std::fs::write(&kubeconfig, pki::admin_kubeconfig(&pki, &server))?;
        let mut cp = ControlPlane {
            dir: dir.clone(),
            kubeconfig: kubeconfig.clone(),
            server,
            tools: tools.clone(),
            processes: Vec::new(),
        };

        let mut etcd = Command::new(&tools.etcd);
        etcd.args([
            "--name=default",
            "--unsafe-no-fsync",
            "--log-level=warn",
            &format!("--data-dir={}", dir.join("etcd").display()),
            &format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
            &format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer}"),
        ]);
        cp.spawn("etcd", etcd, &logs, options.lifetime)?;

        // Every request by a ServiceAccount (the operator, agents) is audited, so tests can
        // count what a component asks of the API server, by verb and resource.
        let audit_policy = dir.join("audit-policy.yaml");
        std::fs::write(&audit_policy, AUDIT_POLICY)?;
        let mut apiserver = Command::new(&tools.kube_apiserver);
        apiserver.args([
            &format!("--audit-policy-file={}", audit_policy.display()),
            &format!("--audit-log-path={}", dir.join("logs/audit.log").display()),
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
            &format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            &format!("--secure-port={api_port}"),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            &format!("--cert-dir={}", dir.join("apiserver").display()),
            &format!("--tls-cert-file={}", pki.serving_cert.display()),
            &format!("--tls-private-key-file={}", pki.serving_key.display()),
            &format!("--client-ca-file={}", pki.ca_cert.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            &format!("--service-account-key-file={}", pki.sa_pub.display()),
            &format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ),
            "--service-cluster-ip-range=10.0.0.0/16",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--v=1",
        ]);
        cp.spawn("kube-apiserver", apiserver, &logs, options.lifetime)?;
        cp.wait_ready()?;

        let kubeconfig_flag = format!("--kubeconfig={}", kubeconfig.display());
        let mut kcm = Command::new(&tools.kube_controller_manager);
        kcm.args([
            &kubeconfig_flag,
            "--leader-elect=false",
            "--secure-port=0",
            &format!(
                "--service-account-private-key-file={}",
                pki.sa_key.display()
            ),
            &format!("--root-ca-file={}", pki.ca_cert.display()),
            "--controllers=*",
            "--v=1",
        ]);
        cp.spawn("kube-controller-manager", kcm, &logs, options.lifetime)?;

        let mut scheduler = Command::new(&tools.kube_scheduler);
        scheduler.args([
            &kubeconfig_flag,
            "--leader-elect=false",
            "--secure-port=0",
            "--v=1",
        ]);
        cp.spawn("kube-scheduler", scheduler, &logs, options.lifetime)?;

        // Pods live at this host's address, where their host processes listen (the operator
        // routes to a pod's IP from the Pod object, as in a cluster).
        let host_ip = crate::agents::host_ip();
        let stages = dir.join("kwok-stages.yaml");
        std::fs::write(
            &stages,
            pods_on_node_ip(&std::fs::read_to_string(&tools.kwok_stages)?)?,
        )?;
        let mut kwok = Command::new(&tools.kwok);
        kwok.args([
            &kubeconfig_flag,
            &format!("--config={}", stages.display()),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            &format!("--node-ip={host_ip}"),
            &format!("--server-address=127.0.0.1:{}", free_port()?),
        ]);
        cp.spawn("kwok", kwok, &logs, options.lifetime)?;

        cp.add_node("cpu-0", 0)?;
        for i in 0..options.gpu_nodes {
            cp.add_node(&format!("gpu-{i}"), options.gpus_per_node)?;
        }
        cp.kubectl_ok(&[
            "wait",
            "--for=condition=Ready",
            "node",
            "--all",
            "--timeout=120s",
        ])?;
        Ok(cp)
    }

    fn spawn(
        &mut self,
        name: &str,
        cmd: Command,
        logs: &Path,
        lifetime: Lifetime,
    ) -> Result<(), Error> {
        self.processes
            .push(Process::spawn(name, cmd, logs, lifetime)?);
        Ok(())
    }

    /// Polls `/readyz` until the API server answers ok, failing early when a process has died.
    fn wait_ready(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            for p in &mut self.processes {
                if !p.is_running() {
                    return Err(Error::Died {
                        what: p.name.clone(),
                        log: p.log_tail(30),
                    });
                }
            }
            if let Ok(out) = self.kubectl().args(["get", "--raw=/readyz"]).output()
                && out.status.success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = self
                    .processes
                    .iter()
                    .map(|p| format!("--- {}:\n{}", p.name, p.log_tail(15)))
                    .collect::<Vec<_>>()
                    .join("\n");
                return Err(Error::Timeout {
                    what: "kube-apiserver /readyz".into(),
                    log,
                });
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Creates a Node that kwok manages; `gpus > 0` makes it a GPU node (labelled and tainted the
    /// way the NVIDIA device plugin and GPU node pools do). This is also how a test plays the
    /// cluster autoscaler adding a GPU node.
    pub fn add_node(&self, name: &str, gpus: u32) -> Result<(), Error> {
        let (gpu_labels, gpu_taints, gpu_resources) = if gpus > 0 {
            (
                "    nvidia.com/gpu.present: \"true\"\n",
                "  taints:\n  - key: nvidia.com/gpu\n    value: \"present\"\n    effect: NoSchedule\n",
                format!("    nvidia.com/gpu: \"{gpus}\"\n"),
            )
        } else {
            ("", "", String::new())
        };
        let manifest = format!(
            "apiVersion: v1
kind: Node
metadata:
  name: {name}
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: \"0\"
  labels:
    type: kwok
    kubernetes.io/hostname: {name}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
{gpu_labels}spec:
{gpu_taints}status:
  allocatable:
    cpu: \"32\"
    memory: 256Gi
    pods: \"110\"
{gpu_resources}  capacity:
    cpu: \"32\"
    memory: 256Gi
    pods: \"110\"
{gpu_resources}"
        );
        self.kubectl_apply(&manifest)
    }

    /// The API server's audit log: one JSON event per request by a ServiceAccount.
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("logs/audit.log")
    }

    /// A `kubectl` command bound to the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(&self.tools.kubectl);
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// A `helm` command bound to the admin kubeconfig.
    pub fn helm(&self) -> Command {
        let mut cmd = Command::new(&self.tools.helm);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"));
        cmd
    }

    /// `helm install <release>` of the repository's chart into `namespace`, without the default
    /// pool (tests make their own); an error with helm's output when it fails.
    pub fn install_chart(&self, release: &str, namespace: &str) -> Result<String, Error> {
        let chart = crate::TestNamespace::repo_root().join("charts/cotenant");
        let mut install = self.helm();
        install
            .args([
                "install",
                release,
                &chart.to_string_lossy(),
                "-n",
                namespace,
            ])
            .args(["--set", "defaultPool.enabled=false"]);
        checked(install.output(), "helm install")
    }

    /// Runs kubectl with `args` and returns stdout, or an error with stderr.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String, Error> {
        let mut cmd = self.kubectl();
        cmd.args(args);
        checked(cmd.output(), &format!("kubectl {}", args.join(" ")))
    }

    /// `kubectl apply -f -` of a manifest.
    pub fn kubectl_apply(&self, manifest: &str) -> Result<(), Error> {
        let out = self.kubectl_stdin(&["apply", "-f", "-"], manifest)?;
        checked(Ok(out), "kubectl apply").map(drop)
    }

    /// Runs kubectl with `args`, feeding `stdin`, and returns the raw output.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Result<Output, Error> {
        let mut child = self
            .kubectl()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::Spawn {
                what: "kubectl".into(),
                source: e,
            })?;
        if let Some(mut input) = child.stdin.take() {
            input.write_all(stdin.as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    }

    /// A kubeconfig that authenticates as ServiceAccount `namespace/name` with a fresh token, so a
    /// process runs with exactly the permissions RBAC gives that account.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, Error> {
        self.service_account_kubeconfig_via(namespace, name, None, &self.server)
    }

    /// Like [`ControlPlane::service_account_kubeconfig`], with a token bound to pod `pod` (as
    /// the kubelet projects one into a pod): the API server then knows which pod is calling.
    pub fn pod_kubeconfig(&self, namespace: &str, name: &str, pod: &str) -> Result<PathBuf, Error> {
        self.service_account_kubeconfig_via(namespace, name, Some(pod), &self.server)
    }

    /// A ServiceAccount kubeconfig reaching the API server at `server` (a proxy in front of it,
    /// whose address the serving certificate also covers), bound to `pod` when given.
    pub fn service_account_kubeconfig_via(
        &self,
        namespace: &str,
        name: &str,
        pod: Option<&str>,
        server: &str,
    ) -> Result<PathBuf, Error> {
        let mut args = vec![
            "create".to_string(),
            "token".into(),
            name.into(),
            "-n".into(),
            namespace.into(),
            "--duration=2h".into(),
        ];
        if let Some(pod) = pod {
            let uid = self.kubectl_ok(&[
                "get",
                "pod",
                pod,
                "-n",
                namespace,
                "-o",
                "jsonpath={.metadata.uid}",
            ])?;
            args.extend([
                "--bound-object-kind=Pod".to_string(),
                format!("--bound-object-name={pod}"),
                format!("--bound-object-uid={uid}"),
            ]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let token = self.kubectl_ok(&args)?;
        let host = server
            .rsplit('/')
            .next()
            .unwrap_or(server)
            .replace(':', "-");
        let path = self.dir.join(format!(
            "{namespace}-{name}-{}{host}.kubeconfig",
            pod.map(|p| format!("{p}-")).unwrap_or_default()
        ));
        let ca = self.dir.join("pki/ca.crt");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: local\n  context:\n    cluster: local\n    user: {name}\n    namespace: {namespace}\ncurrent-context: local\n",
                ca = ca.display(),
                token = token.trim(),
            ),
        )?;
        Ok(path)
    }

    /// Pids of the running components, for `cargo xtask cluster down`.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(|p| p.pid).collect()
    }

    /// Gives up ownership of the processes without stopping them (detached clusters).
    pub fn detach(mut self) {
        for p in std::mem::take(&mut self.processes) {
            std::mem::forget(p);
        }
    }

    /// Stops every process, API server clients first and etcd last.
    pub fn stop(&mut self) {
        while let Some(mut p) = self.processes.pop() {
            p.stop();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// kwok's stages with every pod given its node's IP, as if on the host network: the test's host
/// processes serve every pod, so a pod's IP must be this host's.
fn pods_on_node_ip(stages: &str) -> Result<String, Error> {
    const POD_NETWORK: &str = "( or .spec.hostNetwork false )";
    if !stages.contains(POD_NETWORK) {
        return Err(Error::Command {
            what: "adapting kwok's pod-ready stage".into(),
            stderr: format!("its pod IP template no longer contains {POD_NETWORK:?}"),
        });
    }
    Ok(stages.replace(POD_NETWORK, "true"))
}

/// stdout of a finished command, or an error carrying its stderr.
pub fn checked(output: std::io::Result<Output>, what: &str) -> Result<String, Error> {
    let output = output.map_err(|e| Error::Spawn {
        what: what.to_string(),
        source: e,
    })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Command {
            what: what.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
