#!/bin/sh
# The .rpm as an operator meets it, installed with rpm itself on this Debian machine (as
# root, after packaging/build.sh; --nodeps: Debian has no rpm database of libvirt-libs or
# glibc): its scripts run (they alone make /usr/bin/gpuhook-runtime and the libvirt hook:
# neither is in the payload), the files, links and systemd units are in place, the installed
# hook reserves on a fake host and the installed gpuhook-runtime runs containerd containers,
# upgrade keeps the config and live reservations, erase takes the hook and the runtime link
# away (a changed config is kept as .rpmsave, rpm's way), and a foreign hook is left alone.
# The .deb's checks (scripts/package-test.sh), the same where rpm and dpkg agree. Leaves the
# package erased. Run it alone: it installs into this machine's /usr and /etc.
set -eu
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
rpm=$(ls target/dist/gpuhook-*.x86_64.rpm)
work=/var/tmp/gpuhook-rpm-test
units="gpuhook-reconcile.service gpuhook-reconcile.timer gpuhook-metrics.service gpuhook-metrics.timer
       gpuhook-health.service gpuhook-health.timer gpuhook-placement.service"
step() { printf '\n== %s\n' "$*"; }
fail() { echo "rpm-test: FAIL: $*" >&2; exit 1; }
. scripts/installed-lib.sh
# Debian's rpm refuses to install without --force-debian (it points at alien).
rpmi() { rpm --force-debian --nodeps "$@"; }

step "clean slate"
if dpkg-query -W -f='${Status}' gpuhook 2>/dev/null | grep -q installed; then
    fail "the .deb is installed (dpkg); purge it first (scripts/package-test.sh leaves it purged)"
fi
if rpm -q gpuhook >/dev/null 2>&1; then rpm -e --nodeps gpuhook; fi
for f in /etc/libvirt/hooks/lxc /etc/libvirt/hooks/lxc.d/50-gpuhook /usr/bin/gpuhook-runtime; do
    [ ! -e "$f" ] && [ ! -L "$f" ] || fail "$f exists on this machine; move it away first"
done
rm -rf "$work" /run/gpuhook /etc/gpuhook && mkdir -p "$work"

step "install the .rpm (rpm -i; its %post makes the hook and the runtime link)"
rpmi -i "$rpm"
rpm -q gpuhook
rpm -V --nodeps gpuhook || fail "rpm -V: installed files differ from the package"
file /usr/bin/gpuhook | grep -q 'statically linked' || fail "/usr/bin/gpuhook is not static"
ldd /usr/bin/gpuhook-libvirt | grep -q libvirt.so || fail "gpuhook-libvirt does not link libvirt"
[ "$(readlink /etc/libvirt/hooks/lxc)" = /usr/bin/gpuhook ] || fail "hook not installed by %post"
[ "$(readlink /usr/bin/gpuhook-runtime)" = gpuhook ] || fail "/usr/bin/gpuhook-runtime not made by %post"
rpm -qc gpuhook | grep -qx /etc/gpuhook/config.json || fail "config is not a config file"
rpm -q --requires gpuhook | grep -q '^libvirt-libs >= 6.5.0' || fail "no libvirt-libs requirement"
[ "$(stat -c %a /run/gpuhook)" = 700 ] || fail "/run/gpuhook is not 0700"
for u in $units; do
    [ -f "/usr/lib/systemd/system/$u" ] || fail "missing unit $u"
    rpm -qf "/usr/lib/systemd/system/$u" | grep -q '^gpuhook-' || fail "unit $u is not the package's"
done
for f in /usr/lib/tmpfiles.d/gpuhook.conf /usr/share/man/man1/gpuhook.1.gz /usr/share/man/man1/gpuhook-libvirt.1.gz \
         /usr/share/man/man1/gpuhook-runtime.1.gz /usr/share/bash-completion/completions/gpuhook \
         /usr/share/doc/gpuhook/README.md /usr/share/licenses/gpuhook/LICENSE /usr/share/gpuhook/hook-install.sh; do
    [ -f "$f" ] || fail "missing $f"
done
zcat /usr/share/man/man1/gpuhook.1.gz | grep -q 'gpuhook' || fail "bad man page"
/usr/bin/gpuhook --version
/usr/bin/gpuhook-libvirt --version
real=$(for r in /usr/bin/crun /usr/sbin/crun /usr/bin/runc /usr/sbin/runc; do [ -x "$r" ] && echo "$r" && break; done)
[ "$(/usr/bin/gpuhook-runtime --version)" = "$("$real" --version)" ] || fail "gpuhook-runtime --version is not $real's"
for f in podman-containers.conf docker-daemon.json crio-gpuhook.conf containerd-config.toml; do
    grep -q /usr/bin/gpuhook-runtime "/usr/share/gpuhook/engines/$f" || fail "engine snippet $f"
