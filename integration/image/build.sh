#!/usr/bin/env bash
# qoslet's container image, built without a registry or a builder: an OCI image
# archive (Debian packages from this machine's mirror the only download) holding the
# release binary at /usr/bin/qoslet (the entrypoint), what it links against
# (glibc's libc, libm and loader, libgcc_s: from the Debian packages the
# binary was built against), the CA certificates the API server's client may
# need (Debian's ca-certificates, bundled as update-ca-certificates bundles
# them), the Debian copyright files of those packages, a passwd/group with
# root and the default non-root user (65532), and nothing else: no shell.
#
#   integration/image/build.sh OUT.tar [QOSLET_BIN]
#
# QOSLET_BIN defaults to target/release/qoslet (`cargo build --release --locked
# -p qoslet`). The image is named ghcr.io/qoslet/qoslet:<workspace version>
# (QOSLET_IMAGE_NAME overrides the repository). Reproducible: the same binary,
# packages and commit give the same archive, byte for byte (every mtime is the
# commit's time, SOURCE_DATE_EPOCH overrides it). Needs apt-get (download only,
# nothing is installed), dpkg-deb, readelf, tar, gzip, sha256sum; root only for
# the final check (the binary run in the image's root with chroot).
# deploy/image/Containerfile builds the same content with a standard builder.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(realpath -m "${1:?usage: build.sh OUT.tar [QOSLET_BIN]}")
BIN=$(realpath "${2:-$REPO/target/release/qoslet}")
[ -x "$BIN" ] || { echo "no qoslet binary at $BIN: cargo build --release --locked -p qoslet" >&2; exit 1; }
log() { echo "[image] $*" >&2; }
. "$HERE/oci.sh"

VERSION=$(awk -F'"' '/^\[workspace.package\]/{p=1} p && /^version = /{print $2; exit}' "$REPO/Cargo.toml")
LICENSE=$(awk -F'"' '/^\[workspace.package\]/{p=1} p && /^license = /{print $2; exit}' "$REPO/Cargo.toml")
NAME=${QOSLET_IMAGE_NAME:-ghcr.io/qoslet/qoslet}:$VERSION
# the commit (marked -dirty when the tree has changes: then the label says so) and its
# time, which every mtime and "created" take; without git, SOURCE_DATE_EPOCH must say it
REVISION=$(git -C "$REPO" describe --always --dirty --abbrev=40 2>/dev/null || echo unknown)
OCI_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || true)}
[ -n "$OCI_EPOCH" ] || { echo "no git commit to date the image: set SOURCE_DATE_EPOCH" >&2; exit 1; }
export LC_ALL=C TZ=UTC
SOURCE=https://github.com/qoslet/qoslet
UID_NONROOT=65532

W=$(mktemp -d "${TMPDIR:-/tmp}/qoslet-image.XXXXXX")
trap 'rm -rf "$W"' EXIT
cd "$W"
umask 022

# 1. the Debian packages, downloaded (not installed) from this machine's apt sources: the
#    C libraries at the versions installed here (the binary was linked against them; the
#    candidate when the mirror no longer has that one), the newest CA certificates, and
#    the package holding libgcc's copyright at libgcc's version. Their versions are in the
#    image's history: with the binary and the commit, they are the build's inputs.
installed() { # package: the installed version when downloadable, else the candidate
  local v; v=$(dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true)
  if [ -n "$v" ] && apt-cache show "$1=$v" >/dev/null 2>&1; then echo "$1=$v"; else echo "$1"; fi
}
download() { # packages...
  (cd debs && apt-get -q -o APT::Sandbox::User=root download "$@" >/dev/null 2>../apt.log) \
    || { apt-get update -q >/dev/null 2>&1 || true
         (cd debs && apt-get -q -o APT::Sandbox::User=root download "$@" >/dev/null 2>../apt.log) \
           || { cat apt.log >&2; exit 1; }; }
}
mkdir debs
PKGS=("$(installed libc6)" "$(installed libgcc-s1)" ca-certificates)
download "${PKGS[@]}"
# libgcc-s1's doc directory is a link to its gcc-NN-base's, where its licence is
gccbase=$(dpkg-deb --fsys-tarfile debs/libgcc-s1_*.deb | tar -tvf - ./usr/share/doc/libgcc-s1 2>/dev/null \
  | sed -n 's/.* -> \(gcc-[0-9]*-base\)$/\1/p')
