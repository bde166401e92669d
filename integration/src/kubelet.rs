//! What kubelet does with a pod, done through CRI: no kubelet runs on the
//! project's machines, so a test that runs a rendered manifest's pod (the NRI
//! DaemonSet, the proxy installer) turns its pod template into the calls
//! kubelet 1.33 makes, with what kubelet and the API server's admission add:
//!
//! * the pod's identity (name from the DaemonSet, a fresh uid), its QoS class
//!   and the cgroup parent kubelet gives it with the systemd driver
//!   (`kubepods-burstable-pod<uid>.slice`);
//! * `RunPodSandbox`: host namespaces (`hostNetwork`, `hostPID`, `hostIPC`),
//!   the DNS kubelet gives a pod without cluster DNS (the node's), port
//!   mappings, the pod-level resources;
//! * volumes as kubelet materialises them: a `hostPath` checked against its
//!   `type` (`Directory` must exist, `DirectoryOrCreate` is made 0755), a
//!   `configMap` in kubelet's atomic-writer layout (`..data` and links), the
//!   service account's projected token, `ca.crt` and `namespace` (the
//!   ServiceAccount admission plugin's `kube-api-access-*` volume),
//!   `/etc/hosts` and the termination-message file;
//! * `CreateContainer`: command, args, env (`fieldRef`s resolved, the
//!   `KUBERNETES_SERVICE_*` variables kubelet always adds), mounts with their
//!   propagation, the security context (capabilities, user, read-only root,
//!   no_new_privs, seccomp, kubelet's masked and read-only /proc paths), the
//!   resources as kubelet converts them (shares, CFS quota, memory limit, the
//!   OOM score kubelet gives a node-critical pod), log path, labels.
//!
//! The manifests' fields are validated strictly against the Kubernetes 1.33
//! schemas offline (`integration/scripts/check-deploy.sh`): a misspelt key
//! fails there, so this stand-in reads fields by name. What kubelet and
//! admission refuse at run time, it refuses too (an error, the pod does not
//! start): a missing ServiceAccount, ConfigMap or key, a hostPath of the
//! wrong type, `runAsNonRoot` with uid 0, a seccomp or AppArmor profile or a
//! propagation it cannot give, init containers (not handled here).
//!
//! What it does not do: pull (the tests import the image and the pod's
//! `IfNotPresent` policy then uses it, as on an air-gapped node), probe on
//! its own (the tests call [`probe`]), restart on its own (the tests stop and
//! recreate the container, as kubelet does after a failed liveness probe).

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use serde_json::{json, Value};

use crate::node::Node;
use crate::testbed::Cri;

/// Every object of a rendered kustomization (`kubectl kustomize DIR`).
pub fn objects(rendered: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(rendered)
        .expect("rendered manifests are YAML")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// The object of `kind` named `name` among `objects`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered manifests"))
}

/// The API server the pod's in-cluster config reaches (what kubelet puts in
/// `KUBERNETES_SERVICE_HOST`/`PORT`, and the service account's files).
#[derive(Debug, Clone)]
pub struct ApiServer {
    pub host: String,
    pub port: u16,
    pub ca_pem: Vec<u8>,
    pub token: String,
}

/// The node the pod runs on.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    /// kubelet's root dir (`--root-dir`, /var/lib/kubelet).
    pub root: PathBuf,
    /// The node's memory, for a Burstable pod's OOM score.
    pub memory_bytes: i64,
    /// The node's InternalIP (`status.hostIP`).
    pub ip: String,
}

/// A quantity (`500m`, `2`, `64Mi`, `1G`) in milli-units for `cpu` (`milli`)
/// or in units (bytes) otherwise.
pub fn quantity(q: &Value, milli: bool) -> i64 {
    let s = match q {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => panic!("not a quantity: {q}"),
    };
    let (num, mult): (&str, f64) = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("m", 1e-3),
    ]
    .iter()
    .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((s.as_str(), 1.0));
    let v: f64 = num.parse().unwrap_or_else(|_| panic!("bad quantity {s}"));
    let units = v * mult;
    if milli {
        (units * 1000.0).round() as i64
    } else {
        units.ceil() as i64
    }
}

/// A pod kubelet runs from a template (a DaemonSet's), on this node.
pub struct KubeletPod {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// The pod spec, with what admission adds (the service account volume).
    pub spec: Value,
    pub labels: serde_json::Map<String, Value>,
    pub node: NodeInfo,
    pub api: ApiServer,
    /// ConfigMaps the pod's volumes name (rendered alongside).
    configmaps: HashMap<String, Value>,
    /// `/var/lib/kubelet/pods/<uid>`.
    pub dir: PathBuf,
    pub sandbox: Option<String>,
    pub sandbox_config: Option<cri::PodSandboxConfig>,
    pub ip: String,
    /// Each volume's host path, set up before the sandbox (as kubelet waits
    /// for the pod's volumes before RunPodSandbox).
    volumes: HashMap<String, String>,
}

/// The projected service-account volume's name (admission adds it).
const SA_VOLUME: &str = "kube-api-access-q7x2k";
const SA_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

