//! What qoslet reads of a Pod and a Node: the fields it uses and nothing else.
//!
//! k8s-openapi's `Pod` and `Node` decode every field of the schema (volumes,
//! probes, env, images, conditions, ...): their decoders doubled the agent's
//! code, so its resident pages, for fields qoslet never reads, and every watch
//! event allocated the whole object. These views are decoded from the same
//! JSON, unknown fields skipped as k8s-openapi skips them; the fields kept have
//! k8s-openapi's types (an explicit `null` is absent), and the metadata is
//! k8s-openapi's `ObjectMeta`, which kube's watcher needs (resource versions).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// A resource list (`requests`, `limits`, `overhead`, `capacity`, ...):
/// quantities as the API server writes them (strings).
pub type ResourceList = BTreeMap<String, String>;

/// The `v1` kinds of the core group, as kube's `Resource` names them.
macro_rules! core_v1 {
    ($ty:ty, $kind:literal, $plural:literal, $scope:ty) => {
        resource!($ty, "", "v1", "v1", $kind, $plural, $scope);
    };
}

/// A kind as kube's `Resource` names it.
macro_rules! resource {
    ($ty:ty, $group:literal, $version:literal, $api_version:literal, $kind:literal, $plural:literal, $scope:ty) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;
            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($group)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($version)
            }
            fn api_version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($api_version)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// A Pod as qoslet reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodView {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<PodSpecView>,
    pub status: Option<PodStatusView>,
}
core_v1!(PodView, "Pod", "pods", k8s_openapi::NamespaceResourceScope);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpecView {
    pub containers: Option<Vec<ContainerView>>,
    pub init_containers: Option<Vec<ContainerView>>,
    pub overhead: Option<ResourceList>,
    /// Pod-level requests and limits (`PodLevelResources`, Kubernetes 1.32+):
    /// when set for a resource, they are the pod's.
    pub resources: Option<ResourcesView>,
    pub priority: Option<i32>,
    /// The node the pod is bound to (the scheduler extender's cache).
    pub node_name: Option<String>,
    pub priority_class_name: Option<String>,
    pub termination_grace_period_seconds: Option<i64>,
    pub tolerations: Option<Vec<TolerationView>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    pub name: Option<String>,
    pub resources: Option<ResourcesView>,
    /// `Always` on an init container: a sidecar.
    pub restart_policy: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ResourcesView {
    pub requests: Option<ResourceList>,
    pub limits: Option<ResourceList>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct TolerationView {
    pub key: Option<String>,
    pub operator: Option<String>,
    pub effect: Option<String>,
    pub value: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatusView {
    pub qos_class: Option<String>,
    /// `Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    pub phase: Option<String>,
    /// `PodScheduled`, `Initialized`, ...: when each turned (the scheduler
    /// extender's assign time and estimation deadline).
    pub conditions: Option<Vec<PodConditionView>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodConditionView {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub status: Option<String>,
    pub last_transition_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// A Node as qoslet reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeView {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub status: Option<NodeStatusView>,
}
core_v1!(NodeView, "Node", "nodes", k8s_openapi::ClusterResourceScope);

#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeStatusView {
    pub capacity: Option<ResourceList>,
    pub allocatable: Option<ResourceList>,
}

/// A NodeMetric as a reader takes it: Koordinator's fields are all
/// `omitempty`, so `spec` and `status` may be absent (the derived
/// [`crate::crd::NodeMetric`] requires `spec`: a list holding one object
/// without it would fail whole).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeMetricView {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: crate::crd::NodeMetricSpec,
    pub status: Option<crate::crd::NodeMetricStatus>,
}
resource!(
    NodeMetricView,
    "slo.koordinator.sh",
    "v1alpha1",
    "slo.koordinator.sh/v1alpha1",
    "NodeMetric",
    "nodemetrics",
    k8s_openapi::ClusterResourceScope
);
