#!/bin/sh
# Builds everything that ships into target/dist/: the static gpuhook, the dynamically
# linked gpuhook-libvirt and gpuhook-device-plugin (gRPC: Rust 1.88 or newer), man pages,
# shell completions, the .deb and the .rpm.
# Needs: cargo-deb, cargo-generate-rpm, libvirt-dev, pkg-config (scripts/deps.sh installs them).
set -eu
cd "$(dirname "$0")/.."
hook=$(./scripts/build-static.sh)
cargo build --release --locked -p gpuhook-libvirt -p gpuhook-device-plugin
rm -rf target/dist
cargo run --release --locked -q -p xtask -- dist target/dist
mkdir -p target/dist/bin
cp "$hook" target/release/gpuhook-libvirt target/release/gpuhook-device-plugin target/dist/bin/
ln -sfn gpuhook target/dist/bin/gpuhook-runtime
gzip -9nf target/dist/man/*.1
cargo deb --no-build --no-strip -p gpuhook -o target/dist/
cargo generate-rpm -p . -o target/dist/
file "$hook"
ls -l target/dist/*.deb target/dist/*.rpm
