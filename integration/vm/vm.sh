#!/usr/bin/env bash
# The VM test bed: a real cgroup v2 + systemd node (Debian trixie: systemd 257,
# kernel 6.12, containerd 1.7 with NRI and SystemdCgroup = true; beside it Debian
# sid's containerd 2.1 with NRI v0.8, the same way) in QEMU, for the tests that
# need what this host's cgroup v1 without systemd cannot give.
#
#   vm.sh setup          host packages (mmdebstrap, QEMU 10 from bookworm-backports,
#                        extracted with a private APT config; /etc/apt is never touched)
#   vm.sh image          the guest image, built from Debian packages only and cached by
#                        the hash of its inputs (this script, guest/, the test images)
#   vm.sh boot           boots it (KVM when /dev/kvm takes a stock kernel, else TCG: the
#                        log says which), shares SHARE (default: the repository) at the
#                        same path in the guest, waits for SSH and containerd
#   vm.sh run CMD...     runs CMD in the guest as root: its output and exit status; a
#                        command over VM_CMD_TIMEOUT (600 s) or a guest that died is reported
#   vm.sh down           powers the guest off (killed by its pid after 60 s)
#   vm.sh console        the guest's serial console so far
#
# Environment: QOSLET_VM_CACHE (/var/cache/qoslet-vm: QEMU, images), QOSLET_VM_RUN
# (/tmp/qoslet-vm: pid, console, ssh config; one per VM), VM_SSH_PORT (a free one),
# VM_SMP (2), VM_MEM (2048 MiB), VM_ACCEL (auto|kvm|tcg), SHARE (shared read-only),
# QOSLET_VM_MIRROR (a Debian mirror; default: the one this machine's apt uses).
# Every wait is bounded: a guest that crashed or hangs is reported, never waited on.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${QOSLET_VM_CACHE:-/var/cache/qoslet-vm}
RUN=${QOSLET_VM_RUN:-/tmp/qoslet-vm}
PORT=${VM_SSH_PORT:-}
SUITE=trixie
export DEBIAN_FRONTEND=noninteractive
log() { echo "[vm] $*" >&2; }
die() { echo "[vm] error: $*" >&2; exit 1; }

