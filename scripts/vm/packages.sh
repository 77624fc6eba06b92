#!/bin/sh
# The packages as an operator meets them, run INSIDE the Debian 13 VM of tests/debian13 (it
# installs into the machine's /usr and /etc; never run it on a machine you care about).
#   packages.sh deb|rpm PKGDIR TESTBED
# PKGDIR holds gpuhook-1.deb, gpuhook-2.deb (the next revision), gpuhook-1.rpm, gpuhook-2.rpm
# and evil.so (an LD_PRELOAD probe); TESTBED is gpuhook-testbed (fake hosts).
# deb: install with apt, files/links/units/conffile, the static hook ignores LD_PRELOAD, the
# installed LXC and QEMU hooks reserve on a fake host, upgrade keeps config, hooks and live
# reservations, remove takes the hooks away, purge removes the config, foreign hooks are left
# alone (gpuhook goes to lxc.d and qemu.d beside them).
# rpm: the same with rpm itself (its scripts make the hook and the runtime link), release 2
# upgrade, erase (a changed config kept as .rpmsave). Each leaves the package removed.
set -eu
kind=$1 pkgs=$2 testbed=$3
work=/var/tmp/gpuhook-packages-$kind
step() { printf '\n== %s (%s)\n' "$*" "$(date +%T)"; }
fail() { echo "packages.sh $kind: FAIL: $*" >&2; exit 1; }
units="gpuhook-reconcile.service gpuhook-reconcile.timer gpuhook-metrics.service gpuhook-metrics.timer
       gpuhook-health.service gpuhook-health.timer gpuhook-placement.service"
rm -rf "$work" && mkdir -p "$work"

# A fake blueprint host, the installed gpuhook's config pointing at it, a reservation made
# through "$@" (the installed binary or the hook link); config and state kept for comparison.
reserve_on_fake_host() {
    "$testbed" fakehost blueprint "$work/host" >/dev/null
    cat > /etc/gpuhook/config.json <<EOF
{"sysfs": "$work/host/sys", "proc": "$work/host/proc", "dev": "$work/host/dev", "exclude": ["0000:08:00.0"]}
EOF
    cp /etc/gpuhook/config.json "$work/config.before"
    printf '<domain><name>pkg</name><uuid>12345678-1234-4234-8234-123456789abc</uuid><metadata><gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"/></metadata></domain>' \
        | "$@" pkg prepare begin -
    /usr/bin/gpuhook list | grep -q 'pkg (prepared)' || fail "the installed hook did not reserve"
    cp /run/gpuhook/state.json "$work/state.before"
}

# The installed QEMU hook (libvirt's calls, as libvirt makes them) reserves the GPU a VM's
# hostdev names at prepare, and frees it at release.
qemu_hook_reserves() {
    "$testbed" fakehost blueprint "$work/qhost" >/dev/null
    printf '{"sysfs": "%s/qhost/sys", "proc": "%s/qhost/proc", "dev": "%s/qhost/dev"}\n' "$work" "$work" "$work" >/etc/gpuhook/config.json
    xml='<domain type="qemu"><name>pkgvm</name><uuid>22345678-1234-4234-8234-123456789abc</uuid><devices><hostdev mode="subsystem" type="pci" managed="yes"><source><address domain="0x0000" bus="0x07" slot="0x00" function="0x0"/></source></hostdev></devices></domain>'
    echo "$xml" | /etc/libvirt/hooks/qemu pkgvm prepare begin - || fail "the QEMU hook failed at prepare"
    /usr/bin/gpuhook list --json | python3 -c '
import json, sys
l = json.load(sys.stdin)
h = [g["holder"] for g in l["gpus"] if g["pci"] == "0000:07:00.0"][0]
sys.exit(0 if h and h.get("kind") == "vm" and h.get("domain") == "pkgvm" else 1)' ||
        fail "the installed QEMU hook did not reserve the VM's GPU: $(/usr/bin/gpuhook list 2>&1)"
    echo "$xml" | /etc/libvirt/hooks/qemu pkgvm release end -
    /usr/bin/gpuhook list | grep -q pkgvm && fail "the QEMU hook's release did not free"
    rm -f /run/gpuhook/state.json
}

