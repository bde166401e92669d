//! The in-process fake API server (`qoslet_kube_fake`) as a process, for
//! `integration/demo-cluster.sh`: it serves the real HTTP/JSON list, watch,
//! status and Eviction API on 127.0.0.1 and keeps its objects in step with a
//! directory of JSON files, one object each (`Node`, `Pod`, `NodeSLO`,
//! `NodeMetric`, `ConfigMap`): a file written is applied (a watch event), a file removed is
//! deleted. What qoslet writes (NodeMetric status, Events) lives in the
//! server: read it with `curl <url>/apis/slo.koordinator.sh/v1alpha1/nodemetrics/<node>`.
//!
//!   fake_apiserver --dir DIR --kubeconfig FILE   (prints the URL, runs until killed)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use qoslet_kube_fake::FakeApiServer;
use serde_json::Value;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// Where an object of this kind lives, and its key there.
fn place(o: &Value) -> Option<(String, String)> {
    let name = o["metadata"]["name"].as_str()?;
    let coll = match o["kind"].as_str()? {
        "Node" => "/api/v1/nodes".to_string(),
        "Pod" => "/api/v1/pods".to_string(),
        "NodeSLO" => "/apis/slo.koordinator.sh/v1alpha1/nodeslos".to_string(),
        "NodeMetric" => "/apis/slo.koordinator.sh/v1alpha1/nodemetrics".to_string(),
        "ConfigMap" => format!(
            "/api/v1/namespaces/{}/configmaps",
            o["metadata"]["namespace"].as_str()?
        ),
        _ => return None,
    };
    let key = match o["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    };
    Some((coll, key))
}

fn scan(dir: &Path) -> BTreeMap<PathBuf, SystemTime> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| Some((e.path(), e.metadata().ok()?.modified().ok()?)))
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (Some(dir), Some(kubeconfig)) = (arg("--dir"), arg("--kubeconfig")) else {
        eprintln!("usage: fake_apiserver --dir DIR --kubeconfig FILE");
        std::process::exit(2);
    };
    let dir = PathBuf::from(dir);
    let fake = FakeApiServer::start().await;
    std::fs::write(&kubeconfig, fake.kubeconfig()).expect("write the kubeconfig");
    println!("{}", fake.url());
    let mut seen: BTreeMap<PathBuf, (SystemTime, String, String)> = BTreeMap::new();
    loop {
        let now = scan(&dir);
        for (path, mtime) in &now {
            if seen.get(path).is_some_and(|(m, _, _)| m == mtime) {
                continue;
            }
            let object = std::fs::read(path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
            match object.as_ref().and_then(|o| Some((o, place(o)?))) {
                Some((o, (coll, key))) => {
                    fake.apply(&coll, o.clone());
                    eprintln!("fake API server: applied {}", path.display());
                    seen.insert(path.clone(), (*mtime, coll, key));
                }
                None => eprintln!(
                    "fake API server: {} is not a Node, Pod, NodeSLO, NodeMetric or ConfigMap in JSON",
                    path.display()
                ),
            }
        }
        let gone: Vec<PathBuf> = seen
            .keys()
            .filter(|p| !now.contains_key(*p))
            .cloned()
            .collect();
        for p in gone {
            if let Some((_, coll, key)) = seen.remove(&p) {
                fake.delete(&coll, &key);
                eprintln!("fake API server: deleted {key}");
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
