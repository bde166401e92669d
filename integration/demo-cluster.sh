#!/usr/bin/env bash
# The cluster side, end to end on this machine: qoslet in front of a real containerd, following a
# fake API server (the project's in-process one as a process: the real HTTP/JSON list/watch, status
# and Eviction API; no real kube-apiserver can be installed here) that holds a Node, two pods and
# this node's NodeSLO. qoslet takes its policy from the NodeSLO, an edit of the NodeSLO changes the
# BE cgroup at once, the NodeMetric qoslet reports is printed, and with Koordinator's ConfigMap turning
# co-location on, qoslet writes the Node's batch-cpu itself, which falls when an LS pod burns a core.
# Needs root. Installs what is missing.
#   integration/demo-cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo-cluster.sh needs root" >&2; exit 1; }
export QOSLET_TESTBED=${QOSLET_TESTBED:-/tmp/qoslet-testbed}
WORK=$QOSLET_TESTBED
TB=integration/testbed/testbed.sh
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "installing and starting a private containerd 1.6 + runc"
$TB up | sed 's/^/  /'
say "building qoslet and the fake API server"
# the last line on success; the compiler's whole complaint on failure
BUILD_LOG=$(mktemp)
if ! cargo build --workspace --bins --locked >"$BUILD_LOG" 2>&1; then
  tail -60 "$BUILD_LOG" >&2; rm -f "$BUILD_LOG"; exit 1
fi
tail -1 "$BUILD_LOG"; rm -f "$BUILD_LOG"
Q="${QOSLET_BIN:-${CARGO_TARGET_DIR:-target}/debug/qoslet}" # QOSLET_BIN: another build (or a wrapper)
FAKE="${CARGO_TARGET_DIR:-target}/debug/fake_apiserver"

D=$WORK/demo-cluster; rm -rf "$D"; mkdir -p "$D/objects"
QSOCK=$D/qoslet.sock; ASOCK=$D/admin.sock
ROOT=/qoslet-test/democluster
BEPARENT=$ROOT/kubepods/besteffort
cleanup() {
  [ -n "${QPID:-}" ] && [ -S "$QSOCK" ] && remove_pods 2>/dev/null || true
  [ -n "${QPID:-}" ] && kill -TERM "$QPID" 2>/dev/null && wait "$QPID" 2>/dev/null || true
  [ -n "${FPID:-}" ] && kill "$FPID" 2>/dev/null || true
}
trap cleanup EXIT

# the cluster's objects as the API server would serve them (one JSON file each; the fake API
# server applies a file when it changes and deletes the object when the file goes)
nodeslo() { # SUPPRESS_PERCENT
  jq -n --argjson p "$1" '{apiVersion:"slo.koordinator.sh/v1alpha1", kind:"NodeSLO", metadata:{name:"node-1"},
    spec:{resourceUsedThresholdWithBE:{enable:true, cpuSuppressPolicy:"cfsQuota", cpuSuppressThresholdPercent:$p},
          resourceQOSStrategy:{lsClass:{cpuQOS:{enable:true}}, beClass:{cpuQOS:{enable:true}}}}}'
}
apipod() { # NAME QOS PRIORITY
  jq -n --arg n "$1" --arg q "$2" --argjson pr "$3" '{apiVersion:"v1", kind:"Pod",
    metadata:{name:$n, namespace:"default", uid:("uid-" + $n)},
    spec:{nodeName:"node-1", priority:$pr, terminationGracePeriodSeconds:30,
          containers:[{name:"main", image:"busybox", resources:{}}]},
    status:{phase:"Running", qosClass:$q}}'
}
jq -n '{apiVersion:"v1", kind:"Node", metadata:{name:"node-1"},
  status:{capacity:{cpu:"2", memory:"24Gi"}, allocatable:{cpu:"1500m", memory:"23Gi"}}}' > "$D/objects/node.json"
nodeslo 65 > "$D/objects/nodeslo.json"
jq -n '{apiVersion:"v1", kind:"ConfigMap", metadata:{name:"slo-controller-config", namespace:"koordinator-system"},
  data:{"colocation-config": ({enable:true, cpuReclaimThresholdPercent:90, memoryReclaimThresholdPercent:90} | tostring)}}' \
  > "$D/objects/slo-controller-config.json"
