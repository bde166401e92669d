//! The pods the models rank: the inventory joined with the node's readings
//! and the cluster's view ([`candidates`]), and under a disk signal each BE
//! pod's own disk use as kubelet's summary counts it ([`Cycle::fill_disk`]).

use super::*;

/// kubelet gives a node-critical (or Guaranteed) pod's containers this
/// `oom_score_adj`; a non-Guaranteed pod with it is node-critical.
const CRITICAL_OOM_SCORE_ADJ: i64 = -997;

/// A pod as the models see it, with its sandbox id and cgroup.
pub(super) struct Candidate {
    pub(super) pod: Pod,
    pub(super) sandbox_id: String,
    pub(super) cgroup: CgroupPath,
}

/// kubelet's annotation of a container's pod grace period.
const ANNOTATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";

/// A pod's memory request as kubelet's figures show it: a Guaranteed pod's
/// limits; a Burstable container's from the `oom_score_adj` kubelet gave it
/// (1000 − 1000 × request / machine memory: the upper end of the range that
/// value stands for, so a pod is not taken for over its request by rounding);
/// a BestEffort pod has none.
fn memory_request(
    kube: Option<KubeQos>,
    containers: &[ContainerEntry],
    machine: Option<u64>,
) -> i64 {
    match kube {
        Some(KubeQos::Guaranteed) => containers.iter().map(|c| c.memory_limit.max(0)).sum(),
        Some(KubeQos::Burstable) => {
            let Some(m) = machine else {
                return 0;
            };
            containers
                .iter()
                // 999 stands for any request under 0.2 %, none included:
                // kubelet ranks such a pod as over its request
                .filter(|c| c.oom_score_adj != 999)
                .filter_map(|c| {
                    let limit = (c.memory_limit > 0).then_some(c.memory_limit as u64);
                    qoslet_hooks::decide::kubelet_memory_request(c.oom_score_adj, m, limit)
                })
                .map(|r| i64::try_from(r.hi).unwrap_or(i64::MAX))
                .fold(0i64, i64::saturating_add)
        }
        _ => 0,
    }
}

/// Disk use under `dir` (`du`: bytes of disk, and inodes), not following
/// symlinks, at most [`DU_ENTRIES`] entries (a tenant's million files are
/// not walked each cycle).
fn du(dir: &std::path::Path) -> FsUse {
    use std::os::unix::fs::MetadataExt;
    let mut out = FsUse::default();
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > DU_ENTRIES {
                return out;
            }
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            out.inodes += 1;
            out.bytes = out.bytes.saturating_add((m.blocks() * 512) as i64);
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out
}

/// Entries [`du`] walks at most per directory tree.
const DU_ENTRIES: usize = 200_000;

/// Kubernetes QoS as the API server spells it in `status.qosClass`.
fn kube_qos(s: &str) -> Option<KubeQos> {
    match s {
        "Guaranteed" => Some(KubeQos::Guaranteed),
        "Burstable" => Some(KubeQos::Burstable),
        "BestEffort" => Some(KubeQos::BestEffort),
        _ => None,
    }
}

/// The eviction models' view of the inventory's pods, with their memory
/// read now. Pods a trusted label tells qoslet to leave alone are none.
pub(super) fn candidates(inv: &[PodEntry], sources: &Sources, store: &Store) -> Vec<Candidate> {
    let machine = sources.machine_memory();
    inv.iter()
        .filter(|e| !(e.class.is_none() && e.labels.get(LABEL_SKIP).is_some_and(|v| v == "true")))
        .map(|e| {
            let class = e.class.map(|c| c.class);
            let cluster = e.cluster.as_deref();
            let kube = e
                .class
                .and_then(|c| c.kube)
                .or_else(|| {
                    e.cgroup
                        .parent()
                        .and_then(|p| KubeQos::from_cgroup_parent(p.as_str()))
                })
                .or_else(|| cluster.and_then(|c| kube_qos(c.qos_class.as_deref()?)));
            let mem = sources.cgroup_memory(&e.cgroup).ok();
            let annotations = e.annotations.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            let node_critical = kube != Some(KubeQos::Guaranteed)
                && e.containers
                    .iter()
                    .any(|c| c.oom_score_adj == CRITICAL_OOM_SCORE_ADJ);
            // without a cluster the priority is unknown: kube-system's pods
            // (where system-critical priority classes live) are taken as critical
            let system = e.priority.is_none() && e.namespace == "kube-system";
            let trusted = e.class.is_some_and(|c| c.trusted);
            // kubelet's own annotation on its containers (the pod's spec)
            let grace_seconds = e
                .containers
                .iter()
                .filter_map(|c| store.container(&c.id))
                .filter_map(|c| c.annotations.get(ANNOTATION_GRACE)?.parse::<i64>().ok())
                .chain(cluster.and_then(|c| c.grace_seconds))
                .map(|g| g.clamp(0, 86_400))
                .max();
            let pod = Pod {
                uid: e.uid.clone(),
                namespace: e.namespace.clone(),
                name: e.name.clone(),
                priority: e.priority,
                critical: node_critical
                    || system
                    || Admission::critical_by_annotations(annotations),
                kube_qos: kube,
                class,
                be_labelled: e
                    .class
                    .is_some_and(|c| c.by_label && c.class == QosClass::Be),
                eviction_policy: if trusted {
                    EvictionPolicy::parse(
                        e.annotations
                            .get(koord::ANNOTATION_EVICTION_POLICY)
                            .map(String::as_str),
                    )
                } else {
                    EvictionPolicy::Any
                },
                tolerates_memory_pressure: cluster.is_some_and(|c| c.tolerates_memory_pressure),
                grace_seconds,
                requests: Requests {
                    // the pod's spec when the cluster has it; else what
                    // kubelet's CRI settings tell
                    memory: cluster
                        .map(|c| c.requests.memory)
                        .unwrap_or_else(|| memory_request(kube, &e.containers, machine)),
                    ..Default::default()
                },
                stats: mem.map(|m| PodStats {
                    working_set: Some(m.working_set),
                    memory_used: Some(m.anon),
                    processes: sources.cgroup_processes(&e.cgroup),
                    ..Default::default()
                }),
            };
            Candidate {
                pod,
                sandbox_id: e.id.clone(),
                cgroup: e.cgroup.clone(),
            }
        })
        .collect()
}

