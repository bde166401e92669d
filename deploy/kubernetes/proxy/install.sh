#!/bin/sh
# qoslet proxy-mode installer. Runs in the qoslet-installer DaemonSet (deploy/kubernetes/proxy)
# and installs qoslet on its node as a systemd service in front of containerd: the proxy is in
# kubelet's runtime path, so it cannot be a pod (a dead qoslet pod could not be restarted by a
# kubelet that reaches the runtime only through it). docs/deploy.md explains every step.
#
#   install.sh         install or upgrade, then keep qoslet's API credentials fresh (the pod's main)
#   install.sh once    install or upgrade, and exit
#   install.sh ready   readiness: qoslet.service is active and its CRI socket exists
#
# What it writes on the host, and nothing else:
#   /usr/local/bin/qoslet (the previous one kept as qoslet.previous)
#   /etc/qoslet/qoslet.yaml (from the qoslet-config ConfigMap; see "config" below)
#   /etc/systemd/system/qoslet.service and qoslet.service.d/10-qoslet-installer.conf (NODE_NAME)
#   /etc/systemd/system/kubelet.service.d/20-qoslet.conf (ordering only: Wants= and After=)
#   /var/lib/qoslet/kube/{token,ca.crt,kubeconfig} (the qoslet service account's credentials)
# It runs `systemctl daemon-reload`, `enable` and `start`/`restart` of qoslet.service on the
# host. It never restarts kubelet nor changes kubelet's runtime endpoint: an operator does
# that node by node (docs/deploy.md).
set -eu

# The QOSLET_INSTALLER_* variables exist for integration/scripts/check-deploy.sh, which runs
# this script against a fake host; the DaemonSet sets none of them.
HOST=${QOSLET_INSTALLER_HOST:-/host}      # the host paths below are hostPath mounts
BIN=$HOST/usr/local/bin/qoslet
ETC=$HOST/etc/qoslet
UNITS=$HOST/etc/systemd/system
KUBE=$HOST/var/lib/qoslet/kube            # /var/lib/qoslet/kube on the host (0700)
SOCKET=$HOST/run/qoslet/qoslet.sock
IMAGE_BIN=${QOSLET_INSTALLER_BINARY:-/usr/local/bin/qoslet}   # in this image
SRC=${QOSLET_INSTALLER_SOURCES:-/installer}    # this script, qoslet.service, 20-qoslet.conf
CONFIG=${QOSLET_INSTALLER_CONFIG:-/config/qoslet.yaml}   # the qoslet-config ConfigMap
SA=${QOSLET_INSTALLER_CREDENTIALS:-/var/run/secrets/qoslet}   # projected: token (kubelet refreshes it), ca.crt
REFRESH=${QOSLET_REFRESH_SECONDS:-30}
TMP=${TMPDIR:-/tmp}
UNMANAGED='# qoslet-installer: unmanaged'

# Note: `set -e` does not hold inside a function called as an `if` condition, so every write
# below ends in `|| die`.
log() { echo "qoslet-installer: $*"; }
die() { log "error: $*"; exit 1; }
# a command of the host's (its systemctl, its libc), in PID 1's mount namespace (hostPID)
host() {
    if [ -n "${QOSLET_INSTALLER_HOST_EXEC:-}" ]; then
        "$QOSLET_INSTALLER_HOST_EXEC" "$@"
    else
        nsenter --target 1 --mount -- "$@"
    fi
}
digest() { sha256sum "$1" | cut -d' ' -f1; }

# put SRC DST MODE: DST gets SRC's content unless it has it already, through a temp file
# beside it renamed over it (a running binary, or qoslet reading its config, never sees half
# a file). Returns 0 when it wrote, 1 when DST was already the same.
put() {
    if [ -f "$2" ] && [ "$(digest "$1")" = "$(digest "$2")" ]; then
        return 1
    fi
    cp "$1" "$2.qoslet-installer.tmp" || die "cannot write ${2#"$HOST"}"
    chmod "$3" "$2.qoslet-installer.tmp" || die "cannot chmod ${2#"$HOST"}"
    mv -f "$2.qoslet-installer.tmp" "$2" || die "cannot replace ${2#"$HOST"}"
    return 0
}

ready() {
    [ -S "$SOCKET" ] && host systemctl is-active --quiet qoslet.service
}

