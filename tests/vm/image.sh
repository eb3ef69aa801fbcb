#!/usr/bin/env bash
# Builds, from Debian's packages only, a Debian 12 guest for ARCH (amd64,
# arm64, armhf) and prints the dir holding it as its last line:
#   DIR/root.raw       ext4 root file system (sparse); runs use an overlay
#   DIR/vmlinuz, DIR/initrd.img   Debian's kernel and its initramfs
#   DIR/id_ed25519     the key root logs in with over ssh (lab only)
# Cached under $KINGLET_VM_CACHE (default /var/cache/kinglet/vm), keyed by
# this script and the arch: a second call returns at once.
#
# The guest is what a user's board runs: systemd, udev, cgroup v2 only
# (Debian 12's default), networkd with the lab's static address, sshd,
# containerd and runc (for --runtime cri), the CNI plugins and iptables
# (kinglet's .deb recommends them). kinglet itself is not in the image:
# each run installs the project's own .deb (tests/vm/run.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
arch=${1:?usage: image.sh amd64|arm64|armhf}
vm_arch_settings "$arch"
key=$( (cat "$here/image.sh"; echo "$arch $VM_KERNEL_PKG") | sha256sum | cut -c1-16)
dir=$VM_CACHE/$arch-bookworm-$key
if [ -s "$dir/root.raw" ] && [ -s "$dir/vmlinuz" ]; then
  echo "$dir"
  exit 0
fi
"$here/../apt-need.sh" mmdebstrap arch-test qemu-utils e2fsprogs openssh-client qemu-user-static
[ "$arch" = amd64 ] || vm_binfmt "$arch"
mkdir -p "$VM_CACHE"
work=$(mktemp -d "$VM_CACHE/.build-$arch.XXXXXX")
trap 'rm -rf "$work"' EXIT
ssh-keygen -q -t ed25519 -N '' -C kinglet-vm-lab -f "$work/id_ed25519"

# Only what the initramfs needs to find a virtio root (MODULES=most makes
# a 30 MB initrd; qemu-user builds it for minutes on the foreign arches).
essential_hook='mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/usr/share/initramfs-tools/modules.d"
printf "MODULES=list\nCOMPRESS=gzip\n" >"$1/etc/initramfs-tools/conf.d/kinglet-vm"
printf "%s\n" virtio_pci virtio_mmio virtio_blk virtio_net ext4 >"$1/usr/share/initramfs-tools/modules.d/kinglet-vm"'

customize_hook='r=$1
echo kinglet-vm >"$r/etc/hostname"
printf "127.0.0.1 localhost\n127.0.1.1 kinglet-vm\n" >"$r/etc/hosts"
printf "/dev/vda / ext4 defaults,errors=remount-ro 0 1\n" >"$r/etc/fstab"
printf "nameserver %s\n" '"$VM_HOST_IP"' >"$r/etc/resolv.conf"
mkdir -p "$r/etc/systemd/network"
printf "[Match]\nType=ether\n\n[Network]\nAddress=%s/24\nGateway=%s\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n" \
  '"$VM_GUEST_IP"' '"$VM_HOST_IP"' >"$r/etc/systemd/network/10-lab.network"
chroot "$r" systemctl enable systemd-networkd.service ssh.service >/dev/null 2>&1
# Nothing waits for a network that is already configured statically.
chroot "$r" systemctl mask systemd-networkd-wait-online.service >/dev/null 2>&1
# containerd stays off until a run asks for it (--runtime cri).
chroot "$r" systemctl disable containerd.service >/dev/null 2>&1 || true
install -d -m 700 "$r/root/.ssh"
install -m 600 '"$work"'/id_ed25519.pub "$r/root/.ssh/authorized_keys"
# The serial console logs root in: the console log then shows a shell,
# and a human debugging a run can type into it.
mkdir -p "$r/etc/systemd/system/serial-getty@.service.d"
printf "[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --keep-baud 115200,57600,38400,9600 %%I \$TERM\n" \
  >"$r/etc/systemd/system/serial-getty@.service.d/autologin.conf"
cp -L "$r"/boot/vmlinuz-* '"$work"'/vmlinuz
cp -L "$r"/boot/initrd.img-* '"$work"'/initrd.img'

start=$(date +%s)
mmdebstrap --variant=minbase --arch="$arch" \
  --include="systemd,systemd-sysv,udev,dbus,$VM_KERNEL_PKG,initramfs-tools,iproute2,openssh-server,kmod,procps,e2fsprogs,containerd,runc,containernetworking-plugins,iptables,busybox-static,util-linux,less" \
  --aptopt='Acquire::Languages "none"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --essential-hook="$essential_hook" --customize-hook="$customize_hook" \
  bookworm "$work/root" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main" >"$work/mmdebstrap.log" 2>&1 ||
  { tail -n 40 "$work/mmdebstrap.log" >&2; exit 1; }
# A file system image with room for images and pods; sparse on the host.
mkfs.ext4 -q -F -L root -d "$work/root" "$work/root.raw" 4G
rm -rf "$work/root"
echo "image.sh: $arch guest built in $(( $(date +%s) - start )) s" >&2
chmod 755 "$work"
mv "$work" "$dir"
trap - EXIT
echo "$dir"
