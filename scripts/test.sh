#!/bin/sh
# The whole test suite, as `sudo make test` and .ci/run run it (root, Debian/Ubuntu).
# Installs what it needs; fails loudly if anything, libvirtd included, cannot run.
set -eu
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
step() { printf '\n==== %s\n' "$*"; }

step "dependencies"
./scripts/deps.sh full
step "format and lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
step "structure (file circles, rooms, sizes, unsafe, config, holders, type names, string errors, docs)"
# The kinds that fail the suite (all: circles,rooms,size,unsafe,config,holders,dupes,errors,docs).
STRUCTURE_DENY=${STRUCTURE_DENY:-all}
cargo run -q -p xtask --locked -- structure --deny "$STRUCTURE_DENY"
step "build"
cargo build --workspace --locked
step "unit and integration tests (fake hosts, cgroup v1/v2, real libvirtd)"
cargo test --workspace --locked
step "podman's and runc's own bats suites: runc, gpuhook-runtime, gpuhook-runtime with a GPU"
./scripts/field-suites.sh
step "packages"
./packaging/build.sh
step "the packages, unpacked (lint, contents, the static binary under the OCI and libvirt suites)"
./scripts/package-test.sh
step "a real Debian 13 host under qemu: packages installed, upgraded and purged; libvirt, podman, hotplug"
cargo test --locked --test debian13
step "bounded fuzz pass"
./scripts/fuzz.sh 20
step "all tests passed"
