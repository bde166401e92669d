//! Generates the admin API and the NRI messages (with ttrpc's envelope) from the
//! project's own `.proto` files, and builds the two
//! file descriptor sets that server reflection serves: the admin API and the CRI
//! v1 API. The CRI `.proto` is not copied into this repository: it is read from
//! the `k8s-cri` crate that Cargo already downloaded (override with
//! `QOSLET_CRI_PROTO=/path/to/v1.proto`).
use std::path::{Path, PathBuf};
use std::process::Command;

const K8S_CRI: &str = "k8s-cri-0.11.0";

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=proto/qoslet/admin/v1/admin.proto");
    println!("cargo:rerun-if-env-changed=QOSLET_CRI_PROTO");
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("admin_descriptor.bin"))
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/qoslet/admin/v1/admin.proto"], &["proto"])
        .expect("compile admin.proto");
    // the NRI messages and ttrpc's envelope: messages only (the NRI front end
    // owns its ttrpc transport; no tonic services for them)
    println!("cargo:rerun-if-changed=proto/nri/v1alpha1/api.proto");
    println!("cargo:rerun-if-changed=proto/ttrpc/ttrpc.proto");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_protos(
            &["proto/nri/v1alpha1/api.proto", "proto/ttrpc/ttrpc.proto"],
            &["proto"],
        )
        .expect("compile the NRI and ttrpc .proto");

    let cri = find_cri_proto();
    println!("cargo:rerun-if-changed={}", cri.display());
    let protoc = std::env::var("PROTOC").unwrap_or_else(|_| "protoc".into());
    let status = Command::new(&protoc)
        .arg("--include_imports")
        .arg(format!(
            "--descriptor_set_out={}",
            out.join("cri_descriptor.bin").display()
        ))
        .arg(format!("-I{}", cri.parent().unwrap().display()))
        .arg(cri.file_name().unwrap())
        .status()
        .unwrap_or_else(|e| panic!("cannot run {protoc} (install protobuf-compiler): {e}"));
    assert!(status.success(), "protoc failed on {}", cri.display());
}

fn find_cri_proto() -> PathBuf {
    if let Ok(p) = std::env::var("QOSLET_CRI_PROTO") {
        return PathBuf::from(p);
    }
    let home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").expect("HOME or CARGO_HOME")).join(".cargo")
        });
    let mut roots = vec![];
    if let Ok(rd) = std::fs::read_dir(home.join("registry/src")) {
        roots.extend(rd.flatten().map(|e| e.path()));
    }
    // a `cargo vendor` tree next to the workspace
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    roots.push(ws.join("vendor"));
    for r in roots {
        let p = r.join(K8S_CRI).join("proto/v1.proto");
        if p.is_file() {
            return p;
        }
    }
    panic!("cannot find {K8S_CRI}/proto/v1.proto in the Cargo registry; set QOSLET_CRI_PROTO")
}
