#!/bin/sh
# This distribution's qemu-system-x86_64, unpacked (apt-get download + dpkg -x) into
# /var/cache/gpuhook-tests/qemu (or $1) rather than installed: on a Debian 12 machine with
# backports' qemu-utils 10.0, installing bookworm's qemu-system-x86 7.2 would remove it.
# tests/qemu.rs names DIR/bin/qemu-system-x86_64 (a wrapper giving the binary its libraries,
# its TCG module and its firmware, SeaBIOS) as its VMs' <emulator>. Reused while DIR/stamp
# says it is complete. Root only. Prints DIR.
set -eu
dir=${1:-/var/cache/gpuhook-tests/qemu}
# The emulator, its TCG module (qemu-system-common), its ROMs (qemu-system-data), SeaBIOS,
# and the libraries a minimal Debian 12 machine lacks; only those not installed are unpacked.
pkgs="qemu-system-x86 qemu-system-common qemu-system-data seabios libcapstone4 libfdt1 libpmem1
      libndctl6 libdaxctl1 librdmacm1 libibverbs1 libnl-3-200 libnl-route-3-200 libslirp0
      libvdeplug2 libaio1 liburing2 libfuse3-3 libnuma1 libpixman-1-0 libjpeg62-turbo libpng16-16
      libbpf1"
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")
want="$codename: $(echo $pkgs); v1"
wrapper=$dir/bin/qemu-system-x86_64
if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$want" ] && [ -x "$wrapper" ]; then
    echo "$dir"
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "qemu-unpacked: must run as root" >&2; exit 1; }
rm -rf "$dir/debs" "$dir/root" "$dir/bin" "$dir/stamp"
mkdir -p "$dir/debs" "$dir/root" "$dir/bin"
get=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" && continue
    get="$get $p"
done
echo "qemu-unpacked: apt-get download$get" >&2
# shellcheck disable=SC2086
(cd "$dir/debs" && apt-get download -q $get >"$dir/download.log" 2>&1) || {
    # A machine whose lists are stale or missing: once more after an update.
    apt-get update -qq &&
        (cd "$dir/debs" && apt-get download -q $get >"$dir/download.log" 2>&1)
} || { tail -n 5 "$dir/download.log" >&2; echo "qemu-unpacked: apt-get download failed (log: $dir/download.log)" >&2; exit 1; }
for f in "$dir"/debs/*.deb; do dpkg -x "$f" "$dir/root"; done
r=$dir/root
lib=$r/usr/lib/x86_64-linux-gnu
[ -x "$r/usr/bin/qemu-system-x86_64" ] || { echo "qemu-unpacked: no usr/bin/qemu-system-x86_64 in $r" >&2; exit 1; }
# Only the TCG module: the others (spice, GL, USB redirection) need libraries not unpacked.
mkdir -p "$dir/modules"
cp "$lib"/qemu/accel-tcg-x86_64.so "$dir/modules/"
cat >"$wrapper" <<EOF
#!/bin/sh
# Made by scripts/qemu-unpacked.sh: the unpacked qemu with its libraries, TCG module, firmware.
export LD_LIBRARY_PATH=$lib QEMU_MODULE_DIR=$dir/modules
exec $r/usr/bin/qemu-system-x86_64 -L $r/usr/share/qemu -L $r/usr/share/seabios "\$@"
EOF
chmod 755 "$wrapper"
missing=$(LD_LIBRARY_PATH=$lib ldd "$r/usr/bin/qemu-system-x86_64" | grep 'not found' || true)
[ -z "$missing" ] || { echo "qemu-unpacked: qemu-system-x86_64 still lacks libraries:" >&2; echo "$missing" >&2; exit 1; }
"$wrapper" --version >&2
# A machine that starts: no guest, SeaBIOS idles; `info status` on the monitor, then quit.
out=$(printf 'info status\nquit\n' | timeout 20 "$wrapper" -accel tcg -m 32 -nodefaults -display none -monitor stdio 2>&1) ||
    { echo "qemu-unpacked: $wrapper does not start a machine: $out" >&2; exit 1; }
echo "$out" | grep -q 'VM status: running' || { echo "qemu-unpacked: $wrapper: $out" >&2; exit 1; }
rm -rf "$dir/debs"
echo "$want" >"$dir/stamp"
echo "$dir"
