#!/bin/sh
# Installs what building, running and testing gpuhook needs on Debian/Ubuntu (as root).
# Idempotent. `deps.sh` for the demo; `deps.sh full` adds packaging, lint and fuzz tools.
set -eu
export PATH="$HOME/.cargo/bin:$PATH"
pkgs="libvirt-daemon libvirt-daemon-driver-lxc libvirt-clients libvirt-dev pkg-config hwdata util-linux file gzip"
if [ "${1:-}" = full ]; then
    pkgs="$pkgs rpm lintian rpmlint hyperfine valgrind dpkg-dev podman runc crun conmon busybox-static docker.io containerd gcc libc6-dev prometheus python3-venv strace"
fi
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "deps: installing$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# libvirtd's QEMU driver (always loaded) refuses to start without these accounts.
getent group kvm >/dev/null || groupadd -r kvm
getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
getent passwd libvirt-qemu >/dev/null || useradd -r -g kvm -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
if [ "${1:-}" = full ]; then
    for tool in cargo-deb@3.8.0 cargo-generate-rpm@0.21.1 cargo-fuzz@0.13.2; do
        name=${tool%@*}
        command -v "$name" >/dev/null 2>&1 || cargo install --locked --quiet "$tool"
    done
fi