[ -n "$gccbase" ] || { echo "cannot tell libgcc-s1's gcc-NN-base" >&2; exit 1; }
download "$gccbase=$(dpkg-deb -f debs/libgcc-s1_*.deb Version)"
DEBS=()
for f in debs/*.deb; do
  name=$(dpkg-deb -f "$f" Package)
  DEBS+=("$name $(dpkg-deb -f "$f" Version)"); log "$name $(dpkg-deb -f "$f" Version)"
  mkdir -p "x/$name"; dpkg-deb -x "$f" "x/$name"
done

# 2. the root filesystem
R=rootfs
mkdir -p $R/usr/bin $R/etc/ssl/certs $R/proc $R/sys $R/dev $R/run
install -m 0755 "$BIN" $R/usr/bin/qoslet
# what the binary needs, by ELF (its interpreter and NEEDED libraries, theirs in turn),
# at the paths the packages give them
find_lib() { # soname -> path inside x/<pkg>
  find x -path '*/x86_64-linux-gnu/*' -name "$1" \( -type f -o -type l \) | head -1
}
copy_lib() { # path inside x/<pkg>, and what a symlink points at
  local src=$1 rel
  rel=${src#x/*/}
  [ -e "$R/$rel" ] && return 0
  mkdir -p "$R/$(dirname "$rel")"
  cp -a "$src" "$R/$rel"
  if [ -L "$src" ]; then
    local t; t=$(readlink "$src")
    case "$t" in
      /*) copy_lib "${src%/"$rel"}$t" ;; # absolute: within the same package
      *) copy_lib "$(dirname "$src")/$t" ;;
    esac
  fi
}
todo=("$R/usr/bin/qoslet"); seen=" "
interp=$(readelf -l "$BIN" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
[ -n "$interp" ] || { echo "$BIN has no ELF interpreter (static?): this script is for a glibc build" >&2; exit 1; }
while [ ${#todo[@]} -gt 0 ]; do
  f=${todo[0]}; todo=("${todo[@]:1}")
  for so in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p') $(basename "$interp"); do
    case "$seen" in *" $so "*) continue ;; esac
    seen="$seen$so "
    src=$(find_lib "$so"); [ -n "$src" ] || { echo "$so (needed by $(basename "$f")) is in none of: ${PKGS[*]}" >&2; exit 1; }
    copy_lib "$src"
    todo+=("$R/${src#x/*/}")
  done
done
# the interpreter at the path the binary names (/lib64/ld-linux-x86-64.so.2): libc6 ships
# it there on bookworm (a link); where a release ships it elsewhere (/usr/lib64 on a
# merged-/usr one), a link to the loader copied above
if [ ! -e "$R$interp" ]; then
  src=$(find x/libc6 -path "*$interp" | head -1)
  [ -n "$src" ] && copy_lib "$src"
fi
if [ ! -e "$R$interp" ]; then
  loader=$(cd $R && find . -name "$(basename "$interp")" -type f | head -1)
  [ -n "$loader" ] || { echo "the interpreter $interp is not in libc6" >&2; exit 1; }
  mkdir -p "$R$(dirname "$interp")"; ln -s "/${loader#./}" "$R$interp"
fi
# CA certificates: one bundle at the path rustls and OpenSSL look first, concatenated in
# the order update-ca-certificates uses (the names in /etc/ca-certificates.conf: sorted)
# (each ends in a newline, as update-ca-certificates makes sure)
find x/ca-certificates/usr/share/ca-certificates -name '*.crt' | sort \
  | while read -r c; do sed -e '$a\' "$c"; done > $R/etc/ssl/certs/ca-certificates.crt
[ -s $R/etc/ssl/certs/ca-certificates.crt ] || { echo "no CA certificates in ca-certificates" >&2; exit 1; }
# each package's copyright (libgcc-s1's is its gcc-NN-base's)
for p in libc6 "$gccbase" ca-certificates; do
  mkdir -p "$R/usr/share/doc/$p"; cp "x/$p/usr/share/doc/$p/copyright" "$R/usr/share/doc/$p/"
done
# root and the default user (65532), the name service's order: the files the
# Containerfile copies too
install -m 0644 "$REPO"/deploy/image/rootfs/etc/{passwd,group,nsswitch.conf} $R/etc/
grep -q ":$UID_NONROOT:$UID_NONROOT:" $R/etc/passwd || { echo "deploy/image/rootfs/etc/passwd lacks uid $UID_NONROOT" >&2; exit 1; }

# the binary runs in this root (what it links against is all here)
if [ "$(id -u)" = 0 ]; then
  got=$(chroot $R /usr/bin/qoslet --version 2>&1) || { echo "qoslet does not run in the image's root: $got" >&2; exit 1; }
  log "in the image: $got"
fi

# 3. the layer, the image, the archive
oci_layer $R
labels=$(printf '"org.opencontainers.image.title":"qoslet","org.opencontainers.image.description":"Kubernetes node agent: latency-sensitive and best-effort pods on the same nodes","org.opencontainers.image.source":"%s","org.opencontainers.image.version":"%s","org.opencontainers.image.revision":"%s","org.opencontainers.image.licenses":"%s","org.opencontainers.image.created":"%s"' \
  "$SOURCE" "$VERSION" "$REVISION" "$LICENSE" "$(oci_created)")
pkgs=$(printf '%s, ' "${DEBS[@]}")
config=$(printf '{"architecture":"amd64","os":"linux","created":"%s","config":{"User":"%s:%s","Env":["PATH=/usr/bin"],"Entrypoint":["/usr/bin/qoslet"],"WorkingDir":"/","Labels":{%s}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"integration/image/build.sh: qoslet %s and %s"}]}' \
  "$(oci_created)" $UID_NONROOT $UID_NONROOT "$labels" "$LAYER_DIFFID" "$(oci_created)" "$VERSION" "${pkgs%, }")
desc=$(oci_image "$NAME" "$config" "{$labels}")
oci_archive "$OUT" "$desc"
digest=$(echo "$desc" | sed 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/')
log "built $OUT: $NAME@$digest ($(stat -c %s "$OUT") bytes; the layer $LAYER_SIZE bytes compressed)"
echo "$NAME@$digest"
