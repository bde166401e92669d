//! The isolation room as a CRI hook: a thin adapter that turns CRI messages
//! into store records and [`Resources`] ([`crate::records`]), calls the room's
//! transport-neutral events, and puts the patch back into CRI's shapes. The
//! decisions are the room's; nothing here decides.
//!
//! | CRI call | stage | event |
//! |---|---|---|
//! | RunPodSandbox | after | `pod_started` |
//! | CreateContainer | before | `create_container`: resources + annotations overlaid on the request |
//! | CreateContainer | after | `container_created` |
//! | UpdateContainerResources | before | `update_container`: resources overlaid |
//! | StartContainer | after | `container_started` |

use std::sync::Arc;

use qoslet_isolation::{Isolation, ResourcePatch, Resources};
use qoslet_proto::cri;

use crate::cri::{CriRequest, CriResponse, HookPoint};
use crate::pipeline::{BoxError, BoxFuture, HookContext, Stage, Verdict};
use crate::Hook;

/// [`Isolation`] at the proxy's interception points. Its futures run the
/// events inline: the pipeline runs hooks on the blocking pool.
pub struct IsolationHook(Arc<Isolation>);

impl IsolationHook {
    pub fn new(iso: Isolation) -> Self {
        Self(Arc::new(iso))
    }
}

/// The container's name and the resources kubelet asked for.
fn name_and_resources(cfg: &cri::ContainerConfig) -> (String, Option<Resources>) {
    let name = cfg
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let r = cfg
        .linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .map(crate::records::resources);
    (name, r)
}

/// The patch as CRI resources (the pipeline overlays them on kubelet's).
fn resources(p: &ResourcePatch) -> cri::LinuxContainerResources {
    let mut r = cri::LinuxContainerResources::default();
    if let Some(v) = &p.cpuset_cpus {
        r.cpuset_cpus = v.clone();
    }
    if let Some(v) = p.cpu_shares {
        r.cpu_shares = v;
    }
    if let Some(v) = p.cpu_quota {
        r.cpu_quota = v;
    }
    if let Some(v) = p.cpu_period {
        r.cpu_period = v;
    }
    if let Some(v) = p.memory_limit_in_bytes {
        r.memory_limit_in_bytes = v;
    }
    for (k, v) in &p.unified {
        r.unified.insert(k.clone(), v.clone());
    }
    r
}

fn boxed(e: qoslet_isolation::IsolationError) -> BoxError {
    Box::new(e)
}

impl Hook for IsolationHook {
    fn name(&self) -> &str {
        "isolation"
    }

    fn handles(&self, point: HookPoint, stage: Stage) -> bool {
        matches!(
            (point, stage),
            (HookPoint::CreateContainer, _)
                | (HookPoint::UpdateContainerResources, Stage::Before)
                | (HookPoint::RunPodSandbox, Stage::After)
                | (HookPoint::StartContainer, Stage::After)
                | (HookPoint::RemovePodSandbox, Stage::After)
        )
    }