impl KubeletPod {
    /// The pod a DaemonSet named `daemonset` in `objects` puts on `node`.
    pub fn from_daemonset(
        objects: &[Value],
        daemonset: &str,
        node: NodeInfo,
        api: ApiServer,
    ) -> Self {
        let ds = find(objects, "DaemonSet", daemonset);
        let namespace = ds["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let template = &ds["spec"]["template"];
        let mut spec = template["spec"].clone();
        assert!(
            spec["initContainers"]
                .as_array()
                .is_none_or(|a| a.is_empty()),
            "init containers are not handled by this kubelet stand-in"
        );
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let uid = format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (t >> 32) as u32,
            (t >> 16) as u16,
            (t & 0xfff) as u16,
            std::process::id() & 0xfff,
            t & 0xffff_ffff_ffff
        );
        let name = format!("{daemonset}-{}", &uid[24..29]);
        spec["nodeName"] = json!(node.name);
        // the Priority admission plugin
        let priority = match spec["priorityClassName"].as_str() {
            Some("system-node-critical") => 2_000_001_000,
            Some("system-cluster-critical") => 2_000_000_000,
            Some(other) => panic!("priorityClassName {other}: not a built-in class"),
            None => 0,
        };
        spec["priority"] = json!(priority);
        // the ServiceAccount admission plugin: the account must exist; unless
        // the pod or the account opts out, the token, the cluster's CA and
        // the namespace, projected, mounted read-only in every container
        // that does not mount that path itself
        let sa_name = spec["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let sa = objects
            .iter()
            .find(|o| {
                o["kind"] == "ServiceAccount"
                    && o["metadata"]["name"] == sa_name.as_str()
                    && o["metadata"]["namespace"] == namespace.as_str()
            })
            .unwrap_or_else(|| {
                panic!("admission: serviceaccount \"{namespace}/{sa_name}\" not found")
            });
        let automount = match &spec["automountServiceAccountToken"] {
            Value::Bool(b) => *b,
            _ => sa["automountServiceAccountToken"] != json!(false),
        };
        if automount {
            let vols = spec["volumes"].as_array_mut().expect("volumes");
            vols.push(json!({"name": SA_VOLUME, "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}));
            for c in spec["containers"].as_array_mut().expect("containers") {
                let mounts = c
                    .as_object_mut()
                    .unwrap()
                    .entry("volumeMounts")
                    .or_insert_with(|| json!([]));
                let mounts = mounts.as_array_mut().unwrap();
                if !mounts.iter().any(|m| m["mountPath"] == SA_PATH) {
                    mounts.push(json!({"name": SA_VOLUME, "mountPath": SA_PATH, "readOnly": true}));
                }
            }
        }
        // the pod's namespace only
        let configmaps = objects
            .iter()
            .filter(|o| {
                o["kind"] == "ConfigMap" && o["metadata"]["namespace"] == namespace.as_str()
            })
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap().to_string(),
                    o.clone(),
                )
            })
            .collect();
        // the DaemonSet controller's labels beside the template's
        let mut labels = template["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        labels.insert("controller-revision-hash".into(), json!("5d8f7b9c6d"));
        labels.insert("pod-template-generation".into(), json!("1"));
        let dir = node.root.join("pods").join(&uid);
        Self {
            name,
            namespace,
            uid,
            spec,
            labels,
            node,
            api,
            configmaps,
            dir,
            sandbox: None,
            sandbox_config: None,
            ip: String::new(),
            volumes: HashMap::new(),
        }
    }

    /// A rendered ConfigMap the pod mounts, to change before the pod starts
    /// (what a user's overlay does to the config file).
    pub fn configmap_mut(&mut self, prefix: &str) -> &mut Value {
        let key = self
            .configmaps
            .keys()
            .find(|k| k.starts_with(prefix))
            .unwrap_or_else(|| panic!("no ConfigMap {prefix}*"))
            .clone();
        self.configmaps.get_mut(&key).unwrap()
    }

    fn containers(&self) -> &[Value] {
        self.spec["containers"].as_array().expect("containers")
    }

    /// Guaranteed, Burstable or BestEffort, as the API server computes it.
    pub fn qos_class(&self) -> &'static str {
        let mut any = false;
        let mut guaranteed = true;
        for c in self.containers() {
            let r = &c["resources"];
            for res in ["cpu", "memory"] {
                let (req, lim) = (&r["requests"][res], &r["limits"][res]);
                any |= !req.is_null() || !lim.is_null();
                let req = if req.is_null() { lim } else { req };
                if lim.is_null() || quantity(req, res == "cpu") != quantity(lim, res == "cpu") {
                    guaranteed = false;
                }
            }
        }
        match (any, guaranteed) {
            (false, _) => "BestEffort",
            (true, true) => "Guaranteed",
            (true, false) => "Burstable",
        }
    }

    /// The cgroup parent kubelet gives the pod with the systemd driver.
    pub fn cgroup_parent(&self) -> String {
        let qos = match self.qos_class() {
            "Guaranteed" => "",
            "Burstable" => "burstable",
            _ => "besteffort",
        };
        Node::slice(qos, &self.uid)
    }

    /// The Pod as the API server has it once scheduled and running.
    pub fn api_object(&self) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid,
                            "labels": self.labels, "creationTimestamp": "2026-12-07T10:00:00Z",
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                 "name": "qoslet", "uid": "ds-uid", "controller": true}]},
               "spec": self.spec,
               "status": {"phase": "Running", "qosClass": self.qos_class(), "podIP": self.ip}})
    }

    /// A container's field of its security context, else the pod's
    /// (kubelet's DetermineEffectiveSecurityContext).
    fn effective<'a>(&'a self, c: &'a Value, field: &str) -> &'a Value {
        let v = &c["securityContext"][field];
        if v.is_null() {
            &self.spec["securityContext"][field]
        } else {
            v
        }
    }

    /// The seccomp profile kubelet sends for `profile` (a securityContext's
    /// `seccompProfile`); none set is Unconfined (kubelet's default without
    /// `--seccomp-default`).
    fn seccomp(profile: &Value) -> Result<cri::SecurityProfile, String> {
        let t = match profile["type"].as_str() {
            None | Some("Unconfined") => cri::security_profile::ProfileType::Unconfined,
            Some("RuntimeDefault") => cri::security_profile::ProfileType::RuntimeDefault,
            Some(t) => {
                return Err(format!(
                    "seccomp profile {t}: not given by this kubelet stand-in"
                ))
            }
        };
        Ok(cri::SecurityProfile {
            profile_type: t as i32,
            ..Default::default()
        })
    }

    fn privileged(&self) -> bool {
        self.containers()
            .iter()
            .any(|c| c["securityContext"]["privileged"] == json!(true))
    }

    fn host_namespaces(&self) -> cri::NamespaceOption {
        let mode = |host: &str, otherwise: cri::NamespaceMode| {
            if self.spec[host] == json!(true) {
                cri::NamespaceMode::Node as i32
            } else {
                otherwise as i32
            }
        };
        cri::NamespaceOption {
            network: mode("hostNetwork", cri::NamespaceMode::Pod),
            pid: mode("hostPID", cri::NamespaceMode::Container),
            ipc: mode("hostIPC", cri::NamespaceMode::Pod),
            ..Default::default()
        }
    }

    /// kubelet's resources for one container (or, summed, the pod's).
    fn resources(&self, containers: &[&Value]) -> cri::LinuxContainerResources {
        let sum = |kind: &str, res: &str| -> Option<i64> {
            let vals: Vec<i64> = containers
                .iter()
                .filter_map(|c| {
                    let v = &c["resources"][kind][res];
                    (!v.is_null()).then(|| quantity(v, res == "cpu"))
                })
                .collect();
            (!vals.is_empty()).then(|| vals.iter().sum())
        };
        let cpu_req = sum("requests", "cpu").or(sum("limits", "cpu"));
        // milliCPUToShares and milliCPUToQuota (period 100 ms)
        let shares = cpu_req.map_or(2, |m| (m * 1024 / 1000).max(2));
        let quota = sum("limits", "cpu").map_or(0, |m| (m * 100_000 / 1000).max(1000));
        let mem_req = sum("requests", "memory")
            .or(sum("limits", "memory"))
            .unwrap_or(0);
        // kubelet: critical pods (priority >= 2,000,000,000) as Guaranteed
        let oom = if self.spec["priority"].as_i64().unwrap_or(0) >= 2_000_000_000 {
            -997
        } else {
            match self.qos_class() {
                "Guaranteed" => -997,
                "BestEffort" => 1000,
                _ => (1000 - 1000 * mem_req / self.node.memory_bytes).clamp(3, 999),
            }
        };
        // swap off (kubelet's NoSwap) where the swap controller is there:
        // cgroup v2's memory.swap.max in kubelet's own cgroup
        let mut unified = HashMap::new();
        if swap_controller() {
            unified.insert("memory.swap.max".to_string(), "0".to_string());
        }
        cri::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: quota,
            cpu_shares: shares,
            memory_limit_in_bytes: sum("limits", "memory").unwrap_or(0),
            oom_score_adj: oom,
            unified,
            ..Default::default()
        }
    }

    /// kubelet's pod cgroup, made before the sandbox with the pod's limits:
    /// a transient systemd slice (StartTransientUnit, as kubelet's systemd
    /// cgroup manager does), `CPUWeight` from the summed requests' shares,
    /// `CPUQuotaPerSecUSec` and `MemoryMax` from the summed limits.
    fn make_pod_cgroup(&self) {
        let all: Vec<&Value> = self.containers().iter().collect();
        let r = self.resources(&all);
        // runc's shares -> weight conversion (kubelet hands shares to it)
        let weight = 1 + ((r.cpu_shares.clamp(2, 262_144) - 2) * 9999) / 262_142;
        let mut props: Vec<String> = vec!["CPUWeight".into(), "t".into(), weight.to_string()];
        if r.cpu_quota > 0 {
            let per_sec = r.cpu_quota * 1_000_000 / r.cpu_period;
            props.extend(["CPUQuotaPerSecUSec".into(), "t".into(), per_sec.to_string()]);
        }
        if r.memory_limit_in_bytes > 0 {
            props.extend([
                "MemoryMax".into(),
                "t".into(),
                r.memory_limit_in_bytes.to_string(),
            ]);
        }
        let n = (props.len() / 3).to_string();
        let slice = self.cgroup_parent();
        let o = std::process::Command::new("busctl")
            .args([
                "call",
                "org.freedesktop.systemd1",
                "/org/freedesktop/systemd1",
                "org.freedesktop.systemd1.Manager",
                "StartTransientUnit",
                "ssa(sv)a(sa(sv))",
                &slice,
                "replace",
                &n,
            ])
            .args(&props)
            .arg("0")
            .output()
            .expect("busctl");
        assert!(
            o.status.success(),
            "the pod's slice {slice}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// RunPodSandbox as kubelet sends it; the sandbox's IP is then known.
    pub async fn run_sandbox(&mut self, cri: &mut Cri) -> Result<String, String> {
        std::fs::create_dir_all(self.dir.join("volumes")).unwrap();
        std::fs::create_dir_all(self.dir.join("plugins")).unwrap();
        self.volumes = self.volumes()?;
        self.make_pod_cgroup();
        let log_dir = self.log_dir();
        std::fs::create_dir_all(&log_dir).unwrap();
        let mut labels: HashMap<String, String> = self
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        labels.insert("io.kubernetes.pod.name".into(), self.name.clone());
        labels.insert("io.kubernetes.pod.namespace".into(), self.namespace.clone());
        labels.insert("io.kubernetes.pod.uid".into(), self.uid.clone());
        let annotations = HashMap::from([
            ("kubernetes.io/config.source".to_string(), "api".to_string()),
            (
                "kubernetes.io/config.seen".to_string(),
                "2026-12-07T10:00:00Z".to_string(),
            ),
        ]);
        let host_network = self.spec["hostNetwork"] == json!(true);
        let port_mappings = self
            .containers()
            .iter()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .map(|p| cri::PortMapping {
                protocol: match p["protocol"].as_str() {
                    Some("UDP") => cri::Protocol::Udp,
                    Some("SCTP") => cri::Protocol::Sctp,
                    _ => cri::Protocol::Tcp,
                } as i32,
                container_port: p["containerPort"].as_i64().unwrap_or(0) as i32,
                host_port: p["hostPort"].as_i64().unwrap_or(0) as i32,
                host_ip: p["hostIP"].as_str().unwrap_or_default().to_string(),
            })
            .collect();
        // dnsPolicy ClusterFirst on a kubelet without clusterDNS falls back
        // to the node's resolv.conf (kubelet logs it); hostNetwork pods too
        let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let field = |k: &str| -> Vec<String> {
            resolv
                .lines()
                .filter_map(|l| l.strip_prefix(k))
                .flat_map(|l| l.split_whitespace().map(str::to_string))
                .collect()
        };
        let all: Vec<&Value> = self.containers().iter().collect();
        let cfg = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            hostname: if host_network {
                String::new()
            } else {
                self.name.clone()
            },
            log_directory: log_dir.display().to_string(),
            dns_config: Some(cri::DnsConfig {
                servers: field("nameserver "),
                searches: field("search "),
                options: field("options "),
            }),
            port_mappings,
            labels,
            annotations,
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(self.host_namespaces()),
                    run_as_user: self.spec["securityContext"]["runAsUser"]
                        .as_i64()
                        .map(|value| cri::Int64Value { value }),
                    run_as_group: self.spec["securityContext"]["runAsGroup"]
                        .as_i64()
                        .map(|value| cri::Int64Value { value }),
                    privileged: self.privileged(),
                    seccomp: Some(Self::seccomp(
                        &self.spec["securityContext"]["seccompProfile"],
                    )?),
                    ..Default::default()
                }),
                resources: Some(cri::LinuxContainerResources {
                    oom_score_adj: 0,
                    ..self.resources(&all)
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = cri
            .run_pod(&cfg)
            .await
            .map_err(|e| format!("RunPodSandbox: {e}"))?;
        let status = cri
            .rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            })
            .await
            .expect("PodSandboxStatus")
            .into_inner()
            .status
            .unwrap_or_default();
        self.ip = status.network.map(|n| n.ip).unwrap_or_default();
        self.sandbox = Some(id.clone());
        self.sandbox_config = Some(cfg);
        Ok(id)
    }

    /// A hostPath checked (and made) as kubelet does for its `type`.
    fn host_path(&self, v: &Value) -> Result<String, String> {
        let path = v["path"].as_str().expect("hostPath.path").to_string();
        let p = Path::new(&path);
        match v["type"].as_str().unwrap_or("") {
            "" => {}
            "DirectoryOrCreate" => {
                if !p.exists() {
                    std::fs::create_dir_all(p).map_err(|e| format!("mkdir {path}: {e}"))?;
                    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
                        .map_err(|e| e.to_string())?;
                } else if !p.is_dir() {
                    return Err(format!(
                        "hostPath type check failed: {path} is not a directory"
                    ));
                }
            }
            "Directory" if !p.is_dir() => {
                return Err(format!(
                    "hostPath type check failed: {path} is not a directory"
                ))
            }
            "File" if !p.is_file() => {
                return Err(format!("hostPath type check failed: {path} is not a file"))
            }
            "Socket" => {
                use std::os::unix::fs::FileTypeExt;
                if !std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket()) {
                    return Err(format!(
                        "hostPath type check failed: {path} is not a socket file"
                    ));
                }
            }
            "Directory" | "File" => {}
            t => return Err(format!("hostPath type {t} is not handled here")),
        }
        Ok(path)
    }

    /// Files in kubelet's atomic-writer layout: `<dir>/..<ts>/<files>`,
    /// `..data` -> it, each file a link through `..data`.
    fn atomic_write(dir: &Path, files: &[(String, Vec<u8>, u32)]) {
        let _ = std::fs::remove_dir_all(dir);
        let ts = dir.join("..2026_12_07_10_00_00.000000001");
        std::fs::create_dir_all(&ts).unwrap();
        for (name, data, mode) in files {
            let f = ts.join(name);
            std::fs::write(&f, data).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(*mode)).unwrap();
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
        }
        std::os::unix::fs::symlink(ts.file_name().unwrap(), dir.join("..data")).unwrap();
    }

    /// A projected volume's files: a service account token (the API
    /// server's, issued for this pod), the cluster CA (`kube-root-ca.crt`,
    /// which every namespace has), the downward API's namespace. The
    /// volume's defaultMode (0644), but a token 0600: kubelet's for a pod
    /// whose containers run as one uid, without fsGroup.
    fn projected(&self, p: &Value) -> Result<Vec<(String, Vec<u8>, u32)>, String> {
        let mode = p["defaultMode"].as_u64().unwrap_or(0o644) as u32;
        let mut files = Vec::new();
        for src in p["sources"].as_array().cloned().unwrap_or_default() {
            if !src["serviceAccountToken"].is_null() {
                let path = src["serviceAccountToken"]["path"]
                    .as_str()
                    .unwrap_or("token");
                files.push((path.to_string(), self.api.token.as_bytes().to_vec(), 0o600));
            } else if !src["configMap"].is_null() {
                let cm = &src["configMap"];
                if cm["name"] != "kube-root-ca.crt" {
                    return Err(format!(
                        "projected configMap {}: only kube-root-ca.crt is handled",
                        cm["name"]
                    ));
                }
                for i in cm["items"].as_array().cloned().unwrap_or_default() {
                    if i["key"] != "ca.crt" {
                        return Err(format!("configmap \"kube-root-ca.crt\": references non-existent config key: {}", i["key"]));
                    }
                    files.push((
                        i["path"].as_str().unwrap_or("ca.crt").to_string(),
                        self.api.ca_pem.clone(),
                        mode,
                    ));
                }
                if cm["items"].is_null() {
                    files.push(("ca.crt".into(), self.api.ca_pem.clone(), mode));
                }
            } else if !src["downwardAPI"].is_null() {
                for i in src["downwardAPI"]["items"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                {
                    let v = match i["fieldRef"]["fieldPath"].as_str() {
                        Some("metadata.namespace") => self.namespace.clone(),
                        Some("metadata.name") => self.name.clone(),
                        other => return Err(format!("downwardAPI {other:?}: not handled")),
                    };
                    files.push((
                        i["path"].as_str().unwrap_or_default().to_string(),
                        v.into_bytes(),
                        mode,
                    ));
                }
            } else {
                return Err(format!(
                    "projected source {src}: not handled by this kubelet stand-in"
                ));
            }
        }
        Ok(files)
    }

    /// An exec probe (`readinessProbe.exec`) as kubelet runs it: ExecSync in
    /// the container with the probe's timeout; its exit code (None: no
    /// answer in time).
    pub async fn exec_probe(
        &self,
        cri: &mut Cri,
        ctr: &str,
        container: &str,
        which: &str,
    ) -> Option<i32> {
        let c = self
            .containers()
            .iter()
            .find(|c| c["name"] == container)
            .unwrap_or_else(|| panic!("no container {container}"));
        let p = &c[which];
        let cmd: Vec<String> = p["exec"]["command"]
            .as_array()
            .unwrap_or_else(|| panic!("{container} has no {which} exec"))
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect();
        let timeout = p["timeoutSeconds"].as_i64().unwrap_or(1);
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(timeout as u64 + 2),
            cri.rt.exec_sync(cri::ExecSyncRequest {
                container_id: ctr.into(),
                cmd,
                timeout,
            }),
        )
        .await
        .ok()?
        .ok()?
        .into_inner();
        Some(r.exit_code)
    }

    /// Each volume of the pod, made ready on the node: volume name -> host path.
    fn volumes(&self) -> Result<HashMap<String, String>, String> {
        let mut out = HashMap::new();
        for v in self.spec["volumes"].as_array().cloned().unwrap_or_default() {
            let name = v["name"].as_str().unwrap().to_string();
            let host = if !v["hostPath"].is_null() {
                self.host_path(&v["hostPath"])?
            } else if !v["configMap"].is_null() {
                let cm_name = v["configMap"]["name"].as_str().unwrap();
                let optional = v["configMap"]["optional"] == json!(true);
                let empty = json!({});
                let cm = match self.configmaps.get(cm_name) {
                    Some(cm) => cm,
                    None if optional => &empty,
                    None => return Err(format!("configmap \"{cm_name}\" not found")),
                };
                let data = cm["data"].as_object().cloned().unwrap_or_default();
                let mode = v["configMap"]["defaultMode"].as_u64().unwrap_or(0o644) as u32;
                let files: Vec<(String, Vec<u8>, u32)> = match v["configMap"]["items"].as_array() {
                    None => data
                        .into_iter()
                        .map(|(k, v)| (k, v.as_str().unwrap_or_default().as_bytes().to_vec(), mode))
                        .collect(),
                    Some(items) => items
                        .iter()
                        .map(|i| {
                            let key = i["key"].as_str().unwrap_or_default();
                            let val = data.get(key).ok_or_else(|| {
                                format!("configmap \"{cm_name}\": references non-existent config key: {key}")
                            })?;
                            Ok((
                                i["path"].as_str().unwrap_or(key).to_string(),
                                val.as_str().unwrap_or_default().as_bytes().to_vec(),
                                i["mode"].as_u64().map_or(mode, |m| m as u32),
                            ))
                        })
                        .collect::<Result<_, String>>()?,
                };
                let dir = self.dir.join("volumes/kubernetes.io~configmap").join(&name);
                Self::atomic_write(&dir, &files);
                dir.display().to_string()
            } else if !v["projected"].is_null() {
                let dir = self.dir.join("volumes/kubernetes.io~projected").join(&name);
                let files = self.projected(&v["projected"])?;
                Self::atomic_write(&dir, &files);
                dir.display().to_string()
            } else if !v["emptyDir"].is_null() {
                let dir = self.dir.join("volumes/kubernetes.io~empty-dir").join(&name);
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
                dir.display().to_string()
            } else {
                return Err(format!(
                    "volume {name}: a kind this kubelet stand-in does not handle: {v}"
                ));
            };
            out.insert(name, host);
        }
        Ok(out)
    }

    /// CreateContainer + StartContainer of container `name`, restart
    /// `attempt` (0 first): the container id. A volume kubelet could not
    /// set up is the error kubelet would report (the pod does not start).
    pub async fn start_container(
        &mut self,
        cri: &mut Cri,
        name: &str,
        image_ref: &str,
        attempt: u32,
    ) -> Result<String, String> {
        let c = self
            .containers()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no container {name}"))
            .clone();
        let volumes = &self.volumes;
        let privileged = c["securityContext"]["privileged"] == json!(true);
        let mut mounts = Vec::new();
        for m in c["volumeMounts"].as_array().cloned().unwrap_or_default() {
            let vname = m["name"].as_str().unwrap();
            let host = volumes
                .get(vname)
                .ok_or_else(|| format!("volumeMount {vname}: no such volume"))?;
            // kubelet mounts these kinds read-only whatever the volumeMount says
            let vol = self.spec["volumes"]
                .as_array()
                .and_then(|vs| vs.iter().find(|v| v["name"] == vname))
                .cloned()
                .unwrap_or_default();
            let must_ro = ["configMap", "secret", "projected", "downwardAPI"]
                .iter()
                .any(|k| !vol[*k].is_null());
            let host = match m["subPath"].as_str() {
                Some(s) => format!("{host}/{s}"),
                None => host.clone(),
            };
            mounts.push(cri::Mount {
                container_path: m["mountPath"].as_str().unwrap().to_string(),
                host_path: host,
                readonly: m["readOnly"] == json!(true) || must_ro,
                propagation: match m["mountPropagation"].as_str() {
                    None | Some("None") => cri::MountPropagation::PropagationPrivate,
                    Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
                    Some("Bidirectional") if privileged => {
                        cri::MountPropagation::PropagationBidirectional
                    }
                    Some(p) => {
                        return Err(format!(
                            "mountPropagation {p} refused (Bidirectional needs privileged)"
                        ))
                    }
                } as i32,
                ..Default::default()
            });
        }
        // kubelet's own: /etc/hosts (a pod with its own network), the
        // termination message file
        let own_hosts = mounts.iter().any(|m| m.container_path == "/etc/hosts");
        if !own_hosts {
            let hosts = self.dir.join("etc-hosts");
            let text = if self.spec["hostNetwork"] == json!(true) {
                std::fs::read_to_string("/etc/hosts").unwrap_or_default()
            } else {
                format!(
                    "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
                     fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n{}\t{}\n",
                    self.ip, self.name
                )
            };
            std::fs::write(&hosts, text).unwrap();
            mounts.push(cri::Mount {
                container_path: "/etc/hosts".into(),
                host_path: hosts.display().to_string(),
                ..Default::default()
            });
        }
        let term = self
            .dir
            .join("containers")
            .join(name)
            .join(format!("{:08x}", attempt + 0x5eed));
        std::fs::create_dir_all(term.parent().unwrap()).unwrap();
        std::fs::write(&term, b"").unwrap();
        std::fs::set_permissions(&term, std::fs::Permissions::from_mode(0o666)).unwrap();
        mounts.push(cri::Mount {
            container_path: c["terminationMessagePath"]
                .as_str()
                .unwrap_or("/dev/termination-log")
                .to_string(),
            host_path: term.display().to_string(),
            ..Default::default()
        });

        if !c["envFrom"].is_null() {
            return Err("envFrom: not handled by this kubelet stand-in".into());
        }
        let mut envs: Vec<cri::KeyValue> = Vec::new();
        for e in c["env"].as_array().cloned().unwrap_or_default() {
            let value = if e["valueFrom"].is_null() {
                // $(VAR) of a variable defined before it
                expand(e["value"].as_str().unwrap_or_default(), &envs)
            } else {
                let path = e["valueFrom"]["fieldRef"]["fieldPath"]
                    .as_str()
                    .unwrap_or_default();
                let label = path
                    .strip_prefix("metadata.labels['")
                    .and_then(|k| k.strip_suffix("']"))
                    .map(|k| {
                        self.labels
                            .get(k)
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string()
                    });
                match path {
                    "spec.nodeName" => self.node.name.clone(),
                    "spec.serviceAccountName" => self.spec["serviceAccountName"]
                        .as_str()
                        .unwrap_or("default")
                        .to_string(),
                    "metadata.name" => self.name.clone(),
                    "metadata.namespace" => self.namespace.clone(),
                    "metadata.uid" => self.uid.clone(),
                    "status.podIP" | "status.podIPs" => self.ip.clone(),
                    "status.hostIP" | "status.hostIPs" => self.node.ip.clone(),
                    _ => match label {
                        Some(v) => v,
                        None => {
                            return Err(format!("env {}: source {path:?} not handled", e["name"]))
                        }
                    },
                }
            };
            envs.push(cri::KeyValue {
                key: e["name"].as_str().unwrap().to_string(),
                value,
            });
        }
        // the master service's variables, added whatever enableServiceLinks
        // says, unless the container sets them
        let (h, p) = (&self.api.host, self.api.port);
        for (k, v) in [
            ("KUBERNETES_SERVICE_HOST", h.clone()),
            ("KUBERNETES_SERVICE_PORT", p.to_string()),
            ("KUBERNETES_SERVICE_PORT_HTTPS", p.to_string()),
            ("KUBERNETES_PORT", format!("tcp://{h}:{p}")),
            (
                &format!("KUBERNETES_PORT_{p}_TCP"),
                format!("tcp://{h}:{p}"),
            ),
            (&format!("KUBERNETES_PORT_{p}_TCP_PROTO"), "tcp".into()),
            (&format!("KUBERNETES_PORT_{p}_TCP_PORT"), p.to_string()),
            (&format!("KUBERNETES_PORT_{p}_TCP_ADDR"), h.clone()),
        ] {
            if !envs.iter().any(|e| e.key == k) {
                envs.push(cri::KeyValue {
                    key: k.to_string(),
                    value: v,
                });
            }
        }

        let sc = &c["securityContext"];
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let int64 = |v: &Value| v.as_i64().map(|value| cri::Int64Value { value });
        let seccomp = Self::seccomp(self.effective(&c, "seccompProfile"))?;
        if !self.effective(&c, "appArmorProfile").is_null() {
            return Err("appArmorProfile: not given by this kubelet stand-in".into());
        }
        let run_as_user = self.effective(&c, "runAsUser").as_i64();
        // kubelet's verifyRunAsNonRoot (the image's own user is 65532)
        if self.effective(&c, "runAsNonRoot") == &json!(true) && run_as_user == Some(0) {
            return Err("container has runAsNonRoot and image will run as root".into());
        }
        // kubelet's DefaultProcMount: masked and read-only paths unless privileged
        let (masked, readonly) = if privileged {
            (Vec::new(), Vec::new())
        } else {
            (
                [
                    "/proc/asound",
                    "/proc/acpi",
                    "/proc/kcore",
                    "/proc/keys",
                    "/proc/latency_stats",
                    "/proc/timer_list",
                    "/proc/timer_stats",
                    "/proc/sched_debug",
                    "/proc/scsi",
                    "/sys/firmware",
                    "/sys/devices/virtual/powercap",
                ]
                .map(String::from)
                .to_vec(),
                [
                    "/proc/bus",
                    "/proc/fs",
                    "/proc/irq",
                    "/proc/sys",
                    "/proc/sysrq-trigger",
                ]
                .map(String::from)
                .to_vec(),
            )
        };
        let sandbox_cfg = self.sandbox_config.clone().expect("the sandbox runs");
        let sandbox = self.sandbox.clone().expect("the sandbox runs");
        let mut labels = HashMap::from([
            ("io.kubernetes.container.name".to_string(), name.to_string()),
            ("io.kubernetes.pod.name".to_string(), self.name.clone()),
            (
                "io.kubernetes.pod.namespace".to_string(),
                self.namespace.clone(),
            ),
            ("io.kubernetes.pod.uid".to_string(), self.uid.clone()),
        ]);
        labels.retain(|_, v| !v.is_empty());
        let mut annotations = HashMap::from([
            (
                "io.kubernetes.container.restartCount".to_string(),
                attempt.to_string(),
            ),
            (
                "io.kubernetes.container.terminationMessagePath".to_string(),
                c["terminationMessagePath"]
                    .as_str()
                    .unwrap_or("/dev/termination-log")
                    .to_string(),
            ),
            (
                "io.kubernetes.container.terminationMessagePolicy".to_string(),
                c["terminationMessagePolicy"]
                    .as_str()
                    .unwrap_or("File")
                    .to_string(),
            ),
            (
                "io.kubernetes.pod.terminationGracePeriod".to_string(),
                self.spec["terminationGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(30)
                    .to_string(),
            ),
        ]);
        if let Some(ports) = c["ports"].as_array() {
            annotations.insert(
                "io.kubernetes.container.ports".into(),
                Value::Array(ports.clone()).to_string(),
            );
        }
        let cfg = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt,
            }),
            image: Some(cri::ImageSpec {
                image: image_ref.into(),
                user_specified_image: c["image"].as_str().unwrap_or_default().into(),
                ..Default::default()
            }),
            command: strings(&c["command"])
                .iter()
                .map(|a| expand(a, &envs))
                .collect(),
            args: strings(&c["args"])
                .iter()
                .map(|a| expand(a, &envs))
                .collect(),
            working_dir: c["workingDir"].as_str().unwrap_or_default().into(),
            envs,
            mounts,
            labels,
            annotations,
            log_path: format!("{name}/{attempt}.log"),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(self.resources(&[&c])),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    capabilities: Some(cri::Capability {
                        add_capabilities: strings(&sc["capabilities"]["add"]),
                        drop_capabilities: strings(&sc["capabilities"]["drop"]),
                        ..Default::default()
                    }),
                    privileged,
                    namespace_options: Some(self.host_namespaces()),
                    run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
                    run_as_group: int64(self.effective(&c, "runAsGroup")),
                    supplemental_groups: self.spec["securityContext"]["supplementalGroups"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_i64).collect())
                        .unwrap_or_default(),
                    readonly_rootfs: sc["readOnlyRootFilesystem"] == json!(true),
                    no_new_privs: sc["allowPrivilegeEscalation"] == json!(false),
                    masked_paths: masked,
                    readonly_paths: readonly,
                    seccomp: Some(seccomp),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let id = cri
            .create(&sandbox, &sandbox_cfg, cfg)
            .await
            .map_err(|e| format!("CreateContainer: {e}"))?;
        cri.start(&id)
            .await
            .map_err(|e| format!("StartContainer: {e}"))?;
        Ok(id)
    }

    /// A container's HTTP probe (`startupProbe`, `readinessProbe`,
    /// `livenessProbe`): the port (a named port resolved through the
    /// container's `ports`) and path kubelet's prober GETs.
    pub fn http_probe(&self, container: &str, which: &str) -> Probe {
        let c = self
            .containers()
            .iter()
            .find(|c| c["name"] == container)
            .unwrap_or_else(|| panic!("no container {container}"));
        let get = &c[which]["httpGet"];
        assert!(!get.is_null(), "{container} has no {which} httpGet");
        let port = match &get["port"] {
            Value::Number(n) => n.as_u64().unwrap(),
            Value::String(name) => c["ports"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["name"] == name.as_str()))
                .and_then(|p| p["containerPort"].as_u64())
                .unwrap_or_else(|| panic!("{which}: no port named {name} in {container}'s ports")),
            other => panic!("{which}: port {other}"),
        };
        let p = &c[which];
        let secs = |k: &str, default: u64| p[k].as_u64().unwrap_or(default);
        Probe {
            port: port as u16,
            path: get["path"].as_str().unwrap_or("/").to_string(),
            timeout: std::time::Duration::from_secs(secs("timeoutSeconds", 1)),
            period: std::time::Duration::from_secs(secs("periodSeconds", 10)),
            failure_threshold: secs("failureThreshold", 3) as u32,
        }
    }

    /// `/var/log/pods/<namespace>_<name>_<uid>`.
    pub fn log_dir(&self) -> PathBuf {
        PathBuf::from("/var/log/pods")
            .join(format!("{}_{}_{}", self.namespace, self.name, self.uid))
    }

    /// The container log kubelet's `kubectl logs` reads.
    pub fn log(&self, name: &str, attempt: u32) -> String {
        let p = self.log_dir().join(format!("{name}/{attempt}.log"));
        std::fs::read_to_string(p).unwrap_or_default()
    }

    /// StopContainer with the pod's grace period, as kubelet kills a
    /// container (a failed liveness probe, a deleted pod).
    pub async fn stop_container(&self, cri: &mut Cri, id: &str) {
        let grace = self.spec["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(30);
        cri.rt
            .stop_container(cri::StopContainerRequest {
                container_id: id.into(),
                timeout: grace,
            })
            .await
            .expect("StopContainer");
    }

    /// The pod deleted: its sandbox stopped and removed, its directory gone.
    pub async fn remove(&mut self, cri: &mut Cri) {
        if let Some(id) = self.sandbox.take() {
            cri.remove_pod(&id).await;
        }
        let _ = std::process::Command::new("systemctl")
            .args(["stop", &self.cgroup_parent()])
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A pod that goes (a failed test included) leaves nothing of kubelet's on
/// the node: its directory (the token), its logs, its slice.
impl Drop for KubeletPod {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(self.log_dir());
        if self.sandbox_config.is_some() {
            let _ = std::process::Command::new("systemctl")
                .args(["stop", &self.cgroup_parent()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// A container's HTTP probe as its manifest sets it (kubelet's defaults for
/// what it leaves out).
#[derive(Debug, Clone)]
pub struct Probe {
    pub port: u16,
    pub path: String,
    pub timeout: std::time::Duration,
    pub period: std::time::Duration,
    pub failure_threshold: u32,
}

impl Probe {
    /// One probe of the pod at `ip`, within the probe's timeout: the status
    /// code (None: no answer in time, which kubelet counts as a failure).
    pub fn run(&self, ip: &str) -> Option<u16> {
        http_get(ip, self.port, &self.path, self.timeout).map(|(c, _)| c)
    }

    /// How long kubelet waits for it to succeed before acting
    /// (`periodSeconds` x `failureThreshold`).
    pub fn deadline(&self) -> std::time::Duration {
        self.period * self.failure_threshold
    }
}

/// An HTTP GET to `ip:port` as kubelet's prober sends it, answered within
/// `timeout`: (status code, body).
pub fn http_get(
    ip: &str,
    port: u16,
    path: &str,
    timeout: std::time::Duration,
) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = format!("{ip}:{port}").parse().ok()?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// kubelet's `$(VAR)` expansion against the variables defined so far
/// (`$$` escapes; an unknown name stays as written).
fn expand(s: &str, env: &[cri::KeyValue]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some((name, tail)) = after.strip_prefix('(').and_then(|a| a.split_once(')')) {
            match env.iter().rev().find(|e| e.key == name) {
                Some(e) => out.push_str(&e.value),
                None => out.push_str(&format!("$({name})")),
            }
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Whether kubelet would find the swap controller: cgroup v2's
/// `memory.swap.max` in its own cgroup (here: the test's).
fn swap_controller() -> bool {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    own.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .is_some_and(|cg| {
            Path::new("/sys/fs/cgroup")
                .join(cg.trim_start_matches('/'))
                .join("memory.swap.max")
                .exists()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_as_kubelet_reads_them() {
        assert_eq!(quantity(&json!("50m"), true), 50);
        assert_eq!(quantity(&json!("2"), true), 2000);
        assert_eq!(quantity(&json!(1), true), 1000);
        assert_eq!(quantity(&json!("64Mi"), false), 64 << 20);
        assert_eq!(quantity(&json!("1G"), false), 1_000_000_000);
    }

    #[test]
    fn dependent_variables_expand_as_kubelet_expands_them() {
        let env = [cri::KeyValue {
            key: "A".into(),
            value: "x".into(),
        }];
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &env), "x-$(B)-$(A)-$");
    }
}
