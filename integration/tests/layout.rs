//! The test files are all declared (integration/Cargo.toml has
//! `autotests = false`): one not declared would never run, under
//! `cargo test --workspace` or integration/run-tests.sh. Those that need
//! the test bed are the `testbed` feature's, or the `vm` feature's (they run
//! in the VM test bed's guest, integration/vm/suite.sh).

#[test]
fn every_test_file_is_declared_and_the_test_bed_ones_need_the_feature() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let declared: Vec<(String, bool)> = manifest
        .split("[[test]]")
        .skip(1)
        .map(|t| {
            let t = t.split("\n[").next().unwrap_or(t);
            let path = t
                .lines()
                .find_map(|l| l.strip_prefix("path = \""))
                .and_then(|p| p.strip_suffix('"'))
                .expect("a [[test]] with a path")
                .to_string();
            let gated = ["testbed", "vm"]
                .iter()
                .any(|f| t.contains(&format!("required-features = [\"{f}\"]")));
            (path, gated)
        })
        .collect();
    for e in std::fs::read_dir(dir.join("tests")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if !name.ends_with(".rs") {
            continue;
        }
        let path = format!("tests/{name}");
        let Some((_, gated)) = declared.iter().find(|(p, _)| *p == path) else {
            panic!("{path} is not declared in integration/Cargo.toml: it would never run");
        };
        let text = std::fs::read_to_string(dir.join(&path)).unwrap();
        // (spelled apart, so this file does not find them in itself)
        let needs_bed = [
            concat!("Testbed", "::"),
            concat!("python", "_peer"),
            concat!("Qoslet", "Process"),
            concat!("Node", "::systemd_v2"),
        ]
        .iter()
        .any(|w| text.contains(w));
        assert!(
            !needs_bed || *gated,
            "{path} uses the test bed: it needs required-features = [\"testbed\"] (or [\"vm\"])"
        );
    }
}
