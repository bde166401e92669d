//! Admission under node pressure, as kubelet's eviction admit handler: while
//! the eviction loop reports a pressure condition, RunPodSandbox of a BE pod
//! (Koordinator class BE, or Kubernetes BestEffort without a class) is
//! refused with a message naming the condition, the signal, the value
//! observed and the threshold, as is a BE pod qoslet evicted lately (kubelet
//! recreates its sandbox). LS, LSR, LSE and SYSTEM pods, static and mirror
//! pods, and pods a trusted label tells qoslet to skip are never refused.
//! kubelet retries a refused sandbox with its backoff, so the pod starts once
//! the pressure is over.

use std::sync::Arc;

use qoslet_agent::eviction::{Admission, EvictionView};
use qoslet_hooks::class::{classify, ClassSource, Trust};

use crate::cri::{CriRequest, HookPoint};
use crate::pipeline::{BoxError, BoxFuture, Hook, HookContext, Refusal, Stage, Verdict};

/// The admission hook.
pub struct AdmissionHook {
    view: Arc<EvictionView>,
    trust: Trust,
}

impl AdmissionHook {
    pub fn new(view: Arc<EvictionView>, trust: Trust) -> Self {
        Self { view, trust }
    }
}

impl Hook for AdmissionHook {
    fn name(&self) -> &str {
        "admission"
    }

    fn handles(&self, point: HookPoint, stage: Stage) -> bool {
        point == HookPoint::RunPodSandbox && stage == Stage::Before
    }

    fn before(
        &self,
        _ctx: HookContext,
        req: Arc<CriRequest>,
    ) -> BoxFuture<Result<Verdict, BoxError>> {
        let view = self.view.clone();
        let trust = self.trust.clone();
        Box::pin(async move {
            let CriRequest::RunPodSandbox(r) = &*req else {
                return Ok(Verdict::Pass);
            };
            let Some(cfg) = r.config.as_ref() else {
                return Ok(Verdict::Pass);
            };
            let (name, namespace) = cfg
                .metadata
                .as_ref()
                .map(|m| (m.name.as_str(), m.namespace.as_str()))
                .unwrap_or_default();
            let parent = cfg
                .linux
                .as_ref()
                .map(|l| l.cgroup_parent.as_str())
                .unwrap_or_default();
            let labels = cfg
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let d = classify(&labels, namespace, parent, &trust);
            if d.source == ClassSource::Skipped {
                // a trusted skip label: not qoslet's pod
                return Ok(Verdict::Pass);
            }
            let uid = cfg
                .metadata
                .as_ref()
                .map(|m| m.uid.as_str())
                .unwrap_or_default();
            let critical = Admission::critical_by_annotations(
                cfg.annotations
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            );
            Ok(
                match view.admit(&Admission {
                    class: d.class,
                    kube: d.kube,
                    namespace,
                    name,
                    uid,
                    critical,
                }) {
                    Ok(()) => Verdict::Pass,
                    Err(msg) => Verdict::Refuse(Refusal::new(tonic::Code::ResourceExhausted, msg)),
                },
            )
        })
    }
}
