#!/bin/sh
# Runs each cargo-fuzz target for SECONDS (default 20) on its kept corpus; fails on a crash.
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP lets the stable toolchain build them.
# The work tree stays clean: fuzz/Cargo.lock must be current (checked with --locked before the
# build), and the inputs the fuzzer finds go to a scratch corpus outside the tree
# (FUZZ_CORPUS_DIR, default target/fuzz-corpus/TARGET); the kept corpus, fuzz/corpus/TARGET, is
# only read (libFuzzer writes new inputs to its first corpus directory only). To keep a finding,
# copy it from the scratch corpus into fuzz/corpus/TARGET.
set -eu
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
secs=${1:-20}
scratch=${FUZZ_CORPUS_DIR:-$(cd .. && pwd)/target/fuzz-corpus}
if ! cargo metadata --locked --format-version 1 >/dev/null; then
    echo "fuzz: fuzz/Cargo.lock is out of date: run 'cargo update -w' in fuzz/ and commit it" >&2
    exit 1
fi
for t in metadata hostdev extra_specs config state cdi ldcache; do
    mkdir -p "$scratch/$t"
    log=$(mktemp)
    if ! RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$t" "$scratch/$t" "corpus/$t" -- -max_total_time="$secs" -max_len=8192 >"$log" 2>&1; then
        tail -40 "$log"
        echo "fuzz: $t FAILED (artifact in fuzz/artifacts/$t)" >&2
        rm -f "$log"
        exit 1
    fi
    echo "$t: $(grep -E '^#[0-9]+' "$log" | tail -1)"
    rm -f "$log"
done
