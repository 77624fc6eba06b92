# The two set-up commands (README): `sudo make demo` and `sudo make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:/root/.cargo/bin:$(PATH)

.PHONY: demo test packages bench fuzz

# Install libvirt's LXC driver, build gpuhook, run its main job under a real libvirtd.
demo:
	./scripts/deps.sh
	cargo build --release --locked -p gpuhook -p testbed
	./target/release/gpuhook-testbed demo --hook ./target/release/gpuhook

# The whole test suite (what .ci/run runs).
test:
	./scripts/test.sh

# Static gpuhook, gpuhook-libvirt, man pages, completions, .deb and .rpm in target/dist/.
packages:
	./scripts/deps.sh full
	./packaging/build.sh

# Benchmarks against a static no-op and a hand-written shell hook (docs/BENCHMARKS.md).
bench:
	./scripts/deps.sh full
	./benches/run.sh

# Longer fuzzing (seconds per target).
fuzz:
	./scripts/fuzz.sh 300
