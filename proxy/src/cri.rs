//! The CRI calls qoslet intercepts, as typed values.
//!
//! Only the methods in [`HookPoint`] are ever decoded; every other CRI method
//! (and any method qoslet does not know) is forwarded as bytes. This module
//! maps a gRPC path to a hook point and decodes/encodes the matching request and
//! response types. It must not do I/O.

use prost::Message;
use qoslet_proto::cri;

/// gRPC service names of CRI v1.
pub const RUNTIME_SERVICE: &str = "runtime.v1.RuntimeService";
pub const IMAGE_SERVICE: &str = "runtime.v1.ImageService";

macro_rules! hook_points {
    ($($point:ident => $req:ident, $resp:ident;)*) => {
        /// A CRI call qoslet can intercept.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum HookPoint { $($point,)* }

        impl HookPoint {
            /// Every hook point, in lifecycle order.
            pub const ALL: &'static [HookPoint] = &[$(HookPoint::$point,)*];

            /// The CRI method name (`RunPodSandbox`, ...).
            pub fn method(self) -> &'static str {
                match self { $(HookPoint::$point => stringify!($point),)* }
            }

            /// The hook point for a method name.
            pub fn from_method(m: &str) -> Option<Self> {
                match m { $(stringify!($point) => Some(HookPoint::$point),)* _ => None }
            }

            /// Decodes a request of this method.
            pub fn decode_request(self, buf: &[u8]) -> Result<CriRequest, prost::DecodeError> {
                Ok(match self { $(HookPoint::$point => CriRequest::$point(cri::$req::decode(buf)?),)* })
            }

            /// Decodes a response of this method.
            pub fn decode_response(self, buf: &[u8]) -> Result<CriResponse, prost::DecodeError> {
                Ok(match self { $(HookPoint::$point => CriResponse::$point(cri::$resp::decode(buf)?),)* })
            }
        }

        /// A decoded request of an intercepted call. (Not boxed: one lives per call,
        /// and hooks build patches of it by value.)
        #[derive(Debug, Clone, PartialEq)]
        #[allow(clippy::large_enum_variant)]
        pub enum CriRequest { $($point(cri::$req),)* }

        impl CriRequest {
            pub fn point(&self) -> HookPoint {
                match self { $(CriRequest::$point(_) => HookPoint::$point,)* }
            }
            /// Protobuf encoding.
            pub fn encode(&self) -> Vec<u8> {
                match self { $(CriRequest::$point(m) => m.encode_to_vec(),)* }
            }
            /// Applies protobuf merge rules: `patch` (encoded) is merged into `self`,
            /// exactly as the backend will see `original ++ patch`.
            pub fn merge(&mut self, patch: &[u8]) -> Result<(), prost::DecodeError> {
                match self { $(CriRequest::$point(m) => m.merge(patch),)* }
            }
        }

        /// A decoded response of an intercepted call.
        #[derive(Debug, Clone, PartialEq)]
        #[allow(clippy::large_enum_variant)]
        pub enum CriResponse { $($point(cri::$resp),)* }
    };
}

hook_points! {
    RunPodSandbox => RunPodSandboxRequest, RunPodSandboxResponse;
    CreateContainer => CreateContainerRequest, CreateContainerResponse;
    StartContainer => StartContainerRequest, StartContainerResponse;
    UpdateContainerResources => UpdateContainerResourcesRequest, UpdateContainerResourcesResponse;
    StopContainer => StopContainerRequest, StopContainerResponse;
    RemoveContainer => RemoveContainerRequest, RemoveContainerResponse;
    StopPodSandbox => StopPodSandboxRequest, StopPodSandboxResponse;
    RemovePodSandbox => RemovePodSandboxRequest, RemovePodSandboxResponse;
}

impl CriRequest {
    /// What the call is about, for logs: `namespace/name` of a pod (and the
    /// container's name), or the container or sandbox id. Pod authors' input:
    /// each part is cut to 128 characters.
    pub fn subject(&self) -> String {
        fn cut(s: &str) -> &str {
            s.char_indices().nth(128).map_or(s, |(i, _)| &s[..i])
        }
        let pod = |c: Option<&cri::PodSandboxConfig>| {
            c.and_then(|c| c.metadata.as_ref())
                .map(|m| format!("{}/{}", cut(&m.namespace), cut(&m.name)))
                .unwrap_or_default()
        };
        match self {
            CriRequest::RunPodSandbox(r) => pod(r.config.as_ref()),
            CriRequest::CreateContainer(r) => format!(
                "{} container {}",
                pod(r.sandbox_config.as_ref()),
                cut(r
                    .config
                    .as_ref()
                    .and_then(|c| c.metadata.as_ref())
                    .map_or("", |m| m.name.as_str()))
            ),
            CriRequest::StartContainer(r) => cut(&r.container_id).into(),
            CriRequest::UpdateContainerResources(r) => cut(&r.container_id).into(),
            CriRequest::StopContainer(r) => cut(&r.container_id).into(),
            CriRequest::RemoveContainer(r) => cut(&r.container_id).into(),
            CriRequest::StopPodSandbox(r) => cut(&r.pod_sandbox_id).into(),
            CriRequest::RemovePodSandbox(r) => cut(&r.pod_sandbox_id).into(),
        }
    }
}

