//! The cluster room's shared part (`k8s/api/`, crate `qoslet-kube-api`):
//! what both of qoslet's cluster clients need, the node agent's cluster side
//! (`qoslet-kube`) and the scheduler extender (`qoslet-scheduler`), which
//! must not depend on the agent.
//!
//! * [`view`]: what qoslet reads of a Pod and a Node.
//! * [`crd`]: Koordinator's NodeSLO and NodeMetric as Rust types, the CRDs
//!   `qoslet crd` prints.
//! * [`amount`]: a pod's requests and limits as Kubernetes sums them.
//! * [`connect`]: a client of the API server from a kubeconfig or the
//!   in-cluster service account.

pub mod amount;
pub mod connect;
pub mod crd;
pub mod view;
