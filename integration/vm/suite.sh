#!/usr/bin/env bash
# The VM suite (issue 44): qoslet on a real cgroup v2 + systemd node. Makes the
# guest image (cached), builds the guest's tests (integration/tests/node_v2.rs,
# feature `vm`) and the qoslet binary, boots the guest with the repository shared
# at the same path, checks what the node is (cgroup v2 with every controller,
# PSI, systemd, containerd with SystemdCgroup and NRI), runs the tests there,
# prints each step's time, and powers the guest off (also on failure).
#
#   integration/vm/suite.sh [TEST_FILTER]
#
# Run by integration/run-tests.sh; QOSLET_VM=0 skips it there (say why).
# Needs root, the machine's Debian mirror and ~1 GiB in QOSLET_VM_CACHE.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
VM=integration/vm/vm.sh
TARGET=$(realpath -m "${CARGO_TARGET_DIR:-$REPO/target}")
case "$TARGET" in
  "$REPO"/*) ;;
  *) echo "the guest sees the repository only: CARGO_TARGET_DIR ($TARGET) must be inside it" >&2; exit 1 ;;
esac
export QOSLET_VM_RUN=${QOSLET_VM_RUN:-/tmp/qoslet-vm}
t0=$(date +%s)
lap() { echo "=== [vm $(( $(date +%s) - t0 ))s] $*"; }

# whatever fails, no QEMU is left running
trap '$VM down || true' EXIT
lap "host: QEMU and image tools"
$VM setup
lap "guest image (built once, cached by its inputs)"
$VM image

lap "build: qoslet and the guest's tests"
LOG=$(mktemp)
cargo build --locked -p qoslet --bin qoslet >"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
cargo test --locked -p qoslet-integration --features vm --test node_v2 --no-run \
  --message-format=json >"$LOG.json" 2>"$LOG" || { cat "$LOG"; exit 1; }
BIN=$(python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "node_v2" and m.get("executable"):
        print(m["executable"])' <"$LOG.json")
rm -f "$LOG" "$LOG.json"
[ -x "$BIN" ] || { echo "the guest's test binary was not built" >&2; exit 1; }

lap "boot"
$VM boot
echo "boot: $(cat "$QOSLET_VM_RUN/boot-seconds") s to SSH ($(cat "$QOSLET_VM_RUN/accel"))"

lap "the node: cgroup v2, systemd, containerd"
$VM run 'set -e
echo "kernel $(uname -r); $(systemctl --version | head -1); state $(systemctl is-system-running || true)"
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || { echo "not cgroup v2"; exit 1; }
echo "controllers: $(cat /sys/fs/cgroup/cgroup.controllers); root subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
for c in cpu cpuset memory io pids; do grep -qw $c /sys/fs/cgroup/cgroup.subtree_control || { echo "controller $c not enabled"; exit 1; }; done
head -1 /proc/pressure/memory >/dev/null || { echo "no PSI"; exit 1; }
echo "containerd $(containerd --version | cut -d" " -f3), runc $(runc --version | head -1 | cut -d" " -f3)"
grep -q "SystemdCgroup = true" /etc/containerd/config.toml
[ -S /run/nri/nri.sock ] || { echo "no NRI socket"; exit 1; }'

lap "tests in the guest (integration/tests/node_v2.rs)"
# one at a time: a guest under software emulation has 2 slow vCPUs
$VM run "cd '$REPO/integration' && QOSLET_STRICT_TESTS=1 QOSLET_BIN='$TARGET/debug/qoslet' '$BIN' --test-threads 1 ${1:-}"

lap "power off"
$VM down
trap - EXIT
lap "the VM suite passed"
