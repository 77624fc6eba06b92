#!/bin/sh
# The packages as an operator meets them (as root, after packaging/build.sh): lint, read
# the .rpm, install the .deb, run the real-libvirtd suite against the INSTALLED hook,
# upgrade (config and live reservations kept), remove (hook gone), purge (config gone),
# and install beside a foreign hook. Leaves the package purged.
set -eu
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
deb=$(ls target/dist/gpuhook_*_amd64.deb)
rpm=$(ls target/dist/gpuhook-*.x86_64.rpm)
work=/var/tmp/gpuhook-package-test
step() { printf '\n== %s\n' "$*"; }
fail() { echo "package-test: FAIL: $*" >&2; exit 1; }
. scripts/installed-lib.sh
has() { grep -qx -- "$1" "$2" || fail "$2 lacks $1"; }

step "lintian (no errors)"
lintian --fail-on error "$deb"
step "rpmlint (no errors; filters in packaging/rpmlint.toml)"
rpmlint -c packaging/rpmlint.toml "$rpm"

step ".rpm contents, config files, requirements and scripts"
rm -rf "$work" && mkdir -p "$work"
rpm -qlp "$rpm" | tee "$work/rpm-files"
for f in /usr/bin/gpuhook /usr/bin/gpuhook-libvirt /etc/gpuhook/config.json /usr/lib/tmpfiles.d/gpuhook.conf \
         /usr/lib/systemd/system/gpuhook-reconcile.service /usr/lib/systemd/system/gpuhook-reconcile.timer \
         /usr/share/man/man1/gpuhook.1.gz /usr/share/man/man1/gpuhook-libvirt.1.gz /usr/share/doc/gpuhook/README.md \
         /usr/share/gpuhook/engines/podman-containers.conf /usr/share/gpuhook/engines/docker-daemon.json \
         /usr/share/gpuhook/engines/crio-gpuhook.conf /usr/share/gpuhook/engines/containerd-config.toml \
         /usr/share/gpuhook/engines/kubernetes-runtimeclass.yaml \
         /usr/lib/systemd/system/gpuhook-metrics.service /usr/lib/systemd/system/gpuhook-metrics.timer \
         /usr/lib/systemd/system/gpuhook-health.service /usr/lib/systemd/system/gpuhook-health.timer; do
    has "$f" "$work/rpm-files"
done
rpm -qp --configfiles "$rpm" | tee "$work/rpm-conf"
has /etc/gpuhook/config.json "$work/rpm-conf"
rpm -qp --requires "$rpm" | tee "$work/rpm-req"
grep -q '^libvirt-libs >= 6.5.0' "$work/rpm-req" || fail "rpm does not require libvirt-libs"
rpm -qp --scripts "$rpm" | tee "$work/rpm-scripts"
for s in gpuhook_install_hook gpuhook_remove_hook gpuhook_restart_libvirt 'systemctl enable --now gpuhook-reconcile.timer' \
         gpuhook_install_runtime_link gpuhook_remove_runtime_link; do
    grep -q "$s" "$work/rpm-scripts" || fail "rpm scripts lack $s"
done

step "clean slate"
dpkg --purge gpuhook >/dev/null 2>&1 || true
for f in /etc/libvirt/hooks/lxc /etc/libvirt/hooks/lxc.d/50-gpuhook; do
    if [ -L "$f" ] && [ "$(readlink "$f")" = /usr/bin/gpuhook ]; then rm -f "$f"; fi
done
[ ! -e /etc/libvirt/hooks/lxc ] || fail "a foreign /etc/libvirt/hooks/lxc exists on this machine; move it away first"

step "install the .deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "./$deb" >/dev/null
file /usr/bin/gpuhook | grep -q 'statically linked' || fail "/usr/bin/gpuhook is not static"
ldd /usr/bin/gpuhook-libvirt | grep -q libvirt.so || fail "gpuhook-libvirt does not link libvirt"
[ "$(readlink /etc/libvirt/hooks/lxc)" = /usr/bin/gpuhook ] || fail "hook not installed"
dpkg-query -W -f='${Conffiles}\n' gpuhook | grep -q /etc/gpuhook/config.json || fail "config is not a conffile"
dpkg-query -W -f='${Depends}\n' gpuhook | grep -q libvirt0 || fail "no libvirt0 dependency"
[ "$(stat -c %a /run/gpuhook)" = 700 ] || fail "/run/gpuhook is not 0700"
for f in /lib/systemd/system/gpuhook-reconcile.service /lib/systemd/system/gpuhook-reconcile.timer \
         /usr/lib/tmpfiles.d/gpuhook.conf /usr/share/man/man1/gpuhook.1.gz /usr/share/man/man1/gpuhook-libvirt.1.gz \
         /usr/share/bash-completion/completions/gpuhook /usr/share/doc/gpuhook/copyright; do
    [ -f "$f" ] || fail "missing $f"
done
zcat /usr/share/man/man1/gpuhook.1.gz | grep -q 'gpuhook' || fail "bad man page"
/usr/bin/gpuhook --version
/usr/bin/gpuhook-libvirt --version
step "gpuhook-runtime: a link to gpuhook that runs the real runtime (crun, else runc)"
[ "$(readlink /usr/bin/gpuhook-runtime)" = gpuhook ] || fail "/usr/bin/gpuhook-runtime is not a link to gpuhook"
dpkg -S /usr/bin/gpuhook-runtime | grep -q '^gpuhook:' || fail "gpuhook-runtime is not the package's"
real=$(for r in /usr/bin/crun /usr/sbin/crun /usr/bin/runc /usr/sbin/runc; do [ -x "$r" ] && echo "$r" && break; done)
[ "$(/usr/bin/gpuhook-runtime --version)" = "$("$real" --version)" ] || fail "gpuhook-runtime --version is not $real's"
for f in podman-containers.conf docker-daemon.json crio-gpuhook.conf containerd-config.toml; do
    grep -q /usr/bin/gpuhook-runtime "/usr/share/gpuhook/engines/$f" || fail "engine snippet $f"
