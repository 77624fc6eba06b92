#!/bin/sh
# Benchmarks (docs/BENCHMARKS.md): builds the static hook as shipped and a static no-op,
# then runs benches/hook.rs, which measures gpuhook against both baselines in one run,
# benches/runtime.rs (gpuhook-runtime against the runtime called directly) and benches/cri.rs
# (a pod's container started through the CRI on gpuhook's handler against containerd's runc)
# and gpuhook-device-plugin/benches/plugin.rs (the device plugin). BENCH_BASELINE=another
# gpuhook binary adds A/B rows (hook.rs, runtime.rs) measured in the same run.
set -eu
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
hook=$(./scripts/build-static.sh)
mkdir -p target/bench
printf 'int main(void) { return 0; }\n' > target/bench/noop.c
gcc -O2 -static -o target/bench/noop target/bench/noop.c
gcc -O2 -static -o target/bench/rss benches/rss.c
echo "machine: $(nproc) CPU ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(uname -r), $(free -g | awk '/Mem:/{print $2}') GiB"
BENCH_HOOK="$hook" BENCH_NOOP="$PWD/target/bench/noop" \
BENCH_SHELL="$PWD/hooks/lxc-shell-baseline.sh" BENCH_RSS="$PWD/target/bench/rss" cargo bench --locked --bench hook -- "$@"
BENCH_HOOK="$hook" BENCH_NOOP="$PWD/target/bench/noop" cargo bench --locked --bench runtime
BENCH_HOOK="$hook" cargo bench --locked --bench cri
# The device plugin: a pool change to ListAndWatch (median, worst of 100), idle CPU over a
# minute, resident memory.
cargo bench --locked -p gpuhook-device-plugin --bench plugin