done
systemd-analyze verify $(for u in $units; do echo "/usr/lib/systemd/system/$u"; done)

step "the static hook ignores LD_PRELOAD"
printf '#include <stdio.h>\n__attribute__((constructor)) static void evil(void) { FILE *f = fopen("%s/preloaded", "w"); if (f) fclose(f); }\n' "$work" > "$work/evil.c"
gcc -shared -fPIC -o "$work/evil.so" "$work/evil.c"
LD_PRELOAD="$work/evil.so" /usr/bin/gpuhook --version >/dev/null
[ ! -e "$work/preloaded" ] || fail "LD_PRELOAD was honoured by /usr/bin/gpuhook"
LD_PRELOAD="$work/evil.so" /bin/true
[ -e "$work/preloaded" ] || fail "the LD_PRELOAD probe itself does not work"

step "containerd suite against the installed gpuhook-runtime"
GPUHOOK_TEST_BIN=/usr/bin/gpuhook cargo test --locked -q --test containerd

step "the installed hook reserves on a fake host (through /etc/libvirt/hooks/lxc)"
reserve_on_fake_host /etc/libvirt/hooks/lxc

step "upgrade (rpm -U of release 2) keeps the config, live reservations, hook and runtime link"
cargo generate-rpm -p . -o "$work/" -s 'release = "2"' >/dev/null
rpmi -U "$work"/gpuhook-*-2.x86_64.rpm
rpm -q gpuhook | grep -q -- '-2\.x86_64$' || fail "not upgraded"
cmp /etc/gpuhook/config.json "$work/config.before" || fail "upgrade changed the config"
[ ! -e /etc/gpuhook/config.json.rpmnew ] || fail "upgrade wrote config.json.rpmnew for an unchanged packaged config"
cmp /run/gpuhook/state.json "$work/state.before" || fail "upgrade changed the state"
/usr/bin/gpuhook list | grep -q 'pkg (prepared)' || fail "reservation lost"
[ "$(readlink /etc/libvirt/hooks/lxc)" = /usr/bin/gpuhook ] || fail "hook lost on upgrade"
[ "$(readlink /usr/bin/gpuhook-runtime)" = gpuhook ] || fail "runtime link lost on upgrade"

step "erase takes the hook, the runtime link and the units away; the changed config stays as .rpmsave"
rpm -e gpuhook
! rpm -q gpuhook >/dev/null 2>&1 || fail "still installed"
[ ! -e /usr/bin/gpuhook ] && [ ! -L /usr/bin/gpuhook-runtime ] || fail "binary or runtime link left"
[ ! -e /etc/libvirt/hooks/lxc ] && [ ! -L /etc/libvirt/hooks/lxc ] || fail "hook left after erase"
for u in $units; do [ ! -e "/usr/lib/systemd/system/$u" ] || fail "unit $u left after erase"; done
[ ! -e /etc/gpuhook/config.json ] || fail "config left in place after erase"
cmp /etc/gpuhook/config.json.rpmsave "$work/config.before" || fail "changed config not kept as .rpmsave"
rm -rf /etc/gpuhook /run/gpuhook

step "an unchanged config goes with erase"
rpmi -i "$rpm"
rpm -e gpuhook
[ ! -e /etc/gpuhook/config.json ] && [ ! -e /etc/gpuhook/config.json.rpmsave ] || fail "unchanged config left after erase"

step "a foreign hook is left alone: gpuhook goes to hooks/lxc.d"
printf '#!/bin/sh\n# site hook\nexit 0\n' > /etc/libvirt/hooks/lxc
chmod 755 /etc/libvirt/hooks/lxc
cp /etc/libvirt/hooks/lxc "$work/foreign"
rpmi -i "$rpm"
cmp /etc/libvirt/hooks/lxc "$work/foreign" || fail "foreign hook changed"
[ "$(readlink /etc/libvirt/hooks/lxc.d/50-gpuhook)" = /usr/bin/gpuhook ] || fail "no lxc.d/50-gpuhook"
rpm -e gpuhook
[ ! -e /etc/libvirt/hooks/lxc.d/50-gpuhook ] || fail "lxc.d/50-gpuhook left"
cmp /etc/libvirt/hooks/lxc "$work/foreign" || fail "foreign hook changed on erase"
rm -f /etc/libvirt/hooks/lxc
rm -rf "$work" /etc/gpuhook /run/gpuhook
step "rpm: all checks passed"
