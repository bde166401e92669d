# Shared shell helpers for qoslet's scripts (sourced, not run).
# Needs: GRPCURL, QSOCK (qoslet's CRI socket). grpcurl finds the CRI schema through
# qoslet's own server reflection: no .proto file is needed.
cri() { "$GRPCURL" -plaintext -unix -d "$2" "$QSOCK" "runtime.v1.$1"; }
rt() { cri "RuntimeService/$1" "$2"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# pod_json NAME UID CGROUP_PARENT LABELS_JSON
pod_json() {
  jq -nc --arg n "$1" --arg uid "$2" --arg cgp "$3" --arg log "${WORK:-/tmp/qoslet-testbed}/pods/$1" --argjson labels "$4" '{
    metadata:{name:$n, uid:$uid, namespace:"default", attempt:0},
    log_directory:$log, labels:$labels,
    linux:{cgroup_parent:$cgp, security_context:{namespace_options:{network:"NODE", pid:"CONTAINER", ipc:"POD"}}}}'
}

# ctr_json POD_ID POD_JSON NAME RESOURCES_JSON [SCRIPT] (default: sleep until TERM)
ctr_json() {
  jq -nc --arg sb "$1" --argjson pod "$2" --arg n "$3" --argjson r "$4" \
    --arg cmd "${5:-trap "exit 0" TERM; while true; do sleep 1; done}" '{pod_sandbox_id:$sb, sandbox_config:$pod, config:{
    metadata:{name:$n, attempt:0}, image:{image:"localhost/testbed/busybox:1.35"},
    command:["/bin/sh","-c",$cmd],
    log_path:($n + "/0.log"),
    linux:{resources:$r, security_context:{namespace_options:{network:"NODE", pid:"CONTAINER", ipc:"POD"}}}}}'
}

# check FILE EXPECTED
check() {
  local got; got=$(cat "$1"); [ "$got" = "$2" ] || fail "$1 = $got, want $2"; echo "  ok  $1 = $got"
}

# remove the (empty) pod cgroup dirs runc leaves behind under a cgroup parent
rm_cgroup_dirs() {
  for ss in /sys/fs/cgroup/*/; do [ -d "$ss${1#/}" ] && rmdir "$ss${1#/}" 2>/dev/null; done; return 0
}