done
grep -qx 'handler: gpuhook' /usr/share/gpuhook/engines/kubernetes-runtimeclass.yaml || fail "RuntimeClass manifest"
step "Kubernetes through the CRI against the installed binary, snippet and RuntimeClass"
GPUHOOK_TEST_BIN=/usr/bin/gpuhook GPUHOOK_CRI_SNIPPET=/usr/share/gpuhook/engines/containerd-config.toml \
GPUHOOK_CRI_RUNTIMECLASS=/usr/share/gpuhook/engines/kubernetes-runtimeclass.yaml cargo test --locked -q --test cri
step "OCI suite (podman, runc, crun, docker) against the installed binary"
GPUHOOK_TEST_BIN=/usr/bin/gpuhook cargo test --locked -q --test oci
step "the static hook ignores LD_PRELOAD (nvidia-container-toolkit CVE-2025-23266 class)"
printf '#include <stdio.h>\n__attribute__((constructor)) static void evil(void) { FILE *f = fopen("%s/preloaded", "w"); if (f) fclose(f); }\n' "$work" > "$work/evil.c"
gcc -shared -fPIC -o "$work/evil.so" "$work/evil.c"
echo '<domain><name>p</name><uuid>11111111-2222-4333-8444-555555555555</uuid></domain>' | LD_PRELOAD="$work/evil.so" /usr/bin/gpuhook hook p prepare begin -
LD_PRELOAD="$work/evil.so" /usr/bin/gpuhook --version >/dev/null
[ ! -e "$work/preloaded" ] || fail "LD_PRELOAD was honoured by /usr/bin/gpuhook"
LD_PRELOAD="$work/evil.so" /bin/true
[ -e "$work/preloaded" ] || fail "the LD_PRELOAD probe itself does not work"
step "systemd-analyze verify"
systemd-analyze verify /lib/systemd/system/gpuhook-reconcile.service /lib/systemd/system/gpuhook-reconcile.timer \
    /lib/systemd/system/gpuhook-metrics.service /lib/systemd/system/gpuhook-metrics.timer \
    /lib/systemd/system/gpuhook-placement.service \
    /lib/systemd/system/gpuhook-health.service /lib/systemd/system/gpuhook-health.timer

step "real-libvirtd suite against the installed hook"
GPUHOOK_TEST_HOOK=installed GPUHOOK_TEST_BIN=/usr/bin/gpuhook GPUHOOK_TEST_LIBVIRT_BIN=/usr/bin/gpuhook-libvirt \
    cargo test --locked -q --test libvirt

step "upgrade keeps the config and live reservations"
reserve_on_fake_host /usr/bin/gpuhook hook
cargo deb --no-build --no-strip -p gpuhook --deb-revision 2 -o "$work/" >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Options::=--force-confold "$work"/gpuhook_*-2_amd64.deb >/dev/null
dpkg-query -W -f='${Version}\n' gpuhook | grep -q -- '-2$' || fail "not upgraded"
cmp /etc/gpuhook/config.json "$work/config.before" || fail "upgrade changed the config"
cmp /run/gpuhook/state.json "$work/state.before" || fail "upgrade changed the state"
/usr/bin/gpuhook list | grep -q 'pkg (prepared)' || fail "reservation lost"
[ "$(readlink /etc/libvirt/hooks/lxc)" = /usr/bin/gpuhook ] || fail "hook lost on upgrade"

step "remove takes the hook away and keeps the config"
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq gpuhook >/dev/null
[ ! -e /usr/bin/gpuhook ] && [ ! -L /usr/bin/gpuhook-runtime ] || fail "binary or runtime link left"
[ ! -e /etc/libvirt/hooks/lxc ] && [ ! -L /etc/libvirt/hooks/lxc ] || fail "hook left after remove"
[ -f /etc/gpuhook/config.json ] || fail "config removed on remove"

step "purge removes the config"
dpkg --purge gpuhook >/dev/null
[ ! -e /etc/gpuhook ] || fail "/etc/gpuhook left after purge"

step "a foreign hook is left alone: gpuhook goes to hooks/lxc.d"
printf '#!/bin/sh\n# site hook\nexit 0\n' > /etc/libvirt/hooks/lxc
chmod 755 /etc/libvirt/hooks/lxc
cp /etc/libvirt/hooks/lxc "$work/foreign"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "./$deb" >/dev/null
cmp /etc/libvirt/hooks/lxc "$work/foreign" || fail "foreign hook changed"
[ "$(readlink /etc/libvirt/hooks/lxc.d/50-gpuhook)" = /usr/bin/gpuhook ] || fail "no lxc.d/50-gpuhook"
dpkg --purge gpuhook >/dev/null
[ ! -e /etc/libvirt/hooks/lxc.d/50-gpuhook ] || fail "lxc.d/50-gpuhook left"
cmp /etc/libvirt/hooks/lxc "$work/foreign" || fail "foreign hook changed on purge"
rm -f /etc/libvirt/hooks/lxc
rm -rf "$work"
step "packages: all checks passed"