common_checks() {
    file_is_static /usr/bin/gpuhook
    ldd /usr/bin/gpuhook-libvirt | grep -q libvirt.so || fail "gpuhook-libvirt does not link libvirt"
    [ "$(readlink /etc/libvirt/hooks/lxc)" = /usr/bin/gpuhook ] || fail "hook not installed"
    [ "$(readlink /etc/libvirt/hooks/qemu)" = /usr/bin/gpuhook ] || fail "QEMU hook not installed"
    [ "$(readlink /usr/bin/gpuhook-runtime)" = gpuhook ] || fail "/usr/bin/gpuhook-runtime is not a link to gpuhook"
    [ "$(stat -c %a /run/gpuhook)" = 700 ] || fail "/run/gpuhook is not 0700"
    zcat /usr/share/man/man1/gpuhook.1.gz | grep -q gpuhook || fail "bad man page"
    /usr/bin/gpuhook --version
    /usr/bin/gpuhook-libvirt --version
    real=$(for r in /usr/bin/crun /usr/sbin/crun /usr/bin/runc /usr/sbin/runc; do [ -x "$r" ] && echo "$r" && break; done)
    [ "$(/usr/bin/gpuhook-runtime --version)" = "$("$real" --version)" ] || fail "gpuhook-runtime --version is not $real's"
    for f in podman-containers.conf docker-daemon.json crio-gpuhook.conf containerd-config.toml; do
        grep -q /usr/bin/gpuhook-runtime "/usr/share/gpuhook/engines/$f" || fail "engine snippet $f"
    done
    step "the static hook ignores LD_PRELOAD"
    rm -f /run/gpuhook-preloaded
    LD_PRELOAD="$pkgs/evil.so" /usr/bin/gpuhook --version >/dev/null
    [ ! -e /run/gpuhook-preloaded ] || fail "LD_PRELOAD was honoured by /usr/bin/gpuhook"
    LD_PRELOAD="$pkgs/evil.so" /bin/true
    [ -e /run/gpuhook-preloaded ] || fail "the LD_PRELOAD probe itself does not work"
    rm -f /run/gpuhook-preloaded
    echo '<domain><name>p</name><uuid>11111111-2222-4333-8444-555555555555</uuid></domain>' | /usr/bin/gpuhook hook p prepare begin -
    step "systemd-analyze verify"
    # shellcheck disable=SC2046
    systemd-analyze verify --man=no $(for u in $units; do echo "$unitdir/$u"; done)
    systemctl is-enabled gpuhook-reconcile.timer >/dev/null || fail "gpuhook-reconcile.timer not enabled"
}

# `file` is not on a minimal host: ldd says whether a program is dynamic.
file_is_static() {
    ldd "$1" 2>&1 | grep -q 'not a dynamic executable' || fail "$1 is not static: $(ldd "$1" 2>&1)"
}

foreign_hook() {
    step "foreign hooks are left alone: gpuhook goes to hooks/lxc.d and hooks/qemu.d"
    mkdir -p /etc/libvirt/hooks
    for h in lxc qemu; do
        printf '#!/bin/sh\n# site %s hook\nexit 0\n' "$h" > "/etc/libvirt/hooks/$h"
        chmod 755 "/etc/libvirt/hooks/$h"
        cp "/etc/libvirt/hooks/$h" "$work/foreign-$h"
    done
    "$@"
    for h in lxc qemu; do
        cmp "/etc/libvirt/hooks/$h" "$work/foreign-$h" || fail "foreign $h hook changed"
        [ "$(readlink "/etc/libvirt/hooks/$h.d/50-gpuhook")" = /usr/bin/gpuhook ] || fail "no $h.d/50-gpuhook"
    done
}

foreign_hook_after() {
    for h in lxc qemu; do
        [ ! -e "/etc/libvirt/hooks/$h.d/50-gpuhook" ] || fail "$h.d/50-gpuhook left"
        cmp "/etc/libvirt/hooks/$h" "$work/foreign-$h" || fail "foreign $h hook changed on removal"
        rm -f "/etc/libvirt/hooks/$h"
    done
}

apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; }

case $kind in
deb)
    unitdir=/lib/systemd/system
    dpkg-query -W -f='${Status}' gpuhook 2>/dev/null | grep -q installed && fail "gpuhook is installed already"
    step "install the .deb with apt (libvirtd running: the package restarts it)"
    systemctl start libvirtd
    pid_before=$(systemctl show -p MainPID --value libvirtd)
    apt_install "$pkgs/gpuhook-1.deb"
    [ "$(systemctl show -p MainPID --value libvirtd)" != "$pid_before" ] || fail "libvirtd was not restarted (it sees only hooks present at its start)"
    dpkg-query -W -f='${Conffiles}\n' gpuhook | grep -q /etc/gpuhook/config.json || fail "config is not a conffile"
    dpkg -S /usr/bin/gpuhook-runtime | grep -q '^gpuhook:' || fail "gpuhook-runtime is not the package's"
    for f in /usr/lib/tmpfiles.d/gpuhook.conf /usr/share/man/man1/gpuhook-libvirt.1.gz \
             /usr/share/bash-completion/completions/gpuhook /usr/share/doc/gpuhook/copyright; do
        [ -f "$f" ] || fail "missing $f"
    done
    common_checks
    step "the installed QEMU hook reserves a VM's GPU hostdev and frees it (through /etc/libvirt/hooks/qemu)"
    qemu_hook_reserves
    step "the installed hook reserves on a fake host (through /etc/libvirt/hooks/lxc)"
    reserve_on_fake_host /etc/libvirt/hooks/lxc
    step "upgrade to the next revision keeps the config and live reservations"
    apt_install -o Dpkg::Options::=--force-confold "$pkgs/gpuhook-2.deb"
    dpkg-query -W -f='${Version}\n' gpuhook | grep -q -- '-2$' || fail "not upgraded"
    cmp /etc/gpuhook/config.json "$work/config.before" || fail "upgrade changed the config"
    cmp /run/gpuhook/state.json "$work/state.before" || fail "upgrade changed the state"
    /usr/bin/gpuhook list | grep -q 'pkg (prepared)' || fail "reservation lost"
    [ "$(readlink /etc/libvirt/hooks/lxc)" = /usr/bin/gpuhook ] || fail "hook lost on upgrade"
    [ "$(readlink /etc/libvirt/hooks/qemu)" = /usr/bin/gpuhook ] || fail "QEMU hook lost on upgrade"
    step "remove takes the hooks away and keeps the config"
    DEBIAN_FRONTEND=noninteractive apt-get remove -y -q gpuhook
    [ ! -e /usr/bin/gpuhook ] && [ ! -L /usr/bin/gpuhook-runtime ] || fail "binary or runtime link left"
    [ ! -e /etc/libvirt/hooks/lxc ] && [ ! -L /etc/libvirt/hooks/lxc ] || fail "hook left after remove"
    [ ! -e /etc/libvirt/hooks/qemu ] && [ ! -L /etc/libvirt/hooks/qemu ] || fail "QEMU hook left after remove"
    [ -f /etc/gpuhook/config.json ] || fail "config removed on remove"
    step "purge removes the config"
    dpkg --purge gpuhook
    [ ! -e /etc/gpuhook ] || fail "/etc/gpuhook left after purge"
    [ ! -e /etc/libvirt/hooks/qemu ] && [ ! -L /etc/libvirt/hooks/qemu ] || fail "QEMU hook left after purge"
    foreign_hook apt_install "$pkgs/gpuhook-1.deb"
    dpkg --purge gpuhook
    foreign_hook_after
    ;;
