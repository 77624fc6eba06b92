#!/bin/sh
# A minimal Debian 12 (bookworm) root with systemd and dbus, for tests/systemd.rs to boot
# under systemd-nspawn: debootstrapped once into /var/cache/gpuhook-tests/systemd-root
# (or $1), reused while its stamp file says it is complete. From the machine's own Debian
# mirror (the first deb URI of /etc/apt/sources.list*). Root only. Prints the root's path.
# runc and gpuhook are not installed in it: the test bind-mounts the host's.
set -eu
root=${1:-/var/cache/gpuhook-tests/systemd-root}
suite=bookworm
stamp=$root/.gpuhook-systemd-root
want="debootstrap $suite minbase +systemd,systemd-sysv,dbus v1"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "$root"
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "systemd-root: must run as root" >&2; exit 1; }
missing=""
command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
command -v systemd-nspawn >/dev/null 2>&1 || missing="$missing systemd-container"
if [ -n "$missing" ]; then
    echo "systemd-root: installing$missing" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# The mirror this machine uses: deb822 `URIs:` of a `Types: deb` stanza, or a one-line `deb URI`.
mirror=$(
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && awk '
            /^Types:/ { deb = ($0 ~ /(^|[ \t])deb([ \t]|$)/) }
            /^URIs:/ && deb && $2 ~ /debian\/?$/ { print $2; exit }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] && awk '$1 == "deb" && $2 !~ /^\[/ && $2 ~ /debian\/?$/ { print $2; exit }
            $1 == "deb" && $2 ~ /^\[/ { for (i = 3; i <= NF; i++) if ($i ~ /debian\/?$/) { print $i; exit } }' "$f"
    done
    true
)
mirror=$(echo "$mirror" | head -n1)
mirror=${mirror:-http://deb.debian.org/debian}
echo "systemd-root: debootstrap $suite from $mirror into $root" >&2
rm -rf "$root.tmp"
mkdir -p "$(dirname "$root")"
debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus "$suite" "$root.tmp" "$mirror" >&2 ||
    { echo "systemd-root: debootstrap failed (log: $root.tmp/debootstrap/debootstrap.log)" >&2; exit 1; }
# No network, no getty on a console nobody reads, no first-boot questions: a quick boot.
echo gpuhook-systemd >"$root.tmp/etc/hostname"
: >"$root.tmp/etc/machine-id"
ln -sf /dev/null "$root.tmp/etc/systemd/system/console-getty.service"
ln -sf /dev/null "$root.tmp/etc/systemd/system/systemd-firstboot.service"
rm -rf "$root.tmp/var/cache/apt/archives/"*.deb "$root.tmp/var/lib/apt/lists/"* 2>/dev/null || true
rm -rf "$root"
mv "$root.tmp" "$root"
echo "$want" >"$stamp"
echo "$root"
