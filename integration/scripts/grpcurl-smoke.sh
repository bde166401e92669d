#!/usr/bin/env bash
# Drives CRI through a running qoslet with grpcurl and no .proto file (qoslet serves
# reflection for CRI and for its admin API), checks the real cgroup v1 files, and
# checks the admin API. Exits non-zero on the first failure.
# Usage: grpcurl-smoke.sh QOSLET_SOCK ADMIN_SOCK   (env GRPCURL: grpcurl binary)
set -euo pipefail
QSOCK=$1; ASOCK=$2
GRPCURL=${GRPCURL:-/tmp/qoslet-testbed/bin/grpcurl}
. "$(dirname "$0")/lib.sh"
SUF=$$-$(date +%s)
CGP=/qoslet-test/smoke/pod$SUF

echo "grpcurl list through qoslet (reflection):"
services=$("$GRPCURL" -plaintext -unix "$QSOCK" list)
echo "$services" | sed 's/^/  /'
grep -qx runtime.v1.RuntimeService <<<"$services" || fail "RuntimeService not listed"
grep -qx runtime.v1.ImageService <<<"$services" || fail "ImageService not listed"
"$GRPCURL" -plaintext -unix "$QSOCK" describe runtime.v1.RuntimeService.CreateContainer >/dev/null || fail "describe"
[ "$(rt Version '{}' | jq -r .runtimeName)" = containerd ] || fail "Version"
# without reflection (a protoset file saved from qoslet's reflection): a plain CRI call, with
# grpc-go's socket-path :authority (which qoslet's authority filter accepts)
PS=$(mktemp); "$GRPCURL" -plaintext -unix -protoset-out "$PS" "$QSOCK" describe runtime.v1.RuntimeService >/dev/null
[ "$("$GRPCURL" -plaintext -unix -protoset "$PS" -d '{}' "$QSOCK" runtime.v1.RuntimeService/Version | jq -r .runtimeName)" = containerd ] \
  || fail "Version without reflection"
rm -f "$PS"
echo "  ok  CRI through qoslet with reflection and without (socket-path :authority)"

admin=$("$GRPCURL" -plaintext -unix "$ASOCK" list)
for s in qoslet.admin.v1.Admin grpc.health.v1.Health; do grep -qx "$s" <<<"$admin" || fail "$s not listed on the admin socket"; done
[ "$("$GRPCURL" -plaintext -unix "$ASOCK" grpc.health.v1.Health/Check | jq -r .status)" = SERVING ] || fail "health"

POD=$(pod_json "smoke-$SUF" "uid-$SUF" "$CGP" '{"app":"smoke"}')
SB=$(rt RunPodSandbox "{\"config\":$POD}" | jq -r .podSandboxId)
C=$(rt CreateContainer "$(ctr_json "$SB" "$POD" work '{"cpu_period":100000,"cpu_quota":40000,"cpu_shares":384,"memory_limit_in_bytes":50331648}')" | jq -r .containerId)
rt StartContainer "{\"container_id\":\"$C\"}" >/dev/null
[ "$(rt ContainerStatus "{\"container_id\":\"$C\"}" | jq -r .status.state)" = CONTAINER_RUNNING ] || fail "not running"
check "/sys/fs/cgroup/cpu$CGP/$C/cpu.shares" 384
check "/sys/fs/cgroup/cpu$CGP/$C/cpu.cfs_quota_us" 40000
check "/sys/fs/cgroup/memory$CGP/$C/memory.limit_in_bytes" 50331648

pods=$("$GRPCURL" -plaintext -unix -d '{"namespace":"default"}' "$ASOCK" qoslet.admin.v1.Admin/ListPods)
[ "$(jq -r --arg id "$SB" '.pods[] | select(.id==$id) | .cgroupParent' <<<"$pods")" = "$CGP" ] || fail "ListPods lacks the pod"
[ "$(jq -r --arg id "$C" '.pods[].containers[]? | select(.id==$id) | .requested.cpuShares' <<<"$pods")" = 384 ] || fail "ListPods lacks the container"
echo "  ok  admin ListPods shows the pod, its cgroup parent and the requested resources"

rt StopContainer "{\"container_id\":\"$C\",\"timeout\":5}" >/dev/null
rt RemoveContainer "{\"container_id\":\"$C\"}" >/dev/null
rt StopPodSandbox "{\"pod_sandbox_id\":\"$SB\"}" >/dev/null
rt RemovePodSandbox "{\"pod_sandbox_id\":\"$SB\"}" >/dev/null
rm_cgroup_dirs "$CGP"
status=$("$GRPCURL" -plaintext -unix "$ASOCK" qoslet.admin.v1.Admin/GetStatus)
[ "$(jq -r .backend.reachable <<<"$status")" = true ] || fail "GetStatus: backend not reachable"
echo "PASS grpcurl smoke through qoslet ($QSOCK)"