impl Cycle {
    /// Each BE candidate's disk use: its containers' writable layers (the
    /// runtime's), its logs (`<podLogsPath>/<ns>_<name>_<uid>`) and its
    /// emptyDir volumes (`<nodefsPath>/pods/<uid>/volumes/kubernetes.io~empty-dir`),
    /// in bytes of disk and inodes, as kubelet's summary counts them.
    pub(super) async fn fill_disk(&mut self, candidates: &mut [Candidate], store: &Store) {
        let layers = match self.cfg.evictor.writable_layers() {
            Some(f) => tokio::time::timeout(READ_TIMEOUT, f)
                .await
                .unwrap_or_default(),
            None => HashMap::new(),
        };
        let logs_root = self.cfg.sources.pod_logs.clone();
        let kubelet_root = self.cfg.sources.nodefs.clone();
        let be: Vec<(usize, String, String, String)> = candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| is_be(&c.pod))
            .map(|(i, c)| {
                (
                    i,
                    c.pod.namespace.clone(),
                    c.pod.name.clone(),
                    c.pod.uid.clone(),
                )
            })
            .collect();
        let task = tokio::task::spawn_blocking(move || {
            be.into_iter()
                .map(|(i, ns, name, uid)| {
                    let safe = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != "..";
                    if !(safe(&ns) && safe(&name) && safe(&uid)) {
                        return (i, FsUse::default(), FsUse::default());
                    }
                    let logs = logs_root
                        .as_ref()
                        .map(|r| du(&r.join(format!("{ns}_{name}_{uid}"))))
                        .unwrap_or_default();
                    let volumes = kubelet_root
                        .as_ref()
                        .map(|r| {
                            du(&r
                                .join("pods")
                                .join(&uid)
                                .join("volumes")
                                .join("kubernetes.io~empty-dir"))
                        })
                        .unwrap_or_default();
                    (i, logs, volumes)
                })
                .collect::<Vec<_>>()
        });
        let walked = match tokio::time::timeout(READ_TIMEOUT, task).await {
            Ok(Ok(w)) => w,
            _ => {
                self.warn_once(
                    "pods' disk".into(),
                    "reading the pods' disk use took over 5 s: disk ranking by priority only",
                );
                return;
            }
        };
        for (i, logs, volumes) in walked {
            let c = &mut candidates[i];
            let mut rootfs = FsUse::default();
            let containers = store.read_all(|_, cs| {
                cs.values()
                    .filter(|x| x.pod_id == c.sandbox_id && x.state == ContainerState::Running)
                    .map(|x| (x.id.clone(), x.name.clone()))
                    .collect::<Vec<_>>()
            });
            let st = c.pod.stats.get_or_insert_with(PodStats::default);
            for (id, name) in containers {
                let Some(l) = layers.get(&id) else { continue };
                rootfs.bytes = rootfs.bytes.saturating_add(l.bytes);
                rootfs.inodes = rootfs.inodes.saturating_add(l.inodes);
                // kubelet's per-container figure in the eviction message
                match st.containers.iter_mut().find(|x| x.name == name) {
                    Some(x) => x.disk_used = Some(l.bytes),
                    None => st.containers.push(qoslet_eviction::ContainerStats {
                        name,
                        disk_used: Some(l.bytes),
                        ..Default::default()
                    }),
                }
            }
            st.rootfs = rootfs;
            st.logs = logs;
            st.local_volumes = volumes;
        }
    }
}
