#!/bin/sh
# A Debian 13 (trixie) host for tests/debian13: built from Debian's archive once into
# /var/cache/gpuhook-tests/debian13 (or $1) and reused while its stamp says it is complete.
#
#   DIR/root/      the trixie tree (debootstrap + libvirt's LXC driver, podman, crun, runc,
#                  containerd, trixie's kernel and qemu): qemu runs from it (chroot), and
#   DIR/root.img   is made from it (ext4): the VM's root disk, booted with snapshot=on so
#                  every run starts from the same image.
#
# The image starts gpuhook-vm.service when the kernel command line says
# `systemd.wants=gpuhook-vm.service`: it mounts the disk labelled gpuhook-job at /job, runs
# /job/run with its output on the second serial port (ttyS1), and powers the VM off.
# Root only. Prints DIR.
set -eu
dir=${1:-/var/cache/gpuhook-tests/debian13}
suite=trixie
pkgs="libvirt-daemon-system libvirt-daemon-driver-lxc libvirt-daemon-driver-qemu libvirt-clients podman
      crun runc containerd conmon catatonit uidmap linux-image-amd64 qemu-system-x86 seabios pciutils
      busybox-static e2fsprogs iproute2 kmod udev strace rpm ca-certificates python3"
want="debootstrap $suite minbase +systemd,systemd-sysv,dbus; $(echo $pkgs); job v4"
stamp=$dir/stamp
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$dir/root.img" ]; then
    echo "$dir"
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "debian13-image: must run as root" >&2; exit 1; }
for t in debootstrap mke2fs unshare; do
    command -v "$t" >/dev/null 2>&1 || { echo "debian13-image: $t is missing (scripts/deps.sh full)" >&2; exit 1; }
done
mirror=${GPUHOOK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$dir/root.tmp
echo "debian13-image: debootstrap $suite from $mirror into $root" >&2
rm -rf "$root" "$dir/root" "$dir/root.img" "$stamp"
mkdir -p "$dir"
debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus "$suite" "$root" "$mirror" >&2 ||
    { echo "debian13-image: debootstrap failed (log: $root/debootstrap/debootstrap.log)" >&2; exit 1; }
# Install without starting services in the chroot.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
echo "debian13-image: apt-get install $(echo $pkgs)" >&2
# shellcheck disable=SC2086
unshare -m sh -c '
    set -e
    root=$1; shift
    mount --rbind /dev "$root/dev"
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    chroot "$root" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends "$@"
' sh "$root" $pkgs >"$dir/apt.log" 2>&1 ||
    { tail -n 30 "$dir/apt.log" >&2; echo "debian13-image: apt-get install failed (log: $dir/apt.log)" >&2; exit 1; }
rm -f "$root/usr/sbin/policy-rc.d"
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
# apt's cache of the installed packages, made here (native speed) rather than by the VM's
# first apt-get (software emulation).
chroot "$root" apt-cache gencaches >/dev/null

# A quick, quiet boot: no getty, no network wait, no first-boot questions.
echo debian13 >"$root/etc/hostname"
printf '127.0.0.1 localhost debian13\n' >"$root/etc/hosts"
printf 'LABEL=root / ext4 rw,errors=remount-ro 0 1\n' >"$root/etc/fstab"
: >"$root/etc/machine-id"
for u in serial-getty@ttyS0.service getty@tty1.service systemd-firstboot.service \
         apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
    ln -sf /dev/null "$root/etc/systemd/system/$u"
done
# podman --userns=auto takes its ranges from the user `containers` in /etc/subuid, subgid.
echo 'containers:200000:1000000' >"$root/etc/subuid"
echo 'containers:200000:1000000' >"$root/etc/subgid"
cat >"$root/usr/local/sbin/gpuhook-vm-job" <<'EOF'
#!/bin/sh
# Runs the test job of the disk labelled gpuhook-job (made by tests/debian13 for each run).
echo "GPUHOOK-VM: booted $(uname -r)"
mkdir -p /job
if ! mount LABEL=gpuhook-job /job; then
    echo "GPUHOOK-VM: FAIL no job disk"
    exit 1
fi
/job/run
echo "GPUHOOK-VM: job exited $?"
sync
umount /job || true
EOF
chmod 755 "$root/usr/local/sbin/gpuhook-vm-job"
cat >"$root/etc/systemd/system/gpuhook-vm.service" <<'EOF'
[Unit]
Description=gpuhook test job (tests/debian13)
After=multi-user.target
Wants=multi-user.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpuhook-vm-job
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS1
TimeoutStartSec=infinity
ExecStopPost=/bin/systemctl poweroff --no-block
EOF
mkdir -p "$root/vm/cache" "$root/vm/run"

echo "debian13-image: ext4 image" >&2
ls "$root"/boot/vmlinuz-* "$root"/boot/initrd.img-* >/dev/null ||
    { echo "debian13-image: no kernel in $root/boot" >&2; exit 1; }
# mke2fs says "Creating regular file" on stdout even with -q: stdout is the path alone.
mke2fs -q -t ext4 -L root -d "$root" "$dir/root.img.tmp" 4G >&2
mv "$root" "$dir/root"
mv "$dir/root.img.tmp" "$dir/root.img"
echo "$want" >"$stamp"
echo "$dir"