rpm)
    unitdir=/usr/lib/systemd/system
    # Debian's rpm before trixie refuses to install without --force-debian (it points at alien).
    force=""
    rpm --help 2>&1 | grep -q -- --force-debian && force=--force-debian
    rpmi() { rpm $force --nodeps "$@"; }
    step "install the .rpm (rpm -i; its %post makes the hook and the runtime link)"
    rpmi -i "$pkgs/gpuhook-1.rpm"
    rpm -V --nodeps gpuhook || fail "rpm -V: installed files differ from the package"
    rpm -qc gpuhook | grep -qx /etc/gpuhook/config.json || fail "config is not a config file"
    for u in $units; do
        rpm -qf "$unitdir/$u" | grep -q '^gpuhook-' || fail "unit $u is not the package's"
    done
    for f in /usr/lib/tmpfiles.d/gpuhook.conf /usr/share/man/man1/gpuhook-runtime.1.gz \
             /usr/share/doc/gpuhook/README.md /usr/share/licenses/gpuhook/LICENSE /usr/share/gpuhook/hook-install.sh; do
        [ -f "$f" ] || fail "missing $f"
    done
    common_checks
    step "the installed QEMU hook reserves a VM's GPU hostdev and frees it (through /etc/libvirt/hooks/qemu)"
    qemu_hook_reserves
    step "the installed hook reserves on a fake host (through /etc/libvirt/hooks/lxc)"
    reserve_on_fake_host /etc/libvirt/hooks/lxc
    step "upgrade (rpm -U of release 2) keeps the config, live reservations, hook and runtime link"
    rpmi -U "$pkgs/gpuhook-2.rpm"
    rpm -q gpuhook | grep -q -- '-2\.x86_64$' || fail "not upgraded"
    cmp /etc/gpuhook/config.json "$work/config.before" || fail "upgrade changed the config"
    [ ! -e /etc/gpuhook/config.json.rpmnew ] || fail "upgrade wrote config.json.rpmnew for an unchanged packaged config"
    cmp /run/gpuhook/state.json "$work/state.before" || fail "upgrade changed the state"
    /usr/bin/gpuhook list | grep -q 'pkg (prepared)' || fail "reservation lost"
    [ "$(readlink /etc/libvirt/hooks/lxc)" = /usr/bin/gpuhook ] || fail "hook lost on upgrade"
    [ "$(readlink /etc/libvirt/hooks/qemu)" = /usr/bin/gpuhook ] || fail "QEMU hook lost on upgrade"
    [ "$(readlink /usr/bin/gpuhook-runtime)" = gpuhook ] || fail "runtime link lost on upgrade"
    step "erase takes the hook, the runtime link and the units away; the changed config stays as .rpmsave"
    rpm -e gpuhook
    ! rpm -q gpuhook >/dev/null 2>&1 || fail "still installed"
    [ ! -e /usr/bin/gpuhook ] && [ ! -L /usr/bin/gpuhook-runtime ] || fail "binary or runtime link left"
    [ ! -e /etc/libvirt/hooks/lxc ] && [ ! -L /etc/libvirt/hooks/lxc ] || fail "hook left after erase"
    [ ! -e /etc/libvirt/hooks/qemu ] && [ ! -L /etc/libvirt/hooks/qemu ] || fail "QEMU hook left after erase"
    for u in $units; do [ ! -e "$unitdir/$u" ] || fail "unit $u left after erase"; done
    [ ! -e /etc/gpuhook/config.json ] || fail "config left in place after erase"
    cmp /etc/gpuhook/config.json.rpmsave "$work/config.before" || fail "changed config not kept as .rpmsave"
    rm -rf /etc/gpuhook /run/gpuhook
    step "an unchanged config goes with erase"
    rpmi -i "$pkgs/gpuhook-1.rpm"
    rpm -e gpuhook
    [ ! -e /etc/gpuhook/config.json ] && [ ! -e /etc/gpuhook/config.json.rpmsave ] || fail "unchanged config left after erase"
    foreign_hook rpmi -i "$pkgs/gpuhook-1.rpm"
    rpm -e gpuhook
    foreign_hook_after
    rm -rf /etc/gpuhook /run/gpuhook
    ;;
*)
    fail "usage: packages.sh deb|rpm PKGDIR TESTBED"
    ;;
esac
rm -rf "$work"
step "$kind: all checks passed"