# The service account's token and the cluster CA, copied where the host's qoslet reads them.
# The token is bound to this pod: deleting the pod (or the DaemonSet) revokes it, and the next
# pod writes a new one; kube-rs re-reads the token file at least once a minute.
credentials() {
    [ -s "$SA/token" ] || die "no service account token at $SA/token"
    mkdir -p "$KUBE" || die "cannot create /var/lib/qoslet/kube"
    chmod 0700 "$KUBE" || die "cannot chmod /var/lib/qoslet/kube"
    if put "$SA/token" "$KUBE/token" 0600; then log "API token refreshed"; fi
    if put "$SA/ca.crt" "$KUBE/ca.crt" 0644; then log "cluster CA written"; fi
}

api_server() {
    if [ -n "${QOSLET_API_SERVER:-}" ]; then
        echo "$QOSLET_API_SERVER"
        return
    fi
    h=${KUBERNETES_SERVICE_HOST:?KUBERNETES_SERVICE_HOST is not set (set QOSLET_API_SERVER)}
    case $h in *:*) h="[$h]" ;; esac
    echo "https://$h:${KUBERNETES_SERVICE_PORT:-443}"
}

# 0 when the kubeconfig changed (qoslet reads it at start only)
kubeconfig() {
    server=$(api_server) || die "no API server address"
    cat >"$TMP/kubeconfig" <<EOF || die "cannot write $TMP/kubeconfig"
# Written by qoslet-installer (deploy/kubernetes/proxy): qoslet's cluster credentials, the
# qoslet-system/qoslet service account's token, refreshed by the installer pod.
apiVersion: v1
kind: Config
clusters:
  - name: cluster
    cluster:
      server: $server
      certificate-authority: /var/lib/qoslet/kube/ca.crt
users:
  - name: qoslet
    user:
      tokenFile: /var/lib/qoslet/kube/token
contexts:
  - name: qoslet
    context:
      cluster: cluster
      user: qoslet
current-context: qoslet
EOF
    put "$TMP/kubeconfig" "$KUBE/kubeconfig" 0600
}

# 0 when the binary changed. The new binary must run on the host (its libc, its CPU) before
# it replaces the old one: qoslet.service is in kubelet's runtime path.
binary() {
    [ -x "$IMAGE_BIN" ] || die "no $IMAGE_BIN in this image"
    if [ -f "$BIN" ] && [ "$(digest "$IMAGE_BIN")" = "$(digest "$BIN")" ]; then
        return 1
    fi
    cp "$IMAGE_BIN" "$BIN.new" || die "cannot write /usr/local/bin/qoslet.new"
    chmod 0755 "$BIN.new" || die "cannot chmod /usr/local/bin/qoslet.new"
    if ! version=$(host /usr/local/bin/qoslet.new --version 2>&1); then
        rm -f "$BIN.new"
        die "the image's qoslet does not run on this host ($version); nothing changed"
    fi
    if [ -f "$BIN" ]; then
        if ! { cp -p "$BIN" "$BIN.previous.qoslet-installer.tmp" &&
            mv -f "$BIN.previous.qoslet-installer.tmp" "$BIN.previous"; }; then
            die "cannot keep /usr/local/bin/qoslet.previous"
        fi
        log "previous binary kept as /usr/local/bin/qoslet.previous"
    fi
    mv -f "$BIN.new" "$BIN" || die "cannot replace /usr/local/bin/qoslet"
    log "installed /usr/local/bin/qoslet ($version)"
    return 0
}

# The ConfigMap owns /etc/qoslet/qoslet.yaml: a file that differs is replaced, and kept as
# qoslet.yaml.<UTC time> when it is not what the installer wrote last (a local edit). A file
# holding the line "# qoslet-installer: unmanaged" is never touched. 0 when it changed.
config() {
    ip=${HOST_IP:?HOST_IP (status.hostIP) is not set}
    case $ip in *:*) ip="[$ip]" ;; esac
    sed "s/\${HOST_IP}/$ip/g" "$CONFIG" >"$TMP/qoslet.yaml" || die "cannot render $CONFIG"
    mkdir -p "$ETC" || die "cannot create /etc/qoslet"
    f=$ETC/qoslet.yaml
    if [ -f "$f" ] && grep -qF "$UNMANAGED" "$f"; then
        log "/etc/qoslet/qoslet.yaml is marked unmanaged: left as it is"
        return 1
    fi
    if [ -f "$f" ] && [ "$(digest "$f")" != "$(digest "$TMP/qoslet.yaml")" ] &&
        [ "$(digest "$f")" != "$(cat "$ETC/.qoslet-installer.sha256" 2>/dev/null || true)" ]; then
        kept=$f.$(date -u +%Y%m%dT%H%M%SZ)
        cp -p "$f" "$kept" || die "cannot keep ${kept#"$HOST"}"
        log "/etc/qoslet/qoslet.yaml was edited on the node: kept as ${kept#"$HOST"}, replaced by the ConfigMap's"
    fi
    # what qoslet would refuse at start is refused here, before a restart could take
    # kubelet's runtime away: the node keeps its running config
    cp "$TMP/qoslet.yaml" "$ETC/qoslet.yaml.check" || die "cannot write /etc/qoslet/qoslet.yaml.check"
    if ! why=$(host /usr/local/bin/qoslet check-config --config /etc/qoslet/qoslet.yaml.check 2>&1); then
        rm -f "$ETC/qoslet.yaml.check"
        die "qoslet refuses the ConfigMap's config ($why); the node keeps its running config"
    fi
    rm -f "$ETC/qoslet.yaml.check"
    if put "$TMP/qoslet.yaml" "$f" 0644; then
        digest "$f" >"$ETC/.qoslet-installer.sha256" || die "cannot write /etc/qoslet/.qoslet-installer.sha256"
        log "wrote /etc/qoslet/qoslet.yaml"
        return 0
    fi
    return 1
}

