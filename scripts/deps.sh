#!/bin/sh
# Installs what building, running and testing gpuhook needs on Debian/Ubuntu (as root).
# Idempotent. `deps.sh` for the demo; `deps.sh full` adds packaging, lint and fuzz tools.
set -eu
export PATH="$HOME/.cargo/bin:$PATH"
pkgs="libvirt-daemon libvirt-daemon-driver-lxc libvirt-daemon-driver-qemu libvirt-clients libvirt-dev pkg-config hwdata util-linux file gzip"
if [ "${1:-}" = full ]; then
    # debootstrap, systemd-container: tests/systemd.rs boots systemd (scripts/systemd-root.sh).
    # iptables, nftables: tests/health.rs has netfilter's LOG target write forged Xid records
    # (testbed/scripts/netfilter-xid-records).
    pkgs="$pkgs rpm lintian rpmlint hyperfine valgrind dpkg-dev podman runc crun conmon busybox-static docker.io containerd gcc libc6-dev prometheus python3-venv strace bats jq gawk debootstrap systemd-container iptables nftables"
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
    # scripts/field-suites.sh: the sources of the installed podman and runc (their bats
    # suites), from deb-src lines for the archive the deb lines name.
    src=/var/cache/gpuhook-field-suites
    for b in podman runc; do
        sp=$(dpkg-query -W -f='${source:Package}' "$b") && sv=$(dpkg-query -W -f='${source:Version}' "$b")
        dir=$src/$sp-$(v=${sv#*:} && echo "${v%-*}")
        [ -d "$dir" ] && continue
        if ! apt-cache showsrc "$sp=$sv" 2>/dev/null | grep -q '^Package:'; then
            for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/ubuntu.sources; do
                [ -f "$f" ] && sed 's/^Types: deb$/Types: deb-src/' "$f" >/etc/apt/sources.list.d/gpuhook-deb-src.sources
            done
            if [ -f /etc/apt/sources.list ] && grep -q '^deb ' /etc/apt/sources.list; then
                sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >/etc/apt/sources.list.d/gpuhook-deb-src.list
            fi
            apt-get update -qq
        fi
        mkdir -p "$src" && (cd "$src" && apt-get source -qq "$sp=$sv" >/dev/null 2>&1) ||
            { echo "deps: apt-get source $sp=$sv failed" >&2; exit 1; }
        [ -d "$dir" ] || { echo "deps: no $dir after apt-get source" >&2; exit 1; }
    done
    # tests/qemu.rs: the distribution's qemu-system-x86_64 (and SeaBIOS), unpacked into
    # /var/cache/gpuhook-tests/qemu, not installed (on Debian 12 with backports' qemu-utils,
    # installing bookworm's qemu-system-x86 would remove it). Reused while its stamp holds.
    "$(dirname "$0")/qemu-unpacked.sh" >/dev/null
    for tool in cargo-deb@3.8.0 cargo-generate-rpm@0.21.1 cargo-fuzz@0.13.2; do
        name=${tool%@*}
        command -v "$name" >/dev/null 2>&1 || cargo install --locked --quiet "$tool"
    done
fi
