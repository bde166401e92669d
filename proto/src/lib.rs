//! Protocol types owned or served by qoslet.
//!
//! * [`admin`]: qoslet's own admin API (`qoslet.admin.v1`), generated from
//!   `proto/qoslet/admin/v1/admin.proto`.
//! * [`nri`], [`ttrpc`]: the part of containerd's NRI API (`nri.pkg.api.v1alpha1`)
//!   the NRI front end uses, and ttrpc's request/response envelope, generated
//!   from the project's own declarations (`proto/nri`, `proto/ttrpc`; upstream
//!   field numbers).
//! * [`cri`]: the CRI v1 types and stubs, re-exported from the `k8s-cri` crate
//!   (qoslet does not own the CRI `.proto`).
//! * [`ADMIN_DESCRIPTOR_SET`], [`CRI_DESCRIPTOR_SET`]: encoded
//!   `FileDescriptorSet`s for gRPC server reflection.
//!
//! This crate holds no logic.

/// qoslet's admin API, `qoslet.admin.v1`.
pub mod admin {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("qoslet.admin.v1");
}

/// NRI messages (`nri.pkg.api.v1alpha1`), the subset qoslet reads and writes.
pub mod nri {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("nri.pkg.api.v1alpha1");
}

/// ttrpc's envelope (`ttrpc.Request`, `ttrpc.Response`).
pub mod ttrpc {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("ttrpc");
}

/// CRI v1 (`runtime.v1`) messages, clients and servers.
pub use k8s_cri::v1 as cri;

/// Encoded `FileDescriptorSet` of the admin API, for server reflection.
pub const ADMIN_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/admin_descriptor.bin"));

/// Encoded `FileDescriptorSet` of CRI v1 (`runtime.v1`), for server reflection on the proxy socket.
pub const CRI_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/cri_descriptor.bin"));