# 0 when qoslet's own unit files changed; sets KUBELET_DROPIN=1 when kubelet's changed
units() {
    changed=1
    if put "$SRC/qoslet.service" "$UNITS/qoslet.service" 0644; then
        log "wrote /etc/systemd/system/qoslet.service"
        changed=0
    fi
    mkdir -p "$UNITS/qoslet.service.d" "$UNITS/kubelet.service.d" || die "cannot create unit drop-in directories"
    printf '%s\n' "# Written by qoslet-installer: this node's name, for qoslet's cluster side" \
        "[Service]" "Environment=NODE_NAME=${NODE_NAME:?NODE_NAME is not set}" >"$TMP/node.conf" ||
        die "cannot write $TMP/node.conf"
    if put "$TMP/node.conf" "$UNITS/qoslet.service.d/10-qoslet-installer.conf" 0644; then
        log "wrote /etc/systemd/system/qoslet.service.d/10-qoslet-installer.conf"
        changed=0
    fi
    if put "$SRC/20-qoslet.conf" "$UNITS/kubelet.service.d/20-qoslet.conf" 0644; then
        log "wrote /etc/systemd/system/kubelet.service.d/20-qoslet.conf (takes effect at kubelet's next start)"
        KUBELET_DROPIN=1
    fi
    return $changed
}

install() {
    host systemctl --version >/dev/null 2>&1 ||
        die "cannot run the host's systemctl in PID 1's mount namespace: proxy mode needs a systemd host (or use deploy/kubernetes/nri)"
    restart=0
    KUBELET_DROPIN=0
    credentials
    if kubeconfig; then restart=1; fi
    if binary; then restart=1; fi
    if config; then restart=1; fi
    reload=0
    if units; then reload=1 restart=1; fi
    if [ "$KUBELET_DROPIN" = 1 ]; then reload=1; fi
    if [ "$reload" = 1 ]; then host systemctl daemon-reload; fi
    host systemctl enable --quiet qoslet.service
    if [ "$restart" = 1 ] && host systemctl is-active --quiet qoslet.service; then
        # an upgrade: kubelet's calls get UNAVAILABLE while qoslet drains and starts again,
        # and kubelet retries them; this DaemonSet rolls one node at a time
        log "restarting qoslet.service (binary, config, credentials file or unit changed)"
        host systemctl restart qoslet.service
    else
        host systemctl start qoslet.service
    fi
    i=0
    while [ ! -S "$SOCKET" ] && [ "$i" -lt 60 ]; do
        sleep 1
        i=$((i + 1))
    done
    if [ -S "$SOCKET" ]; then
        log "qoslet.service is running; /run/qoslet/qoslet.sock is up"
    else
        log "warning: no /run/qoslet/qoslet.sock after 60 s: see 'journalctl -u qoslet' on the node"
        host systemctl status --no-pager qoslet.service || true
    fi
    log "kubelet is not switched by this installer: set containerRuntimeEndpoint node by node (docs/deploy.md)"
}

case "${1:-install}" in
ready)
    ready
    exit
    ;;
once)
    install
    exit 0
    ;;
install) ;;
*) die "usage: install.sh [install|once|ready]" ;;
esac

install
trap 'log "stopping; qoslet.service keeps running"; exit 0' TERM INT
while :; do
    sleep "$REFRESH" &
    wait $! || true
    credentials
done
