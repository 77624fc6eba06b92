#!/bin/sh
# Builds the hook exactly as it ships: glibc linked statically, not PIE (`file` reports
# "statically linked"), no libvirt. Its own target directory keeps RUSTFLAGS off build
# scripts and off the dynamically linked gpuhook-libvirt. Prints the binary's path.
set -eu
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
RUSTFLAGS='-C target-feature=+crt-static -C relocation-model=static' \
    cargo build --release --locked --target "$target" -p gpuhook --bin gpuhook >&2
hook="target/$target/release/gpuhook"
if ! file "$hook" | grep -q 'statically linked'; then
    echo "build-static.sh: $hook is not statically linked: $(file "$hook")" >&2
    exit 1
fi
echo "$PWD/$hook"
