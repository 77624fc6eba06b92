#!/bin/sh
# Runs each cargo-fuzz target for SECONDS (default 20) on its kept corpus; fails on a crash.
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP lets the stable toolchain build them.
set -eu
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
secs=${1:-20}
for t in metadata extra_specs config state cdi; do
    mkdir -p "corpus/$t"
    log=$(mktemp)
    if ! RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$t" "corpus/$t" -- -max_total_time="$secs" -max_len=8192 >"$log" 2>&1; then
        tail -40 "$log"
        echo "fuzz: $t FAILED (artifact in fuzz/artifacts/$t)" >&2
        rm -f "$log"
        exit 1
    fi
    echo "$t: $(grep -E '^#[0-9]+' "$log" | tail -1)"
    rm -f "$log"
done
