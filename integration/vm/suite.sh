#!/usr/bin/env bash
# The VM suite (issue 44): qoslet on a real cgroup v2 + systemd node. Makes the
# guest image (cached), builds the guest's tests and the qoslet binary, boots the
# guest with the repository shared at the same path, checks what the node is
# (cgroup v2 with every controller, PSI, systemd, containerd with SystemdCgroup
# and NRI), runs the tests there, prints each group's time, and powers the guest
# off (also on failure).
#
# The guest's tests: integration/tests/node_v2.rs (feature `vm`: what only a v2 +
# systemd node has), and the host's own test files that apply to any node, run
# unchanged with QOSLET_TEST_NODE=systemd-v2 (the test library then gives them the
# guest's containerd, systemd slices for cgroup parents, and reads each setting
# from the v2 files: testbed::Driver). docs/testing.md says which run where and why.
#
#   integration/vm/suite.sh [TEST_FILE [TEST_FILTER]]
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
# a run directory of its own (pidfile, ssh config, console): another run's VM is
# never this run's to power off
OWN_RUN=
if [ -z "${QOSLET_VM_RUN:-}" ]; then
  QOSLET_VM_RUN=$(mktemp -d /tmp/qoslet-vm.XXXXXX); OWN_RUN=1
fi
export QOSLET_VM_RUN
t0=$(date +%s)
lap() { echo "=== [vm $(( $(date +%s) - t0 ))s] $*"; }

# whatever fails, no QEMU of this run is left running
cleanup() { $VM down || true; [ -z "$OWN_RUN" ] || rm -rf "$QOSLET_VM_RUN"; }
trap cleanup EXIT
lap "host: QEMU and image tools"
$VM setup
lap "guest image (built once, cached by its inputs)"
$VM image

lap "build: qoslet and the guest's tests"
LOG=$(mktemp)
cargo build --locked -p qoslet --bin qoslet >"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
# the guest's test files; a test that cannot apply in the guest is skipped by name, with why
GUEST_TESTS=(node_v2 install lifecycle events containerd_restart faults trust cluster)
# the install's figures (image, registration time, RSS) are printed by its test
declare -A SHOW=([install]="--nocapture")
declare -A SKIP=(
  # a peer's wire (grpcio's HTTP/2) does not change with the cgroup driver, and the
  # peers' PyPI packages are the host test bed's
  [faults]="--skip a_hooks_refusal_reaches_a_grpcio_client_as_sent"
)
if [ -n "${1:-}" ]; then GUEST_TESTS=("$1"); fi
cargo test --locked -p qoslet-integration --features testbed,vm \
  $(printf -- '--test %s ' "${GUEST_TESTS[@]}") --no-run \
  --message-format=json >"$LOG.json" 2>"$LOG" || { cat "$LOG"; exit 1; }