apipod demo-ls Burstable 0 > "$D/objects/pod-ls.json"
apipod demo-be BestEffort 5000 > "$D/objects/pod-be.json"

say "starting the fake API server with a Node (kubelet reserves 0.5 CPU), two pods, this node's NodeSLO (cpuSuppressThresholdPercent 65) and Koordinator's ConfigMap (co-location on)"
"$FAKE" --dir "$D/objects" --kubeconfig "$D/kubeconfig" > "$D/fake.url" 2>"$D/fake.log" &
FPID=$!
for _ in $(seq 1 100); do [ -s "$D/fake.url" ] && break; sleep 0.05; done
URL=$(head -1 "$D/fake.url"); echo "  $URL (kubeconfig $D/kubeconfig)"

cat > "$D/qoslet.yaml" <<YAML
kubeletCgroupRoot: $ROOT
qosEngine:
  beParent: $BEPARENT
kubernetes:
  enable: true
  kubeconfig: $D/kubeconfig
  nodeName: node-1
  createNodeMetric: true      # no koord-manager here to create it
  reportInterval: 30s         # koordlet's minimum; the NodeMetric spec's default is 60 s
  batchResources: auto        # batch-cpu/batch-memory on the Node when the ConfigMap turns co-location on
YAML
say "starting qoslet in front of containerd, with the cluster side on (no policy: in its file)"
"$Q" proxy --listen "unix://$QSOCK" --admin-listen "unix://$ASOCK" \
  --runtime-endpoint "unix://$WORK/main/containerd.sock" --state-dir "$D/state" \
  --metrics-listen 127.0.0.1:19317 --config "$D/qoslet.yaml" 2>"$D/qoslet.log" &
QPID=$!
for _ in $(seq 1 600); do [ -S "$ASOCK" ] && [ -S "$QSOCK" ] && break; sleep 0.05; done
GRPCURL=$WORK/bin/grpcurl
. integration/scripts/lib.sh
run() { # name class cgroup-parent resources [script]
  local pod sb c
  pod=$(pod_json "$1" "uid-$1" "$3" "{\"app\":\"$1\",\"koordinator.sh/qosClass\":\"$2\"}")
  sb=$(rt RunPodSandbox "{\"config\":$pod}" | jq -r .podSandboxId)
  c=$(rt CreateContainer "$(ctr_json "$sb" "$pod" main "$4" "${5:-}")" | jq -r .containerId)
  rt StartContainer "{\"container_id\":\"$c\"}" >/dev/null
  echo "$sb $c"
}
remove_pods() { # what an earlier run left behind too
  local sb
  for app in demo-ls demo-be demo-burn; do
    for sb in $(rt ListPodSandbox "{\"filter\":{\"label_selector\":{\"app\":\"$app\"}}}" | jq -r '.items[]?.id'); do
      rt StopPodSandbox "{\"pod_sandbox_id\":\"$sb\"}" >/dev/null
      rt RemovePodSandbox "{\"pod_sandbox_id\":\"$sb\"}" >/dev/null
    done
  done
  for p in $ROOT/kubepods/burstable/poddemo-ls $ROOT/kubepods/burstable/poddemo-burn $BEPARENT/poddemo-be; do rm_cgroup_dirs "$p"; done
}
remove_pods
say "an LS and a BE pod through qoslet, as kubelet would run them"
read -r LS_SB _ < <(run demo-ls LS $ROOT/kubepods/burstable/poddemo-ls '{"cpu_shares":1024,"cpu_period":100000,"cpu_quota":100000}')
read -r BE_SB _ < <(run demo-be BE $BEPARENT/poddemo-be '{"cpu_shares":2,"cpu_period":100000}')
sleep 3
say "the policy in force comes from the NodeSLO (qoslet plan)"
"$Q" plan --admin "unix://$ASOCK" --plugin cpu-suppress | head -4 | sed 's/^/  /'
curl -s 127.0.0.1:19317/metrics | grep -E '^qoslet_policy_in_force|^qoslet_cluster_(watch_state|objects)' | sed 's/^/  /'
q1=$(cat /sys/fs/cgroup/cpu$BEPARENT/cpu.cfs_quota_us)
echo "  BE parent $BEPARENT cpu.cfs_quota_us = $q1 (BE may use 65% of the node minus LS and max(system, the Node's 0.5 reserved))"

