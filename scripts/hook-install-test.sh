#!/bin/sh
# packaging/hook-install.sh (what the .deb's and the .rpm's scripts source) against a private
# /etc/libvirt: a tmpfs mounted over it in a mount namespace of its own, so the machine's
# /etc/libvirt is never touched. Install makes hooks/lxc and hooks/qemu (or, beside a foreign
# hook, hooks/DRIVER.d/50-gpuhook), says "new" only when it made one, and removal takes out
# only gpuhook's links. Run as root; packaging/build.sh's packages are not needed.
set -eu
cd "$(dirname "$0")/.."
if [ "${GPUHOOK_HOOK_INSTALL_NS:-}" != inside ]; then
    exec env GPUHOOK_HOOK_INSTALL_NS=inside unshare --mount --propagation private -- "$0" "$@"
fi
mkdir -p /etc/libvirt
mount -t tmpfs hook-install-test /etc/libvirt
fail() { echo "hook-install-test: FAIL: $*" >&2; exit 1; }
. packaging/hook-install.sh
link() { [ "$(readlink "/etc/libvirt/hooks/$1")" = /usr/bin/gpuhook ] || fail "hooks/$1 is not gpuhook's"; }

[ "$(gpuhook_install_hook)" = new ] || fail "a first install made no hook"
link lxc
link qemu
[ -z "$(gpuhook_install_hook)" ] || fail "a second install made a hook again"
gpuhook_remove_hook
[ -z "$(ls -A /etc/libvirt/hooks)" ] || fail "removal left: $(ls -A /etc/libvirt/hooks)"

# A foreign QEMU hook (a VM manager's): left alone, gpuhook beside it in qemu.d.
printf '#!/bin/sh\nexit 0\n' > /etc/libvirt/hooks/qemu
chmod 755 /etc/libvirt/hooks/qemu
[ "$(gpuhook_install_hook)" = new ] || fail "install beside a foreign hook made none"
link lxc
link qemu.d/50-gpuhook
[ ! -L /etc/libvirt/hooks/qemu ] && grep -q 'exit 0' /etc/libvirt/hooks/qemu || fail "the foreign hook was touched"
# Only the missing one is made again.
rm /etc/libvirt/hooks/lxc
[ "$(gpuhook_install_hook)" = new ] || fail "a missing lxc hook was not made again"
link lxc
gpuhook_remove_hook
[ "$(ls -A /etc/libvirt/hooks)" = qemu ] || fail "removal beside a foreign hook left: $(ls -A /etc/libvirt/hooks)"
grep -q 'exit 0' /etc/libvirt/hooks/qemu || fail "removal touched the foreign hook"
# Each daemon that runs hooks is restarted (libvirt sees hooks at its start only).
for d in libvirtd virtlxcd virtqemud; do
    echo "$GPUHOOK_LIBVIRT_DAEMONS" | grep -qw "$d" || fail "$d is not restarted"
done
grep -q virtqemud packaging/debian/postrm && grep -q virtqemud packaging/rpm/postun.sh \
    || fail "removal does not restart virtqemud"
echo "hook-install-test: ok (lxc and qemu hooks installed, beside a foreign hook, removed)"