    fn before(
        &self,
        ctx: HookContext,
        req: Arc<CriRequest>,
    ) -> BoxFuture<Result<Verdict, BoxError>> {
        let iso = self.0.clone();
        Box::pin(async move {
            match &*req {
                CriRequest::CreateContainer(r) => {
                    // the store's pod, or one from the request's sandbox config
                    let pod = ctx.store.pod(&r.pod_sandbox_id).or_else(|| {
                        r.sandbox_config
                            .as_ref()
                            .map(|c| crate::records::pod("", c, ""))
                    });
                    let (Some(pod), Some(cfg)) = (pod, r.config.as_ref()) else {
                        return Ok(Verdict::Pass);
                    };
                    let (name, requested) = name_and_resources(cfg);
                    let Some(c) = iso.create_container(&ctx.store, &pod, &name, requested.as_ref())
                    else {
                        return Ok(Verdict::Pass);
                    };
                    let linux = (!c.patch.is_empty()).then(|| cri::LinuxContainerConfig {
                        resources: Some(resources(&c.patch)),
                        ..Default::default()
                    });
                    Ok(Verdict::Patch(CriRequest::CreateContainer(
                        cri::CreateContainerRequest {
                            config: Some(cri::ContainerConfig {
                                annotations: c.annotations.into_iter().collect(),
                                linux,
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    )))
                }
                CriRequest::UpdateContainerResources(r) => {
                    let update = r.linux.as_ref().map(crate::records::resources);
                    let patch = iso.update_container(&ctx.store, &r.container_id, update.as_ref());
                    // kubelet's update must not undo the class's settings: they win where qoslet owns them
                    Ok(patch
                        .map(|p| {
                            CriRequest::UpdateContainerResources(
                                cri::UpdateContainerResourcesRequest {
                                    linux: Some(resources(&p)),
                                    ..Default::default()
                                },
                            )
                        })
                        .into())
                }
                _ => Ok(Verdict::Pass),
            }
        })
    }

    fn after(
        &self,
        ctx: HookContext,
        req: Arc<CriRequest>,
        resp: Arc<CriResponse>,
    ) -> BoxFuture<Result<(), BoxError>> {
        let iso = self.0.clone();
        Box::pin(async move {
            match (&*req, &*resp) {
                (CriRequest::RunPodSandbox(_), CriResponse::RunPodSandbox(o)) => iso
                    .pod_started(&ctx.store, &o.pod_sandbox_id)
                    .map_err(boxed),
                (CriRequest::CreateContainer(r), CriResponse::CreateContainer(o)) => {
                    // the request as it reached the runtime (patched, if the "before" hook's patch made it)
                    let empty = cri::ContainerConfig::default();
                    let cfg = r.config.as_ref().unwrap_or(&empty);
                    let (name, requested) = name_and_resources(cfg);
                    iso.container_created(
                        &ctx.store,
                        &r.pod_sandbox_id,
                        &o.container_id,
                        &name,
                        &cfg.annotations,
                        requested.as_ref(),
                    );
                    Ok(())
                }
                (CriRequest::StartContainer(r), _) => iso
                    .container_started(&ctx.store, &r.container_id)
                    .map_err(boxed),
                (CriRequest::RemovePodSandbox(r), _) => {
                    iso.pod_removed(&r.pod_sandbox_id);
                    Ok(())
                }
                _ => Ok(()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_cgroups::memfs::MemFs;
    use qoslet_isolation::{ANNOTATION_APPLIED, ANNOTATION_CLASS, ANNOTATION_REQUESTED};
    use qoslet_state::store::{ContainerRecord, PodRecord, Store};

    /// CRI in, CRI out: a BE pod with batch resources on cgroup v2. The
    /// create's patch reaches CRI's resources (quota, memory limit, the
    /// `unified` memory QoS) with the annotations; the created container is
    /// recorded only when the patched request is what reached the runtime;
    /// kubelet's partial update gets the class's settings back; the pod's
    /// start writes its cgroup.
    #[tokio::test]
    async fn the_cri_adapter_carries_the_rooms_decisions() {
        let pod_dir = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice";
        let m = MemFs::new();
        for (f, c) in [
            ("cpu.idle", "0\n"),
            ("cpu.weight", "1\n"),
            ("cpu.max", "max 100000\n"),
            ("memory.max", "max\n"),
            ("memory.min", "0\n"),
            ("memory.low", "0\n"),
            ("memory.high", "max\n"),
        ] {
            m.set(&format!("{pod_dir}/{f}"), c);
        }
        let cgroups = m.v2(qoslet_cgroups::Features {
            cpu_idle: true,
            memory_qos: true,
            ..Default::default()
        });
        let policy: qoslet_hooks::policy::ResourceQosStrategy = serde_json::from_str(
            r#"{"beClass":{"cpuQOS":{"enable":true},"memoryQOS":{"enable":true,"minLimitPercent":50,"lowLimitPercent":100}}}"#,
        )
        .unwrap();
        let hook = IsolationHook::new(Isolation::new(
            Some(cgroups),
            None,
            policy,
            Default::default(),
            qoslet_hooks::Trust {
                control_plane: true,
                ..Default::default()
            },
            Default::default(),
        ));
        let store = Store::new();
        let mut pod = PodRecord {
            id: "p1".into(),
            name: "batch".into(),
            cgroup_parent: format!("/{pod_dir}"),
            ..Default::default()
        };
        pod.annotations.insert(
            qoslet_hooks::batch::ANNOTATION_EXTENDED_RESOURCE_SPEC.into(),
            r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"2000","kubernetes.io/batch-memory":"128Mi"}}}}"#.into(),
        );
        store.upsert_pod(pod);
        let ctx = || HookContext {
            store: store.clone(),
        };
        hook.after(
            ctx(),
            Arc::new(CriRequest::RunPodSandbox(Default::default())),
            Arc::new(CriResponse::RunPodSandbox(cri::RunPodSandboxResponse {
                pod_sandbox_id: "p1".into(),
            })),
        )
        .await
        .unwrap();
        assert_eq!(m.at(&format!("{pod_dir}/cpu.idle")).unwrap(), "1");
        assert_eq!(store.pod("p1").unwrap().applied["class"], "BE");

        let create = cri::CreateContainerRequest {
            pod_sandbox_id: "p1".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(cri::LinuxContainerResources {
                        cpu_shares: 2,
                        oom_score_adj: 1000,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let out = hook
            .before(ctx(), Arc::new(CriRequest::CreateContainer(create.clone())))
            .await
            .unwrap();
        let Verdict::Patch(CriRequest::CreateContainer(patch)) = out else {
            panic!("no patch: {out:?}")
        };
        let cfg = patch.config.unwrap();
        let r = cfg.linux.unwrap().resources.unwrap();
        assert_eq!(r.cpu_quota, 200_000);
        assert_eq!(r.memory_limit_in_bytes, 128 << 20);
        assert_eq!(r.unified["memory.min"], (32u64 << 20).to_string());
        assert_eq!(cfg.annotations[ANNOTATION_CLASS], "BE");
        assert!(cfg.annotations[ANNOTATION_APPLIED].contains("memory.min"));
        assert!(
            cfg.annotations[ANNOTATION_REQUESTED].contains("\"oom_score_adj\":1000"),
            "kubelet's own request: {}",
            cfg.annotations[ANNOTATION_REQUESTED]
        );

        // the runtime got the patched request (the pipeline overlays the patch)
        let mut reached = create.clone();
        let rc = reached.config.as_mut().unwrap();
        rc.annotations = cfg.annotations.clone();
        rc.linux.as_mut().unwrap().resources = Some(r);
        for (id, req) in [("c1", reached), ("c2", create)] {
            store.upsert_container(ContainerRecord {
                id: id.into(),
                pod_id: "p1".into(),
                name: "app".into(),
                ..Default::default()
            });
            hook.after(
                ctx(),
                Arc::new(CriRequest::CreateContainer(req)),
                Arc::new(CriResponse::CreateContainer(cri::CreateContainerResponse {
                    container_id: id.into(),
                })),
            )
            .await
            .unwrap();
        }
        let c1 = store.container("c1").unwrap().applied;
        assert_eq!(c1["class"], "BE", "{c1:?}");
        assert!(c1["memory.min"].contains("33554432"), "{c1:?}");
        let c2 = store.container("c2").unwrap().applied;
        assert!(c2["error"].contains("did not reach the runtime"), "{c2:?}");

        // kubelet's update (cpuset only): the class's quota and memory QoS again
        let update = cri::UpdateContainerResourcesRequest {
            container_id: "c1".into(),
            linux: Some(cri::LinuxContainerResources {
                cpuset_cpus: "0-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let out = hook
            .before(
                ctx(),
                Arc::new(CriRequest::UpdateContainerResources(update)),
            )
            .await
            .unwrap();
        let Verdict::Patch(CriRequest::UpdateContainerResources(u)) = out else {
            panic!("no patch: {out:?}")
        };
        let r = u.linux.unwrap();
        assert_eq!((r.cpu_quota, r.memory_limit_in_bytes), (200_000, 128 << 20));
        assert_eq!(r.unified["memory.low"], (64u64 << 20).to_string());
    }
}