say "editing the NodeSLO: cpuSuppressThresholdPercent 65 -> 20 (watched, no restart)"
nodeslo 20 > "$D/objects/nodeslo.json.tmp" && mv "$D/objects/nodeslo.json.tmp" "$D/objects/nodeslo.json"
for _ in $(seq 1 50); do
  q2=$(cat /sys/fs/cgroup/cpu$BEPARENT/cpu.cfs_quota_us)
  [ "$q2" != "$q1" ] && break; sleep 0.2
done
echo "  BE parent cpu.cfs_quota_us = $q2 (was $q1)"
[ "$q2" != "$q1" ] || { echo "FAIL: the NodeSLO edit did not reach the BE cgroup" >&2; exit 1; }

say "the NodeMetric qoslet reports (created, status written every 30 s; Koordinator's keys)"
for _ in $(seq 1 90); do
  NM=$(curl -s "$URL/apis/slo.koordinator.sh/v1alpha1/nodemetrics/node-1")
  [ "$(jq -r 'select(.kind == "NodeMetric") | .status.updateTime // empty' <<<"$NM")" != "" ] && break; sleep 0.5
done
jq '.status | {updateTime, nodeUsage: .nodeMetric.nodeUsage, systemUsage: .nodeMetric.systemUsage,
  aggregatedNodeUsages: [.nodeMetric.aggregatedNodeUsages[]? | {duration, avg: .usage.avg, p99: .usage.p99}],
  podsMetric: [.podsMetric[]? | select(.namespace == "default")]}' <<<"$NM" | sed 's/^/  /'
[ "$(jq -r 'select(.kind == "NodeMetric") | .status.updateTime // empty' <<<"$NM")" != "" ] || { echo "FAIL: no NodeMetric status" >&2; exit 1; }
# the LS pod has priority 0: Koordinator's default for its QoS class is koord-prod
[ "$(jq -r '.status.podsMetric[] | select(.name == "demo-ls") | .priority' <<<"$NM")" = koord-prod ] \
  || { echo "FAIL: demo-ls is not koord-prod in podsMetric" >&2; exit 1; }

say "batch resources: qoslet writes the Node's batch-cpu itself (no koord-manager), from the figures it reports"
batch_cpu() { curl -s "$URL/api/v1/nodes/node-1" | jq -r '.status.allocatable["kubernetes.io/batch-cpu"] // empty'; }
for _ in $(seq 1 120); do b1=$(batch_cpu); [ -n "$b1" ] && break; sleep 0.5; done
[ -n "$b1" ] || { echo "FAIL: no batch-cpu on the Node" >&2; exit 1; }
echo "  Node allocatable kubernetes.io/batch-cpu = $b1 (milli-cores), batch-memory = $(curl -s "$URL/api/v1/nodes/node-1" | jq -r '.status.allocatable["kubernetes.io/batch-memory"]')"
say "an LS pod starts burning a core: batch-cpu falls at the next reports"
read -r _ _ < <(run demo-burn LS $ROOT/kubepods/burstable/poddemo-burn '{"cpu_shares":1024,"cpu_period":100000}' 'while :; do :; done')
for _ in $(seq 1 240); do b2=$(batch_cpu); [ -n "$b2" ] && [ "$b2" -le $((b1 - 400)) ] && break; sleep 0.5; done
echo "  batch-cpu = $b2 (was $b1)"
[ -n "$b2" ] && [ "$b2" -le $((b1 - 400)) ] || { echo "FAIL: batch-cpu did not fall" >&2; exit 1; }
echo "  why (qoslet batch-resources):"
"$Q" batch-resources --admin "unix://$ASOCK" | sed 's/^/    /' | head -30

say "stopping and removing the pods through qoslet"
remove_pods
echo "  logs: $D/qoslet.log, $D/fake.log; containerd stays up; stop it with: $TB down"