declare -A BIN
while read -r name exe; do BIN[$name]=$exe; done < <(python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["kind"] == ["test"] and m.get("executable"):
        print(m["target"]["name"], m["executable"])' <"$LOG.json")
rm -f "$LOG" "$LOG.json"
for t in "${GUEST_TESTS[@]}"; do
  [ -x "${BIN[$t]:-}" ] || { echo "the guest's test binary $t was not built" >&2; exit 1; }
done

# what tests/install.rs runs, as a cluster would have it (the guest reads it through
# the shared repository): the NRI overlay rendered by kubectl, the image built from the
# release binary, that binary, and the API server's TLS (a CA and a certificate for the
# pod network's gateway, 10.88.0.1)
if [[ " ${GUEST_TESTS[*]} " == *" install "* ]]; then
  lap "the install: manifests rendered, the image from the release binary, TLS"
  DEPLOY=$TARGET/vm-deploy LOG=$(mktemp)
  rm -rf "$DEPLOY"; mkdir -p "$DEPLOY/tls"
  kubectl kustomize deploy/kubernetes/nri >"$DEPLOY/nri.yaml"
  kubectl kustomize deploy/kubernetes/proxy >"$DEPLOY/proxy.yaml"
  cargo build --release --locked -p qoslet --bin qoslet >"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
  cp "$TARGET/release/qoslet" "$DEPLOY/qoslet"
  integration/image/build.sh "$DEPLOY/qoslet-image.tar" "$DEPLOY/qoslet" >"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
  (
    cd "$DEPLOY/tls"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
      -subj /CN=qoslet-vm-ca -keyout ca.key -out ca.crt \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=kube-apiserver \
      -keyout apiserver.key -out apiserver.csr 2>/dev/null
    printf '%s\n' 'subjectAltName=IP:10.88.0.1,IP:127.0.0.1,DNS:kubernetes.default.svc' \
      'basicConstraints=critical,CA:FALSE' 'keyUsage=critical,digitalSignature' \
      'extendedKeyUsage=serverAuth' >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    rm -f ca.key apiserver.csr apiserver.ext ca.srl
  )
  rm -f "$LOG"
  echo "figure: image archive $(stat -c %s "$DEPLOY/qoslet-image.tar") bytes; the binary $(stat -c %s "$DEPLOY/qoslet") bytes"
fi

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
# AppArmor on, with its parser: containerd confines containers with its default profile
# (cri-containerd.apparmor.d), as on Debian and Ubuntu nodes
[ "$(cat /sys/module/apparmor/parameters/enabled 2>/dev/null)" = Y ] && command -v apparmor_parser >/dev/null \
  || { echo "no AppArmor"; exit 1; }
echo "AppArmor: enabled, $(aa-enabled 2>/dev/null || true)"
echo "containerd $(containerd --version | cut -d" " -f3), runc $(runc --version | head -1 | cut -d" " -f3)"
grep -q "SystemdCgroup = true" /etc/containerd/config.toml
[ -S /run/nri/nri.sock ] || { echo "no NRI socket"; exit 1; }
echo "beside it: containerd $(/opt/containerd-2.1/usr/bin/containerd --version | cut -d" " -f3)"
[ -S /run/nri21/nri.sock ] || { echo "no NRI socket of containerd 2.1"; exit 1; }'

# one at a time: a guest under software emulation has 2 slow vCPUs
guest_test() { # CONTAINERD FILE ARGS...
  $VM run "cd '$REPO/integration' && QOSLET_TEST_NODE=systemd-v2 QOSLET_TEST_CONTAINERD=$1 \
    QOSLET_VM_DEPLOY='$TARGET/vm-deploy' \
    QOSLET_STRICT_TESTS=1 QOSLET_BIN='$TARGET/debug/qoslet' '${BIN[$2]}' --test-threads 1 ${*:3}"
}
for t in "${GUEST_TESTS[@]}"; do
  lap "tests in the guest, containerd 1.7: integration/tests/$t.rs"
  guest_test 1.7 "$t" ${SKIP[$t]:-} ${SHOW[$t]:-} ${2:-}
done
# proxy mode's installer: it changes the node (qoslet.service in front of containerd), so
# it runs after the other tests, the guest reboots in the middle, and the documented
# uninstall ends it
if [[ " ${GUEST_TESTS[*]} " == *" install "* ]]; then
  lap "the proxy installer: install, restart of the service"
  guest_test 1.7 install --nocapture --ignored --exact proxy_installer_installs_qoslet_as_a_host_service
  lap "reboot of the guest"
  $VM reboot
  lap "after the reboot: the service back, nothing lost; the documented uninstall"
  guest_test 1.7 install --nocapture --ignored --exact proxy_install_survives_a_reboot_and_uninstalls_cleanly
fi
# containerd 2.1 (Debian sid's, NRI v0.8) runs pods here: the pod lifecycle, the proxy's
# and the NRI plugin's isolation on it too
if [ -z "${1:-}" ]; then
  lap "tests in the guest, containerd 2.1: lifecycle, proxy and NRI isolation"
  guest_test 2.1 lifecycle
  guest_test 2.1 node_v2 proxy_isolates_be_and_ls_pods_with_the_systemd_driver \
    nri_plugin_applies_what_the_proxy_applies_with_the_systemd_driver
fi

lap "power off"
$VM down || echo "warning: the guest did not power off cleanly (killed)"
trap - EXIT
[ -z "$OWN_RUN" ] || rm -rf "$QOSLET_VM_RUN"
lap "the VM suite passed"
