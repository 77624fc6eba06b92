#!/bin/sh
# On a host with a real NVIDIA GPU and driver: what gpuhook sees beside what nvidia-smi sees,
# then the GPU's nodes made in a fresh mount namespace through gpuhook's own code path
# (its prepare and started hooks, against a process tree shaped like a libvirt container:
# `unshare` plays libvirt_lxc, its child is PID 1 of a new PID namespace with a tmpfs /dev).
#
#   sudo scripts/real-gpu-check.sh [GPUHOOK_BIN]
#
# GPUHOOK_CHECK_ROOTS=CONFIG.json describes another host (a fake one, to test this script).
set -eu
bin=${1:-$(command -v gpuhook || echo target/release/gpuhook)}
work=$(mktemp -d /tmp/gpuhook-real-check.XXXXXX)
trap 'kill "${init:-}" "$ctl" 2>/dev/null || true; rm -rf "$work"' EXIT
if [ -n "${GPUHOOK_CHECK_ROOTS:-}" ]; then
    sed "s|\"state_file\": *\"[^\"]*\"|\"state_file\": \"$work/state.json\"|" "$GPUHOOK_CHECK_ROOTS" > "$work/config.json"
else
    printf '{"state_file": "%s/state.json"}\n' "$work" > "$work/config.json"
fi
export GPUHOOK_CONFIG="$work/config.json"

echo "== gpuhook $("$bin" --version | cut -d' ' -f2) sees:"
"$bin" list
"$bin" list --json > "$work/list.json"
echo "== nvidia-smi -L:"
nvidia-smi -L 2>&1 || echo "(nvidia-smi not available)"
echo "== driver: $(head -n 1 /proc/driver/nvidia/version 2>/dev/null || echo 'no /proc/driver/nvidia/version')"
echo "== host nodes:"
ls -l /dev/nvidia* 2>/dev/null || true

# A container-shaped process tree: controller (unshare) -> init (PID 1, own mount ns, tmpfs /dev).
unshare --mount --pid --fork --kill-child --propagation private -- sh -c 'mount -t tmpfs -o mode=755,size=64k gpuhook-check /dev && exec sleep 600' &
ctl=$!
for _ in $(seq 50); do
    init=$(cat /proc/"$ctl"/task/*/children 2>/dev/null | awk '{print $1}')
    [ -n "$init" ] && nsenter -t "$init" -m -- sh -c 'mountpoint -q /dev' 2>/dev/null && break
    sleep 0.1
done
xml="<domain type='lxc' id='$ctl'><name>gpuhook-real-check</name><uuid>6a1c2c5e-0e4f-4f7b-9a51-3e1f0c2d4b88</uuid><metadata><gpu:gpus xmlns:gpu=\"urn:gpuhook:gpu:1\" count=\"1\" vendor=\"nvidia\"/></metadata></domain>"
echo "== prepare (1 NVIDIA GPU):"
echo "$xml" | "$bin" -v hook gpuhook-real-check prepare begin -
echo "== started (controller $ctl, init $init):"
echo "$xml" | "$bin" -v hook gpuhook-real-check started begin -
echo "== nodes inside the fresh mount namespace:"
nsenter -t "$init" -m -- ls -l /dev
echo "== the same numbers on the host:"
dev=$(sed -n 's/.*"dev": *"\([^"]*\)".*/\1/p' "$work/config.json")
for n in $(nsenter -t "$init" -m -- sh -c 'ls /dev | grep -E "^nvidia"'); do
    stat -c "%n %Hr:%Lr" "${dev:-/dev}/$n"
done
"$bin" list
echo "$xml" | "$bin" hook gpuhook-real-check release end -
echo "== released; reservation gone:"
"$bin" list
