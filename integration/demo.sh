#!/usr/bin/env bash
# The main job, end to end on this machine: a real containerd with qoslet in front of it,
# a latency-sensitive (LS) and a best-effort (BE) pod run through qoslet the way kubelet
# would, and what qoslet saw and did. Needs root. Installs what is missing.
#   integration/demo.sh          run the demo, then remove the pods (containerd stays up)
#   KEEP=1 integration/demo.sh   leave qoslet and the pods running to look around
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo.sh needs root" >&2; exit 1; }
export QOSLET_TESTBED=${QOSLET_TESTBED:-/tmp/qoslet-testbed}
WORK=$QOSLET_TESTBED
TB=integration/testbed/testbed.sh
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "installing and starting a private containerd 1.6 + runc"
$TB up | sed 's/^/  /'
say "building qoslet"
# the last line on success; the compiler's whole complaint on failure
BUILD_LOG=$(mktemp)
if ! cargo build --workspace --bins --locked >"$BUILD_LOG" 2>&1; then
  tail -60 "$BUILD_LOG" >&2; rm -f "$BUILD_LOG"; exit 1
fi
tail -1 "$BUILD_LOG"; rm -f "$BUILD_LOG"

Q="${QOSLET_BIN:-${CARGO_TARGET_DIR:-target}/debug/qoslet}" # QOSLET_BIN: another build (or a wrapper)
D=$WORK/demo; mkdir -p "$D"
QSOCK=$D/qoslet.sock; ASOCK=$D/admin.sock
pkill -f "qoslet proxy --listen unix://$QSOCK" 2>/dev/null || true; sleep 0.2
rm -f "$QSOCK" "$ASOCK" # a socket file left by an earlier run would pass for the new one
# the QoS engine: BE may use 65% of the node minus what LS and the system use (a CFS quota on the
# demo's besteffort parent); Koordinator's NodeSLO names, hot-reloaded when this file changes
cat > "$D/qoslet.yaml" <<YAML
kubeletCgroupRoot: /qoslet-test/demo   # as kubelet's --cgroup-root: pods live in <root>/kubepods
policy:
  resourceQOSStrategy:                   # Koordinator's defaults are all off; the demo turns on what it shows
    lsClass: {cpuQOS: {enable: true}}
    beClass: {cpuQOS: {enable: true}}    # bvt -1 on Anolis kernels; cpu.idle=1 on the BE pod on upstream ones
  resourceUsedThresholdWithBE:
    enable: true
    cpuSuppressPolicy: cfsQuota
    cpuSuppressThresholdPercent: 65
qosEngine:
  beParent: /qoslet-test/demo/kubepods/besteffort
YAML
say "starting qoslet in front of containerd (kubelet would use --container-runtime-endpoint=unix://$QSOCK)"
"$Q" proxy --listen "unix://$QSOCK" --admin-listen "unix://$ASOCK" \
  --runtime-endpoint "unix://$WORK/main/containerd.sock" --state-dir "$D/state" \
  --metrics-listen 127.0.0.1:19316 --config "$D/qoslet.yaml" 2>"$D/qoslet.log" &
QPID=$!
for _ in $(seq 1 600); do [ -S "$ASOCK" ] && [ -S "$QSOCK" ] && break; sleep 0.05; done
GRPCURL=$WORK/bin/grpcurl
. integration/scripts/lib.sh
echo "  qoslet pid $QPID; services on its socket (from qoslet's reflection, no .proto file):"
"$GRPCURL" -plaintext -unix "$QSOCK" list | sed 's/^/    /'
echo "  runtime behind it: $(rt Version '{}' | jq -c .)"

run() { # name class cgroup-parent resources [annotations-json]
  local pod sb c
  pod=$(pod_json "$1" "uid-$1" "$3" "{\"app\":\"$1\",\"koordinator.sh/qosClass\":\"$2\"}" | jq -c --argjson a "${5:-{\}}" '.annotations = $a')
  sb=$(rt RunPodSandbox "{\"config\":$pod}" | jq -r .podSandboxId)
  c=$(rt CreateContainer "$(ctr_json "$sb" "$pod" main "$4")" | jq -r .containerId)
  rt StartContainer "{\"container_id\":\"$c\"}" >/dev/null
  echo "$sb $c"
}
say "an LS pod (Burstable: 1 core limit, 1024 shares, 256 MiB) and a BE pod (BestEffort, batch resources) through qoslet"
BATCH='{"node.koordinator.sh/extended-resource-spec":"{\"containers\":{\"main\":{\"requests\":{\"kubernetes.io/batch-cpu\":\"500\"},\"limits\":{\"kubernetes.io/batch-cpu\":\"1000\",\"kubernetes.io/batch-memory\":\"128Mi\"}}}}"}'
echo "  BE pod annotation (Koordinator's webhook writes it): $(jq -r '.["node.koordinator.sh/extended-resource-spec"]' <<<"$BATCH")"
echo "  kubelet asks for the BE container: cpu_shares=2, no quota, no memory limit"
read -r LS_SB LS_C < <(run demo-ls LS /qoslet-test/demo/kubepods/burstable/poddemo-ls \
  '{"cpu_period":100000,"cpu_quota":100000,"cpu_shares":1024,"memory_limit_in_bytes":268435456}')