impl std::fmt::Display for HookPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.method())
    }
}

/// How a request path is routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A CRI call qoslet intercepts.
    Intercept(HookPoint),
    /// `GetContainerEvents`: server-streaming pass-through.
    Events,
    /// Server reflection, answered by qoslet itself.
    Reflection,
    /// Everything else (known or unknown): forwarded as bytes.
    Passthrough,
}

/// Routes a gRPC path (`/package.Service/Method`).
pub fn route(path: &str) -> Route {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return Route::Passthrough;
    };
    match service {
        RUNTIME_SERVICE => match method {
            "GetContainerEvents" => Route::Events,
            m => HookPoint::from_method(m).map_or(Route::Passthrough, Route::Intercept),
        },
        "grpc.reflection.v1.ServerReflection" | "grpc.reflection.v1alpha.ServerReflection" => {
            Route::Reflection
        }
        _ => Route::Passthrough,
    }
}

/// Why the runtime could not survive this request, if it could not: requests
/// that kill containerd for every pod on the node, told from their fields
/// alone, which kubelet never sends. containerd 1.6's CreateContainer reads
/// the sandbox's metadata for the container's name without checking it is
/// there (a nil pointer: the daemon dies) once the sandbox exists and the
/// container's own metadata is set; with either missing it answers an error
/// of its own, so those are left to it. RunPodSandbox without metadata is
/// refused by containerd itself, and the other intercepted calls carry ids only.
pub fn unsurvivable(req: &CriRequest) -> Option<&'static str> {
    match req {
        CriRequest::CreateContainer(r)
            if r.config.as_ref().is_some_and(|c| c.metadata.is_some())
                && r.sandbox_config.as_ref().and_then(|s| s.metadata.as_ref()).is_none() =>
        {
            Some("CreateContainer without sandbox_config.metadata: the runtime cannot name the container (containerd 1.6 crashes on it); kubelet always sends the pod's metadata")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_the_runtime_cannot_survive_is_told_apart() {
        let meta = || cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "c".into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        let create = |config, sandbox_config| {
            CriRequest::CreateContainer(cri::CreateContainerRequest {
                pod_sandbox_id: "p".into(),
                config,
                sandbox_config,
            })
        };
        // no sandbox config at all, or one without metadata: refused
        assert!(unsurvivable(&create(Some(meta()), None)).is_some());
        assert!(unsurvivable(&create(Some(meta()), Some(Default::default()))).is_some());
        // what kubelet sends
        let kubelet = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "p".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(unsurvivable(&create(Some(meta()), Some(kubelet.clone()))).is_none());
        // the runtime's own error answers these
        assert!(unsurvivable(&create(None, None)).is_none());
        assert!(unsurvivable(&create(Some(Default::default()), None)).is_none());
    }

    #[test]
    fn routes() {
        assert_eq!(
            route("/runtime.v1.RuntimeService/CreateContainer"),
            Route::Intercept(HookPoint::CreateContainer)
        );
        assert_eq!(
            route("/runtime.v1.RuntimeService/Version"),
            Route::Passthrough
        );
        assert_eq!(
            route("/runtime.v1.RuntimeService/UpdatePodSandboxResources"),
            Route::Passthrough
        );
        assert_eq!(
            route("/runtime.v1.RuntimeService/GetContainerEvents"),
            Route::Events
        );
        assert_eq!(
            route("/runtime.v1.ImageService/PullImage"),
            Route::Passthrough
        );
        assert_eq!(
            route("/runtime.v1alpha2.RuntimeService/CreateContainer"),
            Route::Passthrough
        );
        assert_eq!(
            route("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
            Route::Reflection
        );
        assert_eq!(route("garbage"), Route::Passthrough);
        assert_eq!(route("/"), Route::Passthrough);
    }

    #[test]
    fn every_point_round_trips_its_method_name() {
        for p in HookPoint::ALL {
            assert_eq!(HookPoint::from_method(p.method()), Some(*p));
        }
        assert_eq!(HookPoint::ALL.len(), 8);
    }

    #[test]
    fn merge_applies_patch_like_the_backend_will() {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: "p".into(),
            config: Some(cri::ContainerConfig {
                command: vec!["sh".into()],
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(cri::LinuxContainerResources {
                        cpu_shares: 2,
                        cpu_quota: 5000,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let patch = cri::CreateContainerRequest {
            config: Some(cri::ContainerConfig {
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(cri::LinuxContainerResources {
                        cpu_shares: 512,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec();
        let mut decoded = CriRequest::CreateContainer(req.clone());
        decoded.merge(&patch).unwrap();
        let mut wire = req.encode_to_vec();
        wire.extend_from_slice(&patch);
        let from_wire = HookPoint::CreateContainer.decode_request(&wire).unwrap();
        assert_eq!(decoded, from_wire);
        let CriRequest::CreateContainer(c) = from_wire else {
            unreachable!()
        };
        let r = c.config.unwrap().linux.unwrap().resources.unwrap();
        assert_eq!((r.cpu_shares, r.cpu_quota), (512, 5000));
    }
}
