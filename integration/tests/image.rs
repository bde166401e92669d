//! qoslet's container image (`integration/image/build.sh`): the same inputs
//! give the same archive byte for byte; it holds the binary, what the binary
//! links against, the CA certificates and the packages' copyrights, and no
//! shell; its config names the entrypoint, the non-root default user and the
//! OCI labels; and containerd pulls it (from a loopback registry, through CRI,
//! as kubelet does) and runs the binary in it, as that default user.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::process::qoslet_bin;
use qoslet_integration::registry::Registry;
use qoslet_integration::testbed::{pod_config, work_dir, Cleanup, Cri, Testbed};
use qoslet_integration::{eventually, scratch, unique};
use serde_json::Value;

const NAME: &str = concat!("ghcr.io/qoslet/qoslet:", env!("CARGO_PKG_VERSION"));

/// `build.sh OUT` from the test binary's qoslet, under `umask` and with the
/// environment's `env` (what must not change the image); the `name@digest`
/// it prints.
fn build(out: &Path, umask: &str, env: &[(&str, &str)]) -> String {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("image/build.sh"))
        .arg(out)
        .arg(qoslet_bin())
        .envs(env.iter().copied())
        .output()
        .expect("run integration/image/build.sh");
    assert!(
        o.status.success(),
        "build.sh failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn json(root: &Path, digest: &str) -> Value {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    serde_json::from_slice(&std::fs::read(root.join("blobs/sha256").join(hex)).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_is_reproducible_holds_only_qoslet_and_runs_in_containerd() {
    let tb = Testbed::main();
    let dir = scratch("image");
    let (a, b) = (dir.join("a.tar"), dir.join("b.tar"));
    let other = dir.join("tmp");
    std::fs::create_dir_all(&other).unwrap();
    let (ra, rb) = (
        build(&a, "022", &[]),
        build(
            &b,
            "077",
            &[
                ("LC_ALL", "C.UTF-8"),
                ("TZ", "Asia/Tokyo"),
                ("TMPDIR", other.to_str().unwrap()),
            ],
        ),
    );
    assert_eq!(ra, rb, "the same inputs, the same digest");
    assert!(ra.starts_with(&format!("{NAME}@sha256:")), "{ra}");
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "the same archive, byte for byte"
    );

    // the layout: one manifest, named; its config
    let root = dir.join("oci");
    std::fs::create_dir_all(&root).unwrap();
    assert!(Command::new("tar")
        .arg("-xf")
        .arg(&a)
        .arg("-C")
        .arg(&root)
        .status()
        .unwrap()
        .success());
    let index: Value =
        serde_json::from_slice(&std::fs::read(root.join("index.json")).unwrap()).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1);
    assert_eq!(
        manifests[0]["annotations"]["io.containerd.image.name"],
        NAME
    );
    let manifest = json(&root, manifests[0]["digest"].as_str().unwrap());
    let config = json(&root, manifest["config"]["digest"].as_str().unwrap());
    let c = &config["config"];
    assert_eq!(c["Entrypoint"], serde_json::json!(["/usr/bin/qoslet"]));
    assert_eq!(c["User"], "65532:65532", "a non-root default user");
    let labels = &c["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert!(labels["org.opencontainers.image.source"]
        .as_str()
        .is_some_and(|s| s.starts_with("https://")));
    assert_eq!(
        manifest["annotations"], *labels,
        "the manifest carries the labels too"
    );

    // what the layer holds, and nothing else
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    let layer = root.join("blobs/sha256").join(
        layers[0]["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:"),
    );
    let o = Command::new("tar")
        .arg("-tvzf")
        .arg(&layer)
        .output()
        .unwrap();
    assert!(o.status.success());
    let listing = String::from_utf8_lossy(&o.stdout);
    let files: BTreeSet<String> = listing
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches("./").to_string())
        .collect();
    let want: BTreeSet<String> = [
        "usr/bin/qoslet",
        "lib/x86_64-linux-gnu/libc.so.6",
        "lib/x86_64-linux-gnu/libm.so.6",
        "lib/x86_64-linux-gnu/libgcc_s.so.1",
        "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "lib64/ld-linux-x86-64.so.2",
        "etc/passwd",
        "etc/group",
        "etc/nsswitch.conf",
        "etc/ssl/certs/ca-certificates.crt",
        "usr/share/doc/libc6/copyright",
        "usr/share/doc/gcc-12-base/copyright",
        "usr/share/doc/ca-certificates/copyright",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(files, want, "the image's files");
    // root's, none set-id, none writable but by root
    for l in listing.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f[1], "0/0", "{l}");
        let mode = f[0].as_bytes();
        let link = mode[0] == b'l';
        assert!(link || !f[0].contains(['s', 'S']), "a set-id file: {l}");
        assert!(
            link || (mode[5] != b'w' && mode[8] != b'w'),
            "writable by others than root: {l}"
        );
    }

    // pulled through CRI from a loopback registry, as kubelet pulls, and run
    let reg = Registry::start(&a, &dir).await;
    let reference = reg.reference(NAME);
    let mut direct = Cri::connect(&tb.sock).await;
    let pulled = direct
        .img
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: reference.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("PullImage of qoslet's image")
        .into_inner();
    assert_eq!(
        pulled.image_ref,
        manifest["config"]["digest"].as_str().unwrap(),
        "containerd's image id is the config's digest"
    );
    let name = unique("image");
    let cgp = tb.cgroup_parent(&name);
    let cfg = pod_config(&name, &cgp);
    let mut cleanup = Cleanup::new(&tb.sock);
    let pod = direct.run_pod(&cfg).await.unwrap();
    cleanup.pods.push(pod.clone());
    cleanup.cgroups.push(cgp.clone());
    // no command: the image's entrypoint, with an argument, as a pod spec's args give it
    let ctr = direct
        .create(
            &pod,
            &cfg,
            cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "qoslet".into(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: reference.clone(),
                    ..Default::default()
                }),
                args: vec!["--version".into()],
                log_path: "qoslet/0.log".into(),
                ..Default::default()
            },
        )
        .await
        .expect("CreateContainer from qoslet's image");
    direct.start(&ctr).await.unwrap();
    let st = eventually("qoslet --version exits", Duration::from_secs(30), || {
        let mut c = direct.clone();
        let id = ctr.clone();
        async move {
            let s = c.status(&id).await.ok()?;
            (s.state == cri::ContainerState::ContainerExited as i32).then_some(s)
        }
    })
    .await;
    let log = std::fs::read_to_string(work_dir().join("pods").join(&name).join("qoslet/0.log"))
        .unwrap_or_default();
    assert_eq!(st.exit_code, 0, "{st:?}\n{log}");
    assert!(
        log.contains(&format!("qoslet {}", env!("CARGO_PKG_VERSION"))),
        "{log}"
    );
    // as the image's default user: the process's uid, read by containerd's ExecSync is
    // not possible (no shell); the runtime spec containerd wrote says it
    let info = direct
        .rt
        .container_status(cri::ContainerStatusRequest {
            container_id: ctr.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner()
        .info;
    let spec: Value = serde_json::from_str(info.get("info").map(String::as_str).unwrap_or("{}"))
        .unwrap_or_default();
    assert_eq!(
        spec["runtimeSpec"]["process"]["user"]["uid"], 65532,
        "the default user: {:?}",
        spec["runtimeSpec"]["process"]["user"]
    );
    direct.remove_pod(&pod).await;
    let _ = direct
        .img
        .remove_image(cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: reference,
                ..Default::default()
            }),
        })
        .await;
}
