//! Release builds of the `qoslet` binary lay its functions out so that the code the agent runs sits
//! together: `link/qoslet.order` lists them (made by `integration/scripts/order-file.sh`), and the
//! linker places them first, in that order.
//!
//! Why: the kernel maps a binary's code 64 KiB around each page a process touches (fault-around),
//! and those pages count in the agent's RSS. Spread as the linker places it, the code an agent with
//! 1,000 containers runs (a few MB of 13.7 MB; most of the rest is the cluster client's, the CLI's
//! and error paths) kept 8.6 MiB of code resident; gathered, 2.4 MiB (docs/benchmarks.md, "Code
//! layout").
//!
//! Only where the linker takes lld's `--symbol-ordering-file` (rustc's bundled lld, the default on
//! x86_64 Linux since Rust 1.90): a trial link with this build's rustc, target, flags and linker
//! decides, so GNU ld, gold or another chosen linker keep the default layout and the build goes on.
//! Flags this script cannot see (`cargo rustc -- -C linker=…`) can be met with
//! `QOSLET_LINK_ORDER=0`, which turns the layout off.
//!
//! The names in the file carry hashes of the toolchain and of the crates' versions, features and
//! profile: a name this build does not have is skipped (a stale file costs resident pages, not a
//! failed build). `integration/run-tests.sh` checks that `cargo build --release --locked -p qoslet`
//! finds them and places them first; the file is made again when it does not. A linker set in a
//! config file that changes may need `cargo clean -p qoslet --release` (cargo does not rerun this
//! script for it).

use std::{env, path::Path, process::Command};

fn main() {
    println!("cargo:rerun-if-changed=link/qoslet.order");
    println!("cargo:rerun-if-env-changed=QOSLET_LINK_ORDER");
    let var = |k: &str| env::var(k).unwrap_or_default();
    // cargo does not rerun a build script when only the target's linker changed
    let target_linker = format!(
        "CARGO_TARGET_{}_LINKER",
        var("TARGET").to_uppercase().replace(['-', '.'], "_")
    );
    println!("cargo:rerun-if-env-changed={target_linker}");
    if var("PROFILE") != "release" || var("QOSLET_LINK_ORDER") == "0" {
        return;
    }
    let order = Path::new(&var("CARGO_MANIFEST_DIR")).join("link/qoslet.order");
    if !order.exists() {
        return;
    }
    // one argument each (-Xlinker, not -Wl,: a path may hold a comma)
    let args = [
        "-Xlinker".to_string(),
        format!("--symbol-ordering-file={}", order.display()),
        "-Xlinker".to_string(),
        "--no-warn-symbol-ordering".to_string(),
    ];
    if let Err(why) = linker_takes(&args) {
        println!(
            "cargo:warning=a trial link with --symbol-ordering-file failed ({why}): qoslet keeps the default code layout (docs/benchmarks.md, \"Code layout\")"
        );
        return;
    }
    for arg in args {
        println!("cargo:rustc-link-arg-bin=qoslet={arg}");
    }
}

/// Whether an empty program links with these linker arguments, built as this build builds
/// (rustc, target, RUSTFLAGS, the configured linker); if not, the first line rustc printed.
fn linker_takes(args: &[String]) -> Result<(), String> {
    let var = |k: &str| env::var(k).unwrap_or_default();
    let rustc = env::var_os("RUSTC").ok_or("no RUSTC")?;
    let dir = Path::new(&var("OUT_DIR")).join("link-probe");
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("probe.rs"), "fn main() {}\n"))
        .map_err(|e| e.to_string())?;
    let mut cmd = Command::new(rustc);
    cmd.arg(dir.join("probe.rs"))
        .arg("-o")
        .arg(dir.join("probe"))
        // RUSTFLAGS may deny lints (missing docs) the probe has no business meeting
        .args(["--cap-lints", "allow", "--crate-type", "bin"])
        .args(["--target", &var("TARGET")]);
    for flag in var("CARGO_ENCODED_RUSTFLAGS")
        .split('\x1f')
        .filter(|f| !f.is_empty())
    {
        cmd.arg(flag);
    }
    let linker = var("RUSTC_LINKER");
    if !linker.is_empty() {
        cmd.arg(format!("-Clinker={linker}"));
    }
    for arg in args {
        cmd.arg(format!("-Clink-arg={arg}"));
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(err
        .lines()
        .find(|l| l.contains("error"))
        .unwrap_or("rustc failed")
        .trim()
        .chars()
        .take(200)
        .collect())
}