mirror() {
  # the machine's own Debian mirror (its apt sources: the entry that serves Debian's
  # main suites, not a security or third-party one)
  local m=${QOSLET_VM_MIRROR:-}
  [ -n "$m" ] && { echo "$m"; return; }
  m=$(awk '/^URIs:/{u=$2} /^Suites:/{ if (u != "" && $0 ~ /(bookworm|trixie|stable)( |$)/) {print u; exit} }' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$m" ] || m=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$m" ] || m=$(awk '$1=="deb"{for(i=2;i<=NF;i++) if($i ~ /^https?:/){print $i; exit}}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$m" ] || die "no Debian mirror in the apt sources"
  echo "$m"
}

# a private APT configuration: NAME, then its sources.list lines
private_apt() {
  local d=$CACHE/apt-$1
  mkdir -p "$d"/{lists/partial,cache/archives/partial,etc/preferences.d}
  touch "$d/status"
  printf '%s\n' "${@:2}" > "$d/sources.list"
  cat > "$d/apt.conf" <<EOF
Dir::Etc::SourceList "$d/sources.list";
Dir::Etc::SourceParts "/nonexistent";
Dir::Etc::Preferences "$d/etc/preferences";
Dir::Etc::PreferencesParts "$d/etc/preferences.d";
Dir::State::Lists "$d/lists";
Dir::State::status "$d/status";
Dir::Cache "$d/cache";
Dir::Cache::archives "$d/cache/archives";
APT::Sandbox::User "root";
EOF
  APT_CONFIG=$d/apt.conf apt-get update -q >/dev/null
  echo "$d/apt.conf"
}

QEMU_DIR=$CACHE/qemu10
qemu() { "$QEMU_DIR/usr/bin/qemu-system-x86_64" -L "$QEMU_DIR/usr/share/seabios" -L "$QEMU_DIR/usr/share/qemu" "$@"; }

cmd_setup() {
  mkdir -p "$CACHE"
  local need=()
  for p in mmdebstrap e2fsprogs zstd openssh-client libcapstone4 libfdt1 libpmem1 librdmacm1 \
           libibverbs1 libslirp0 libvdeplug2 libaio1 liburing2 libpixman-1-0 libglib2.0-0 libnuma1 bc qemu-utils; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    log "apt: ${need[*]}"
    apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null; apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null; }
  fi
  # QEMU 10 from bookworm-backports, extracted: bookworm's 7.2 has an MTTCG bug that kills
  # the guest when a static key flips (the first cpu.max quota), and installing it would
  # remove the machine's qemu-utils 10
  if [ ! -x "$QEMU_DIR/usr/bin/qemu-system-x86_64" ]; then
    local K=/usr/share/keyrings/debian-archive-keyring.gpg apt d
    apt=$(private_apt bpo "deb [signed-by=$K] $(mirror) bookworm-backports main")
    d=$(mktemp -d "$CACHE/debs.XXXXXX")
    (cd "$d" && APT_CONFIG=$apt apt-get download -q qemu-system-x86 qemu-system-common \
        qemu-system-data seabios/bookworm-backports >"$d/download.log" 2>&1) \
      || { cat "$d/download.log" >&2; die "cannot download QEMU from bookworm-backports"; }
    rm -rf "$QEMU_DIR.new"; mkdir -p "$QEMU_DIR.new"
    for f in "$d"/*.deb; do dpkg-deb -x "$f" "$QEMU_DIR.new"; done
    rm -rf "$d" "$QEMU_DIR"; mv "$QEMU_DIR.new" "$QEMU_DIR"
  fi
  # the debs were unpacked without their dependencies: say which library is missing
  local missing
  missing=$(ldd "$QEMU_DIR/usr/bin/qemu-system-x86_64" | awk '/not found/{print $1}' | tr '\n' ' ')
  [ -z "$missing" ] || die "QEMU lacks libraries on this machine: $missing(install their Debian packages)"
  log "$(qemu --version | head -1)"
}

# the image's inputs: what changes them changes the image (the recipe is this
# script's cmd_image, as bash prints it back: comments and the rest of the script aside;
# testbed.sh picks the containerd 2.1 it takes). The Debian archive moves on too (point
# releases, sid's containerd): the month is an input, so an image is at most a month old.
image_hash() {
  { echo "$SUITE"; date -u +%Y-%m; declare -f cmd_image
    cat "$HERE"/guest/* "$REPO/integration/testbed/build-image.sh" "$REPO/integration/testbed/testbed.sh"; } \
    | sha256sum | cut -c1-16
}
image_dir() { echo "$CACHE/image-$(image_hash)"; }

cmd_image() {
  command -v mmdebstrap >/dev/null || cmd_setup
  mkdir -p "$CACHE"
  # one builder at a time: another run's build (or its removal of older images) waits
  exec 9>"$CACHE/image.lock"
  flock -w 1800 9 || die "another image build holds $CACHE/image.lock for 30 min"
  local out; out=$(image_dir)
  if [ -s "$out/rootfs.img" ] && [ -f "$out/primed" ]; then
    log "image $out (cached)"; return
  fi
  local t0 work root ctd21
  t0=$(date +%s)
  rm -rf "$out"; mkdir -p "$out"
  work=$(mktemp -d "$CACHE/build.XXXXXX"); root=$work/rootfs
  # SSH key of the test bed (private to root)
  ssh-keygen -q -t ed25519 -N '' -C qoslet-vm -f "$out/id_ed25519"
  WORK=$work "$REPO/integration/testbed/build-image.sh" "$work/testbed.oci.tar" >/dev/null
  # Debian sid's containerd 2.1 (NRI v0.8), extracted as the host's test bed takes it,
  # unpacked at /opt/containerd-2.1 with a service of its own (installing the package
  # would replace trixie's 1.7)
  ctd21=$(CONTAINERD=2.1 "$REPO/integration/testbed/testbed.sh" containerd-pkg)
  log "containerd 2.1 from sid: $("$ctd21/usr/bin/containerd" --version | cut -d" " -f3)"
  log "mmdebstrap $SUITE (systemd, linux-image-amd64, containerd, runc, CNI plugins)"
  nice -n 10 mmdebstrap --variant=apt --mode=root --quiet \
    --include=systemd,systemd-sysv,udev,dbus,kmod,iproute2,procps,openssh-server,containerd,runc,containernetworking-plugins,linux-image-amd64,initramfs-tools,zstd,e2fsprogs,python3,apparmor \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='echo qoslet-vm > "$1/etc/hostname"; echo "127.0.1.1 qoslet-vm" >> "$1/etc/hosts"' \
    --customize-hook='printf "/dev/vda / ext4 defaults,noatime 0 1\n" > "$1/etc/fstab"' \
    --customize-hook='printf "[Match]\nName=en*\n[Network]\nDHCP=yes\n" > "$1/etc/systemd/network/20-wired.network"; chroot "$1" systemctl enable systemd-networkd >/dev/null 2>&1' \
    --customize-hook='mkdir -p -m700 "$1/root/.ssh"; cp '"$out"'/id_ed25519.pub "$1/root/.ssh/authorized_keys"; printf "UseDNS no\n" > "$1/etc/ssh/sshd_config.d/qoslet-vm.conf"' \
    --customize-hook='for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer dpkg-db-backup.timer systemd-timesyncd.service; do chroot "$1" systemctl mask $u >/dev/null 2>&1 || true; done' \
    --customize-hook='printf "MODULES=list\nCOMPRESS=zstd\n" > "$1/etc/initramfs-tools/conf.d/qoslet-vm.conf"; printf "virtio_pci\nvirtio_blk\next4\n9p\n9pnet_virtio\n" >> "$1/etc/initramfs-tools/modules"; chroot "$1" update-initramfs -u -k all >/dev/null 2>&1' \
    --customize-hook='mkdir -p "$1/root/images"; cp '"$work"'/testbed.oci.tar "$1/root/images/"' \
    --customize-hook='mkdir -p "$1/opt/containerd-2.1" "$1/etc/containerd21"; cp -a '"$ctd21"'/usr "$1/opt/containerd-2.1/"; cp '"$HERE"'/guest/containerd21.toml "$1/etc/containerd21/config.toml"; cp '"$HERE"'/guest/containerd21.service "$1/etc/systemd/system/"; chroot "$1" systemctl enable containerd21.service >/dev/null 2>&1' \
    --customize-hook='cp '"$HERE"'/guest/config.toml "$1/etc/containerd/config.toml"; cp '"$HERE"'/guest/qoslet-vm-images.service "$1/etc/systemd/system/"; chroot "$1" systemctl enable qoslet-vm-images.service >/dev/null 2>&1; mkdir -p "$1/etc/cni/net.d" "$1/opt/nri/plugins" "$1/etc/nri/conf.d"; cp '"$HERE"'/guest/10-qoslet-vm.conflist "$1/etc/cni/net.d/"' \
    --customize-hook='cd "$1/usr/lib/modules/"*/kernel && rm -rf sound drivers/gpu drivers/media drivers/net/wireless drivers/infiniband drivers/staging drivers/bluetooth net/wireless net/mac80211 net/bluetooth drivers/iio drivers/hid drivers/input drivers/usb drivers/scsi drivers/ata drivers/mmc drivers/isdn drivers/net/ethernet drivers/md; chroot "$1" depmod -a $(ls "$1/usr/lib/modules")' \
    --customize-hook='cp "$1"/boot/vmlinuz-* '"$out"'/vmlinuz; cp "$1"/boot/initrd.img-* '"$out"'/initrd.img; chroot "$1" apt-get clean; rm -rf "$1"/var/lib/apt/lists/*' \
    "$SUITE" "$root" "$(mirror)" >"$work/mmdebstrap.log" 2>&1 \
    || { tail -30 "$work/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
  nice -n 10 mkfs.ext4 -q -F -L qoslet-vm -d "$root" "$out/rootfs.img" 4G >/dev/null
  rm -rf "$work"
  log "image built in $(( $(date +%s) - t0 )) s; priming boot (imports the test images)"
  # a failed priming boot must not leave QEMU running with the image open
  trap 'cmd_down' EXIT
  PERSIST=1 IMAGE=$out cmd_boot
  cmd_run 'systemctl start qoslet-vm-images.service && ctr -n k8s.io images ls -q | grep -c testbed'
  cmd_down || die "the priming boot did not power off cleanly: the image is not kept"
  trap - EXIT
  touch "$out/primed"
  # older images of this cache are no longer wanted
  for d in "$CACHE"/image-*; do [ "$d" = "$out" ] || rm -rf "$d"; done
  log "image $out ready in $(( $(date +%s) - t0 )) s"
}

# KVM when /dev/kvm runs a stock kernel: not kvm_pvm (software nested virtualisation,
# which needs a PVM guest kernel: a stock one dies in KVM's instruction emulator)
accel() {
  case "${VM_ACCEL:-auto}" in
    kvm|tcg) echo "$VM_ACCEL"; return ;;
  esac
  if [ -e /sys/module/kvm_pvm ]; then echo tcg-pvm; return; fi
  if [ -w /dev/kvm ] && { [ -e /sys/module/kvm_intel ] || [ -e /sys/module/kvm_amd ]; }; then
    echo kvm; return
  fi
  echo tcg
}

ssh_vm() {
  ssh -F "$RUN/ssh_config" vm "$@"
}

# the pid of this run directory's QEMU (its pidfile, checked against the process:
# a stale pidfile's number may be another process by now); empty when none runs
qemu_pid() {
  local p
  p=$(cat "$RUN/qemu.pid" 2>/dev/null) || return 0
  [ -n "$p" ] && tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "qemu-system.*$RUN/qemu.pid" && echo "$p"
  return 0
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cmd_boot() {
  local img=${IMAGE:-$(image_dir)} share=${SHARE:-$REPO} a acc drive t0
  [ -s "$img/rootfs.img" ] || die "no image in $img: run vm.sh image"
  [ -x "$QEMU_DIR/usr/bin/qemu-system-x86_64" ] || cmd_setup
  mkdir -p "$RUN"; chmod 700 "$RUN"
  [ -z "$(qemu_pid)" ] || die "a VM of $RUN runs already (pid $(qemu_pid)): vm.sh down first"
  [ -n "$PORT" ] || PORT=$(free_port)
  a=$(accel)
  case "$a" in
    kvm) acc="-accel kvm -cpu host"; log "accelerator: KVM" ;;
    tcg-pvm) acc="-accel tcg,thread=multi,tb-size=256 -cpu max"; a=tcg
      log "accelerator: TCG (software emulation): /dev/kvm is kvm_pvm, which runs only PVM guest kernels" ;;
    *) acc="-accel tcg,thread=multi,tb-size=256 -cpu max"; log "accelerator: TCG (software emulation): no usable /dev/kvm" ;;
  esac
  echo "$a" > "$RUN/accel"
  # the guest writes to an overlay of its own (the image never changes), kept across a
  # reboot of the guest (vm.sh reboot: KEEP_DISK=1), fresh at every other boot;
  # PERSIST=1 writes to the image itself
  if [ "${PERSIST:-0}" = 1 ]; then
    drive="file=$img/rootfs.img,format=raw"
  else
    if [ "${KEEP_DISK:-0}" != 1 ] || [ ! -s "$RUN/disk.qcow2" ]; then
      rm -f "$RUN/disk.qcow2"
      qemu-img create -q -f qcow2 -b "$img/rootfs.img" -F raw "$RUN/disk.qcow2" || die "cannot create the guest's overlay disk"
    fi
    drive="file=$RUN/disk.qcow2,format=qcow2"
  fi
  cp "$img/id_ed25519" "$RUN/id_ed25519"; chmod 600 "$RUN/id_ed25519"
  cat > "$RUN/ssh_config" <<EOF
Host vm
  HostName 127.0.0.1
  Port $PORT
  User root
  IdentityFile $RUN/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  ConnectTimeout 5
  ServerAliveInterval 10
  ServerAliveCountMax 3
EOF
  rm -f "$RUN/console.log" "$RUN/qemu.pid" "$RUN/mon.sock"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  qemu $acc -smp "${VM_SMP:-2}" -m "${VM_MEM:-2048}" -machine q35 \
    -display none -no-reboot -daemonize -pidfile "$RUN/qemu.pid" \
    -serial "file:$RUN/console.log" -monitor "unix:$RUN/mon.sock,server,nowait" \
    -kernel "$img/vmlinuz" -initrd "$img/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 psi=1 panic=-1 quiet" \
    -drive "$drive,if=virtio,cache=unsafe" \
    -netdev "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:$PORT-:22" -device virtio-net-pci,netdev=n0,romfile= \
    -virtfs "local,path=$share,mount_tag=share,security_model=none,readonly=on,id=share" \
    -device virtio-rng-pci 9>&-
  local pid; pid=$(cat "$RUN/qemu.pid")
  local deadline=$(( SECONDS + ${VM_BOOT_TIMEOUT:-240} ))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if timeout 10 ssh -F "$RUN/ssh_config" vm true 2>/dev/null; then
      echo "$(echo "$(date +%s.%N) - $t0" | bc)" > "$RUN/boot-seconds"
      log "guest up (SSH) after $(cat "$RUN/boot-seconds") s, qemu pid $pid ($a)"
      # the share at the same path as on the host, so test binaries find their files
      timeout 60 ssh -F "$RUN/ssh_config" vm "mkdir -p '$share' && mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=262144 share '$share'" \
        || die "cannot mount the share in the guest (within 60 s)"
      echo "$share" > "$RUN/share"
      timeout 90 ssh -F "$RUN/ssh_config" vm 'for i in $(seq 1 60); do [ -S /run/containerd/containerd.sock ] && [ -S /run/containerd21/containerd.sock ] && exit 0; sleep 1; done; exit 1' \
        || die "containerd (1.7 and 2.1) did not start in the guest"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { tail -30 "$RUN/console.log" >&2; die "qemu died while booting"; }
    sleep 1
  done
  tail -30 "$RUN/console.log" >&2
  kill "$pid" 2>/dev/null || true
  die "the guest did not answer SSH within ${VM_BOOT_TIMEOUT:-240} s (killed)"
}

cmd_run() {
  local pid rc=0; pid=$(qemu_pid)
  [ -n "$pid" ] || { tail -30 "$RUN/console.log" 2>/dev/null >&2; die "no VM runs for $RUN (or its qemu is gone)"; }
  timeout --kill-after=10 "${VM_CMD_TIMEOUT:-600}" ssh -F "$RUN/ssh_config" vm "$*" || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    log "command timed out after ${VM_CMD_TIMEOUT:-600} s: $*"
    tail -20 "$RUN/console.log" >&2
  elif [ "$rc" = 255 ]; then
    # ssh's own failure: a guest that crashed or hangs
    if ! kill -0 "$pid" 2>/dev/null; then log "the guest died (qemu gone)"; fi
    if ! timeout 15 ssh -F "$RUN/ssh_config" vm true 2>/dev/null; then log "the guest does not answer SSH"; tail -30 "$RUN/console.log" >&2; fi
  fi
  return "$rc"
}

# A reboot of the guest, as a node reboots: systemd stops everything and the kernel
# restarts; QEMU (-no-reboot) ends there, and the guest boots again on the same disk.
cmd_reboot() {
  local pid t0; pid=$(qemu_pid); t0=$(date +%s)
  [ -n "$pid" ] || die "no VM runs for $RUN"
  timeout 15 ssh -F "$RUN/ssh_config" vm 'systemctl reboot' >/dev/null 2>&1 || true
  for _ in $(seq 1 90); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then
    tail -20 "$RUN/console.log" >&2
    kill "$pid" 2>/dev/null || true
    die "the guest did not go down for its reboot within 90 s (killed)"
  fi
  rm -f "$RUN/qemu.pid"
  log "guest went down for a reboot in $(( $(date +%s) - t0 )) s"
  KEEP_DISK=1 cmd_boot
}

cmd_down() {
  local pid t0; pid=$(qemu_pid); t0=$(date +%s)
  [ -n "$pid" ] || { rm -f "$RUN/qemu.pid"; return 0; }
  timeout 15 ssh -F "$RUN/ssh_config" vm 'systemctl poweroff' >/dev/null 2>&1 || true
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$RUN/qemu.pid"; log "powered off in $(( $(date +%s) - t0 )) s"; return 0; }
    sleep 1
  done
  kill "$pid" 2>/dev/null || true; sleep 1; kill -9 "$pid" 2>/dev/null || true
  rm -f "$RUN/qemu.pid"; log "the guest did not power off within 60 s: killed"
  return 1
}

case "${1:-}" in
  setup) cmd_setup ;;
  image) cmd_image ;;
  boot) cmd_boot ;;
  run) shift; cmd_run "$@" ;;
  down) cmd_down ;;
  reboot) cmd_reboot ;;
  console) cat "$RUN/console.log" ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac
