#!/usr/bin/env bash
# Makes link/qoslet.order, the functions a running agent executes, which release builds of qoslet
# place together (build.rs says why). It runs the release agent under callgrind through four
# workloads and keeps the functions of the agent process that ran:
#   demo:  integration/demo.sh, `qoslet proxy` in front of a real containerd: an LS and a BE pod
#          through the CRI proxy, the hooks, the engine and the metrics on real cgroups, the admin
#          API, Prometheus, SIGTERM;
#   cluster: integration/demo-cluster.sh, the same with the cluster side on (a fake API server:
#          NodeSLO, Pods, Node, NodeMetric), as the Kubernetes manifests run qoslet;
#   agent: metrics_bench's agent, `qoslet proxy` with 1,000 containers in its store and a 1 h cache
#          loaded from a snapshot, collecting every second, no runtime traffic;
#   nri:   nri_bench, `qoslet nri` registered with a real containerd 1.7, pod lifecycles.
# order_file.py groups the functions by the workloads that ran them: code one front end alone runs
# sits at an end, away from the code every agent runs.
# Re-run it when the code the agent runs has moved, or rustc or Cargo.lock changed (the build warns).
# Needs root (the test bed) and valgrind (installed if missing). About 5 minutes after the build.
#   integration/scripts/order-file.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "order-file.sh needs root (the workloads run containerd)" >&2; exit 1; }
command -v valgrind >/dev/null || { apt-get update -q && apt-get install -y -q valgrind; } >/dev/null
export QOSLET_TESTBED=${QOSLET_TESTBED:-/tmp/qoslet-testbed}
cargo build --release --locked --workspace --bins
T="${CARGO_TARGET_DIR:-target}/release"
BIN=$(realpath "$T/qoslet")
OUT=$(mktemp -d); trap 'pkill -f "callgrind-out-file=$OUT" 2>/dev/null || true; rm -rf "$OUT"' EXIT
# the agent (proxy, nri) under callgrind, its counts dumped every 2M basic blocks too (a test
# harness may end it with SIGKILL); the CLI as it is
cat > "$OUT/qoslet" <<WRAP
#!/bin/sh
case "\$1" in
  proxy|nri) exec valgrind -q --tool=callgrind --demangle=no --dump-every-bb=2000000 \
    --callgrind-out-file="$OUT/\$WORKLOAD/cg.%p" "$BIN" "\$@" ;;
esac
exec "$BIN" "\$@"
WRAP
chmod +x "$OUT/qoslet"
mkdir -p "$OUT/demo" "$OUT/cluster" "$OUT/agent" "$OUT/nri"
echo "== workload demo"
WORKLOAD=demo QOSLET_BIN=$OUT/qoslet integration/demo.sh > "$OUT/demo.log" 2>&1 ||
  { tail -30 "$OUT/demo.log"; exit 1; }
echo "== workload cluster"
WORKLOAD=cluster QOSLET_BIN=$OUT/qoslet integration/demo-cluster.sh > "$OUT/cluster.log" 2>&1 ||
  { tail -30 "$OUT/cluster.log"; exit 1; }
echo "== workload agent (1,000 containers)"
WORKLOAD=agent QOSLET_BIN=$OUT/qoslet "$T/metrics_bench" --hours 1 --skip-collection --agent-secs 30 | tail -1
echo "== workload nri (containerd 1.7)"
CONTAINERD=1.7 INSTANCE=ctd17 integration/testbed/testbed.sh up > /dev/null
WORKLOAD=nri QOSLET_BIN=$OUT/qoslet "$T/nri_bench" | tail -1
python3 integration/scripts/order_file.py "$BIN" demo="$OUT/demo" cluster="$OUT/cluster" \
  agent="$OUT/agent" nri="$OUT/nri" > link/qoslet.order.new
mv link/qoslet.order.new link/qoslet.order
grep '^#' link/qoslet.order
echo "== the release build with it"
cargo build --release --locked --workspace --bins
python3 integration/scripts/order_file.py --check "$BIN"
