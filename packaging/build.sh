#!/bin/sh
# Builds everything that ships into target/dist/: the static gpuhook, the dynamically
# linked gpuhook-libvirt, man pages, shell completions, the .deb and the .rpm.
# Needs: cargo-deb, cargo-generate-rpm, libvirt-dev, pkg-config (scripts/deps.sh installs them).
set -eu
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
# The hook: glibc linked statically (static-pie), no libvirt. Its own target directory keeps
# RUSTFLAGS off the build scripts and off the dynamic binary.
RUSTFLAGS='-C target-feature=+crt-static -C relocation-model=static' cargo build --release --locked --target "$target" -p gpuhook --bin gpuhook
cargo build --release --locked -p gpuhook-libvirt
hook="target/$target/release/gpuhook"
if ! file "$hook" | grep -q 'statically linked'; then
    echo "build.sh: $hook is not statically linked: $(file "$hook")" >&2
    exit 1
fi
if ldd target/release/gpuhook-libvirt | grep -q libvirt && ! ldd "$hook" 2>&1 | grep -q 'not a dynamic executable\|statically linked'; then
    echo "build.sh: $hook has dynamic dependencies" >&2
    exit 1
fi
rm -rf target/dist
cargo run --release --locked -q -p xtask -- dist target/dist
mkdir -p target/dist/bin
cp "$hook" target/release/gpuhook-libvirt target/dist/bin/
gzip -9nf target/dist/man/*.1
cargo deb --no-build --no-strip -p gpuhook -o target/dist/
cargo generate-rpm -p . -o target/dist/
file "$hook"
ls -l target/dist/*.deb target/dist/*.rpm
