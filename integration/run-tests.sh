#!/usr/bin/env bash
# qoslet's whole test suite, as CI runs it: unit tests, then end-to-end tests against a
# real containerd 1.6 + runc and containerd 1.7 (Debian packages), and containerd 2.1 for
# NRI v0.8 (registration only: its pods do not start here), then a grpcurl smoke
# run through a real qoslet process, the cluster demo, the manifests' checks, the release
# binary as shipped with its code layout checked, the container image built from it, and
# the VM suite (a real cgroup v2 + systemd node in QEMU: integration/vm/). Needs root
# (cgroups, containerd) and Rust.
# Installs what is missing (apt: containerd runc jq protobuf-compiler; PyPI: grpcurl; promtool),
# starts the containerds on private sockets, and tears them down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run-tests.sh needs root (real cgroups and containerd)" >&2; exit 1; }
TB=integration/testbed/testbed.sh
export QOSLET_TESTBED=${QOSLET_TESTBED:-/tmp/qoslet-testbed}
t0=$(date +%s)
lap() { echo "=== [$(( $(date +%s) - t0 ))s] $*"; }

lap "install test bed dependencies"
$TB install
CONTAINERD=1.7 INSTANCE=ctd17 $TB install
CONTAINERD=2.1 INSTANCE=ctd21 $TB install

cleanup() {
  lap "tear down"
  [ -n "${QPID:-}" ] && kill "$QPID" 2>/dev/null || true
  $TB down || true
  CONTAINERD=1.7 INSTANCE=ctd17 $TB down || true
  CONTAINERD=2.1 INSTANCE=ctd21 $TB down || true
  INSTANCE=restart CONTAINERD=1.7 $TB down >/dev/null 2>&1 || true
  INSTANCE=nri CONTAINERD=1.7 $TB down >/dev/null 2>&1 || true
  INSTANCE=nrirestart CONTAINERD=1.7 $TB down >/dev/null 2>&1 || true
}
trap cleanup EXIT

export QOSLET_PROMTOOL=$QOSLET_TESTBED/bin/promtool
# every test must run here (root, real cgroup v1, the test bed): one that finds its
# host lacking fails instead of passing untested (cgroups::skip_test)
export QOSLET_STRICT_TESTS=1

lap "build (workspace, debug)"
cargo build --workspace --bins --tests --locked --features qoslet-integration/testbed

lap "start containerd 1.6 (main), 1.7 (ctd17) and 2.1 (ctd21)"
$TB up >/dev/null
CONTAINERD=1.7 INSTANCE=ctd17 $TB up >/dev/null
CONTAINERD=2.1 INSTANCE=ctd21 $TB up >/dev/null

lap "cargo test --workspace (with the test bed's tests)"
cargo test --workspace --locked --features qoslet-integration/testbed

lap "grpcurl smoke through a qoslet process"
D=$QOSLET_TESTBED/smoke-run; rm -rf "$D"; mkdir -p "$D"
"${CARGO_TARGET_DIR:-target}"/debug/qoslet proxy --listen "unix://$D/qoslet.sock" --admin-listen "unix://$D/admin.sock" \
  --runtime-endpoint "unix://$QOSLET_TESTBED/main/containerd.sock" --state-dir "$D/state" 2>"$D/qoslet.log" &
QPID=$!
for _ in $(seq 1 100); do [ -S "$D/admin.sock" ] && break; sleep 0.05; done
GRPCURL=$QOSLET_TESTBED/bin/grpcurl integration/scripts/grpcurl-smoke.sh "$D/qoslet.sock" "$D/admin.sock"
kill -TERM "$QPID"; wait "$QPID"; rc=$?; QPID=
[ "$rc" = 0 ] || { echo "qoslet exited $rc after SIGTERM" >&2; exit 1; }

lap "the cluster demo (fake API server, NodeSLO edit, NodeMetric report) on containerd 1.6"
integration/demo-cluster.sh > "$QOSLET_TESTBED/demo-cluster.out" 2>&1 \
  || { tail -40 "$QOSLET_TESTBED/demo-cluster.out"; exit 1; }

lap "Kubernetes manifests (deploy/), offline against the 1.33 schemas"
integration/scripts/check-deploy.sh

lap "the release binary: built as shipped, its code layout (link/qoslet.order) applies"
REL_LOG=$QOSLET_TESTBED/release-build.log
cargo build --release --locked -p qoslet --bin qoslet > "$REL_LOG" 2>&1 || { tail -40 "$REL_LOG"; exit 1; }
grep -i "warning: qoslet" "$REL_LOG" || true # build.rs says when the linker keeps the default layout
python3 integration/scripts/order_file.py --check "${CARGO_TARGET_DIR:-target}/release/qoslet"

lap "the container image from that binary (integration/image/build.sh)"
integration/image/build.sh "$QOSLET_TESTBED/qoslet-image.tar" "${CARGO_TARGET_DIR:-target}/release/qoslet"

# the real cgroup v2 + systemd node: a VM guest (integration/vm/), after the host's
# tests (it needs both cores); QOSLET_VM=0 skips it on a machine that cannot run it
if [ "${QOSLET_VM:-1}" = 0 ]; then
  lap "SKIPPED: the VM suite (cgroup v2 + systemd), QOSLET_VM=0: nothing ran on a v2 + systemd node"
else
  lap "the VM suite: cgroup v2 + systemd node (integration/vm/suite.sh)"
  integration/vm/suite.sh
fi

lap "all tests passed"