read -r BE_SB BE_C < <(run demo-be BE /qoslet-test/demo/kubepods/besteffort/poddemo-be '{"cpu_shares":2,"cpu_period":100000}' "$BATCH")
for x in "LS /qoslet-test/demo/kubepods/burstable/poddemo-ls/$LS_C" "BE /qoslet-test/demo/kubepods/besteffort/poddemo-be/$BE_C"; do
  set -- $x
  echo "  $1 container cgroup $2:"
  echo "    cpu.shares=$(cat /sys/fs/cgroup/cpu$2/cpu.shares) cpu.cfs_quota_us=$(cat /sys/fs/cgroup/cpu$2/cpu.cfs_quota_us) memory.limit_in_bytes=$(cat /sys/fs/cgroup/memory$2/memory.limit_in_bytes)"
  echo "    pod cgroup cpu.idle=$(cat /sys/fs/cgroup/cpu${2%/*}/cpu.idle)"
done
echo "  (the BE values come from qoslet: batch-cpu 500m request -> 512 shares, 1000m limit -> 100000 us quota,"
echo "   batch-memory 128Mi -> memory limit, and SCHED_IDLE on the BE pod's cgroup)"

say "what qoslet knows: qoslet pods (its store, checkpointed to $D/state)"
"$Q" pods --admin "unix://$ASOCK" -n default | sed 's/^/  /'
say "qoslet status"
"$Q" status --admin "unix://$ASOCK" | sed 's/^/  /'
sleep 3 # a few collection ticks
say "qoslet top --once (live view without --once): usage vs what kubelet asked, throttling, PSI"
"$Q" top --once --admin "unix://$ASOCK" -n default | sed 's/^/  /'
say "Prometheus endpoint http://127.0.0.1:19316/metrics (the demo's containers)"
curl -s 127.0.0.1:19316/metrics | grep -E '^qoslet_container_(cpu_usage_cores|memory_working_set_bytes)\{namespace="default"' | sed 's/^/  /'
say "qoslet plan --plugin cpu-suppress: the QoS engine's last tick (every second), the rule behind each file"
"$Q" plan --admin "unix://$ASOCK" --plugin cpu-suppress | sed 's/^/  /'
say "qoslet plan --cgroup poddemo-be: what the engine keeps in place on the BE pod (drift is put back)"
"$Q" plan --admin "unix://$ASOCK" --cgroup poddemo-be | grep -E '^\[|because' | sed 's/^/  /'
curl -s 127.0.0.1:19316/metrics | grep -E '^qoslet_(be_suppress_level|be_cpu_allowance_cores|engine_writes_total) ' | sed 's/^/  /'

if [ "${KEEP:-0}" = 1 ]; then
  say "KEEP=1: qoslet (pid $QPID) and both pods stay up; stop with: kill $QPID; $TB down"
  exit 0
fi
say "stopping and removing both pods through qoslet"
for sb in "$LS_SB" "$BE_SB"; do
  rt StopPodSandbox "{\"pod_sandbox_id\":\"$sb\"}" >/dev/null
  rt RemovePodSandbox "{\"pod_sandbox_id\":\"$sb\"}" >/dev/null
done
for p in /qoslet-test/demo/kubepods/burstable/poddemo-ls /qoslet-test/demo/kubepods/besteffort/poddemo-be; do rm_cgroup_dirs "$p"; done
echo "  store now holds: $("$Q" pods --admin "unix://$ASOCK" --json | jq 'map(select(.namespace=="default")) | length') demo pods"
kill -TERM "$QPID"; wait "$QPID" && echo "  qoslet drained and exited 0 on SIGTERM (log: $D/qoslet.log)"
echo "  containerd stays up for another run; stop it with: $TB down"
