#!/bin/sh
# The packages on this machine, without installing them (as root, after packaging/build.sh):
# lint, read the .deb's and the .rpm's contents, scripts and requirements, unpack the .deb
# into a directory and check what it ships (the static hook, the runtime link, the engine
# snippets, the hook ignoring LD_PRELOAD), then run the CRI and OCI suites against that
# unpacked static binary (the Debian 13 VM runs it as the installed libvirt hook). Installing, upgrading, removing and purging (.deb with apt,
# .rpm with rpm) happen in the Debian 13 VM (tests/debian13, scripts/vm/packages.sh): this
# script changes nothing in the machine's /usr or /etc.
set -eu
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
deb=$(ls target/dist/gpuhook_*_amd64.deb)
rpm=$(ls target/dist/gpuhook-*.x86_64.rpm)
work=/var/tmp/gpuhook-package-test
step() { printf '\n== %s\n' "$*"; }
fail() { echo "package-test: FAIL: $*" >&2; exit 1; }
has() { grep -qx -- "$1" "$2" || fail "$2 lacks $1"; }

step "lintian (no errors)"
lintian --fail-on error "$deb"
step "rpmlint (no errors; filters in packaging/rpmlint.toml)"
rpmlint -c packaging/rpmlint.toml "$rpm"

rm -rf "$work" && mkdir -p "$work"
step ".rpm contents, config files, requirements and scripts"
rpm -qlp "$rpm" | tee "$work/rpm-files"
for f in /usr/bin/gpuhook /usr/bin/gpuhook-libvirt /etc/gpuhook/config.json /usr/lib/tmpfiles.d/gpuhook.conf \
         /usr/lib/systemd/system/gpuhook-reconcile.service /usr/lib/systemd/system/gpuhook-reconcile.timer \
         /usr/share/man/man1/gpuhook.1.gz /usr/share/man/man1/gpuhook-libvirt.1.gz /usr/share/doc/gpuhook/README.md \
         /usr/share/gpuhook/engines/podman-containers.conf /usr/share/gpuhook/engines/docker-daemon.json \
         /usr/share/gpuhook/engines/crio-gpuhook.conf /usr/share/gpuhook/engines/containerd-config.toml \
         /usr/share/gpuhook/engines/kubernetes-runtimeclass.yaml /usr/share/gpuhook/engines/kubernetes-device-plugin.yaml \
         /usr/bin/gpuhook-device-plugin /usr/lib/systemd/system/gpuhook-device-plugin.service \
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

step "the .deb's contents, conffile and dependencies (dpkg-deb, unpacked into $work/root)"
dpkg-deb -I "$deb" | tee "$work/deb-info"
grep -q '^ Depends:.*libvirt0' "$work/deb-info" || fail "no libvirt0 dependency"
dpkg-deb -I "$deb" conffiles | grep -qx /etc/gpuhook/config.json || fail "config is not a conffile"
root=$work/root
dpkg-deb -x "$deb" "$root"
for f in /usr/bin/gpuhook /usr/bin/gpuhook-libvirt /lib/systemd/system/gpuhook-reconcile.service \
         /lib/systemd/system/gpuhook-reconcile.timer /usr/lib/tmpfiles.d/gpuhook.conf /usr/share/man/man1/gpuhook.1.gz \
         /usr/share/man/man1/gpuhook-libvirt.1.gz /usr/share/bash-completion/completions/gpuhook \
         /usr/share/doc/gpuhook/copyright /etc/gpuhook/config.json /usr/bin/gpuhook-device-plugin \
         /lib/systemd/system/gpuhook-device-plugin.service /usr/share/gpuhook/engines/kubernetes-device-plugin.yaml; do
    [ -f "$root$f" ] || fail "the .deb lacks $f"
done
file "$root/usr/bin/gpuhook" | grep -q 'statically linked' || fail "/usr/bin/gpuhook is not static"
ldd "$root/usr/bin/gpuhook-libvirt" | grep -q libvirt.so || fail "gpuhook-libvirt does not link libvirt"
[ "$(readlink "$root/usr/bin/gpuhook-runtime")" = gpuhook ] || fail "/usr/bin/gpuhook-runtime is not a link to gpuhook"
zcat "$root/usr/share/man/man1/gpuhook.1.gz" | grep -q 'gpuhook' || fail "bad man page"
"$root/usr/bin/gpuhook" --version
"$root/usr/bin/gpuhook-libvirt" --version
"$root/usr/bin/gpuhook-device-plugin" --version
ldd "$root/usr/bin/gpuhook-device-plugin" | grep -q libvirt.so && fail "gpuhook-device-plugin links libvirt"
grep -q 'container_annotations = \["gpuhook.io/\*"\]' "$root/usr/share/gpuhook/engines/containerd-config.toml" || fail "containerd snippet passes no container annotations"
grep -q '/usr/bin/gpuhook-device-plugin' "$root/usr/share/gpuhook/engines/kubernetes-device-plugin.yaml" || fail "DaemonSet manifest"
for f in podman-containers.conf docker-daemon.json crio-gpuhook.conf containerd-config.toml; do
    grep -q /usr/bin/gpuhook-runtime "$root/usr/share/gpuhook/engines/$f" || fail "engine snippet $f"
done
grep -qx 'handler: gpuhook' "$root/usr/share/gpuhook/engines/kubernetes-runtimeclass.yaml" || fail "RuntimeClass manifest"

step "the hooks the scripts install: lxc and qemu, beside foreign ones, removed (a private /etc/libvirt)"
cmp "$root/usr/share/gpuhook/hook-install.sh" packaging/hook-install.sh || fail "the .deb ships another hook-install.sh"
./scripts/hook-install-test.sh

step "the static hook ignores LD_PRELOAD (nvidia-container-toolkit CVE-2025-23266 class)"
printf '#include <stdio.h>\n__attribute__((constructor)) static void evil(void) { FILE *f = fopen("%s/preloaded", "w"); if (f) fclose(f); }\n' "$work" > "$work/evil.c"
gcc -shared -fPIC -o "$work/evil.so" "$work/evil.c"
echo '<domain><name>p</name><uuid>11111111-2222-4333-8444-555555555555</uuid></domain>' | LD_PRELOAD="$work/evil.so" "$root/usr/bin/gpuhook" hook p prepare begin -
LD_PRELOAD="$work/evil.so" "$root/usr/bin/gpuhook" --version >/dev/null
[ ! -e "$work/preloaded" ] || fail "LD_PRELOAD was honoured by the packaged gpuhook"
LD_PRELOAD="$work/evil.so" /bin/true
[ -e "$work/preloaded" ] || fail "the LD_PRELOAD probe itself does not work"

step "Kubernetes through the CRI with the packaged binary, snippet and RuntimeClass"
GPUHOOK_TEST_BIN="$root/usr/bin/gpuhook" GPUHOOK_CRI_SNIPPET="$root/usr/share/gpuhook/engines/containerd-config.toml" \
GPUHOOK_CRI_RUNTIMECLASS="$root/usr/share/gpuhook/engines/kubernetes-runtimeclass.yaml" cargo test --locked -q --test cri
step "OCI suite (podman, runc, crun, docker) against the packaged static binary"
GPUHOOK_TEST_BIN="$root/usr/bin/gpuhook" cargo test --locked -q --test oci
rm -rf "$work"
step "packages: all checks passed (install, upgrade, purge: tests/debian13)"
