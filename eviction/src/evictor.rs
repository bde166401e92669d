//! What evicts a pod, behind one trait: the CRI evictor (StopPodSandbox to
//! the runtime, in proxy and NRI mode alike) and, in a cluster, the
//! Kubernetes Eviction API. The models decide; an evictor acts.

use std::future::Future;
use std::pin::Pin;

use crate::signal::Signal;

/// Which model chose the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Model {
    /// kubelet's node-pressure model.
    Kubelet,
    /// Koordinator's BE memory eviction.
    BeMemory,
    /// Koordinator's BE CPU-satisfaction eviction.
    BeCpu,
}

impl Model {
    /// The reason as counted on `/metrics` and shown by `qoslet explain`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kubelet => "node-pressure",
            Self::BeMemory => "be-memory",
            Self::BeCpu => "be-cpu-satisfaction",
        }
    }
}

/// One eviction, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictRequest {
    /// The pod sandbox's id (the runtime's).
    pub sandbox_id: String,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// How long its containers may take to stop.
    pub grace_seconds: i64,
    pub model: Model,
    /// The signal, the value observed and the threshold, when one applies.
    pub signal: Option<Signal>,
    pub observed: Option<i64>,
    pub threshold: Option<i64>,
    /// The message recorded (kubelet's, or the BE model's reason).
    pub message: String,
}

/// What an evictor did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evicted {
    /// The pod is stopped.
    Stopped,
    /// The pod is still being stopped (past the evictor's deadline).
    Stopping,
    /// The pod is gone already.
    Gone,
    /// Refused (a PodDisruptionBudget, in a cluster): try the next candidate.
    Refused(String),
}

/// Why an eviction failed.
#[derive(Debug, thiserror::Error)]
#[error("evicting {pod}: {reason}")]
pub struct EvictError {
    pub pod: String,
    pub reason: String,
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What node-level reclaim removed (kubelet's container and image garbage
/// collection, before any pod is evicted for disk).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reclaimed {
    pub containers: usize,
    pub images: Vec<String>,
    /// What could not be removed, and why.
    pub errors: Vec<String>,
}

/// Evicts pods.
pub trait Evictor: Send + Sync + 'static {
    /// A short name for logs and `/metrics` (`cri`, `kubernetes`).
    fn name(&self) -> &'static str;
    fn evict<'a>(&'a self, req: &'a EvictRequest) -> BoxFuture<'a, Result<Evicted, EvictError>>;
    /// Node-level disk reclaim: dead containers, then images no container
    /// uses (`None`: this evictor cannot; the runtime's own does).
    fn reclaim_disk(&self) -> Option<BoxFuture<'_, Reclaimed>> {
        None
    }

    /// The containers' writable layers by container id (the runtime's
    /// `ListContainerStats`): kubelet's rootfs figure for disk ranking
    /// (`None`: this evictor cannot tell).
    fn writable_layers(
        &self,
    ) -> Option<BoxFuture<'_, std::collections::HashMap<String, crate::pod::FsUse>>> {
        None
    }
}
