#!/bin/sh
# On a host with a real NVIDIA GPU and driver: what gpuhook sees beside what nvidia-smi sees,
# then the GPU's nodes made in a fresh mount namespace through gpuhook's own code path
# (its prepare and started hooks, against a process tree shaped like a libvirt container:
# `unshare` plays libvirt_lxc, its child is PID 1 of a new PID namespace with a tmpfs /dev).
#
#   sudo scripts/real-gpu-check.sh [GPUHOOK_BIN]
#
# GPUHOOK_CHECK_ROOTS=CONFIG.json describes another host (a fake one, to test this script).
# Where nvidia-ctk is installed, `gpuhook driver --json` (driver="host") is compared with
# `nvidia-ctk cdi generate`: the same driver version, the same files (by their host file),
# no library of another version in either.
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

# MPS: GPU 0 shared with mode mps (two slots, limits), one reservation: the daemon runs with
# exactly its environment and its own /dev/shm, and gets `quit` at the free.
mps_pci=$(sed -n 's/.*"pci": *"\([0-9a-f:.]*\)".*/\1/p' "$work/list.json" | head -n 1)
if [ -n "$mps_pci" ] && [ -x /usr/bin/nvidia-cuda-mps-control ]; then
    echo "== MPS on $mps_pci:"
    sed "s|^{|{\"sharing\": {\"$mps_pci\": {\"replicas\": 2, \"mode\": \"mps\", \"memory_limit_mib\": 1024, \"active_thread_percentage\": 50}},|" "$work/config.json" > "$work/mps.json"
    export GPUHOOK_CONFIG="$work/mps.json"
    mxml="<domain type='lxc'><name>gpuhook-mps-check</name><uuid>6a1c2c5e-0e4f-4f7b-9a51-3e1f0c2d4b89</uuid><metadata><gpu:gpus xmlns:gpu=\"urn:gpuhook:gpu:1\" count=\"1\" share=\"yes\"/></metadata></domain>"
    echo "$mxml" | "$bin" -v hook gpuhook-mps-check prepare begin -
    mpid=$(sed -n 's/.*"mps":{"[^"]*":{"proc":{"pid":\([0-9]*\).*/\1/p' "$work/state.json")
    mdir=$(sed -n 's/.*"mps":{.*"dir":"\([^"]*\)".*/\1/p' "$work/state.json")
    [ -n "$mpid" ] && kill -0 "$mpid" || { echo "FAIL: no MPS daemon recorded/running"; exit 1; }
    echo "daemon pid $mpid, dir $mdir: $(tr '\0' ' ' < /proc/"$mpid"/cmdline)"
    env=$(tr '\0' '\n' < /proc/"$mpid"/environ | sort)
    echo "$env"
    uuid=$(basename "$mdir")
    [ "$env" = "$(printf 'CUDA_MPS_LOG_DIRECTORY=%s/log\nCUDA_MPS_PIPE_DIRECTORY=%s/pipe\nCUDA_VISIBLE_DEVICES=%s\n' "$mdir" "$mdir" "$uuid")" ] \
        || { echo "FAIL: the daemon's environment is not exactly its three variables"; exit 1; }
    # Its /dev/shm is DIR/shm (same device and inode), in a mount namespace of its own.
    [ "$(stat -L -c %d:%i /proc/"$mpid"/root/dev/shm)" = "$(stat -c %d:%i "$mdir/shm")" ] \
        && [ "$(readlink /proc/"$mpid"/ns/mnt)" != "$(readlink /proc/self/ns/mnt)" ] \
        || { echo "FAIL: the daemon's /dev/shm is not $mdir/shm"; exit 1; }
    ls -l "$mdir/pipe"
    echo get_default_active_thread_percentage | env -i CUDA_MPS_PIPE_DIRECTORY="$mdir/pipe" CUDA_MPS_LOG_DIRECTORY="$mdir/log" /usr/bin/nvidia-cuda-mps-control
    # Containers get the pipe directory read-only: a client must still reach the daemon so.
    unshare -m sh -c "mount --make-rprivate / && mount --bind '$mdir/pipe' /mnt && mount -o remount,bind,ro /mnt && echo get_default_active_thread_percentage | env -i CUDA_MPS_PIPE_DIRECTORY=/mnt CUDA_MPS_LOG_DIRECTORY='$mdir/log' /usr/bin/nvidia-cuda-mps-control" \
        || { echo "FAIL: an MPS client cannot reach the daemon through a read-only pipe directory"; exit 1; }
    # A CUDA client (cuInit through libcuda, no toolkit needed) as a sharer's container runs
    # it: the pipe directory read-only at /tmp/nvidia-mps, the daemon's shm at /dev/shm.
    if command -v gcc >/dev/null; then
        printf '%s\n' '#include <dlfcn.h>' '#include <stdio.h>' \
            'int main(void){void*h=dlopen("libcuda.so.1",RTLD_NOW);if(!h){puts(dlerror());return 2;}' \
            'int(*i)(unsigned)=(int(*)(unsigned))dlsym(h,"cuInit");int(*c)(int*)=(int(*)(int*))dlsym(h,"cuDeviceGetCount");' \
            'int n=-1,r=i(0);if(!r)r=c(&n);printf("cuInit/cuDeviceGetCount: %d, %d device(s)\n",r,n);return r!=0;}' > "$work/cuinit.c"
        gcc -o "$work/cuinit" "$work/cuinit.c" -ldl
        unshare -m sh -c "mount --make-rprivate / && mkdir -p /tmp/nvidia-mps && mount --bind '$mdir/pipe' /tmp/nvidia-mps && mount -o remount,bind,ro /tmp/nvidia-mps && mount --bind '$mdir/shm' /dev/shm && env -i '$work/cuinit'" \
            || { echo "FAIL: a CUDA client does not run through the read-only pipe directory"; tail -n 5 "$mdir/log/control.log"; exit 1; }
        grep -i "client" "$mdir/log/control.log" | tail -n 2
    fi
    echo "$mxml" | "$bin" -v hook gpuhook-mps-check release end -
    for _ in $(seq 100); do kill -0 "$mpid" 2>/dev/null || break; sleep 0.1; done
    ! kill -0 "$mpid" 2>/dev/null || { echo "FAIL: daemon $mpid still runs after the free"; exit 1; }
    grep -i "quit" "$mdir/log/control.log" | tail -n 1
    echo "== MPS: daemon started with its environment, stopped by quit at the free"
fi

# driver="host": what gpuhook finds of the running driver beside what NVIDIA's generator names.
echo "== gpuhook driver:"
if "$bin" driver --json > "$work/driver.json"; then
    "$bin" driver
    if command -v nvidia-ctk >/dev/null; then
        nvidia-ctk cdi generate --format=json --output="$work/nvidia-ctk.json" > "$work/ctk.log" 2>&1 \
            || { cat "$work/ctk.log"; echo "FAIL: nvidia-ctk cdi generate"; exit 1; }
        python3 - "$work/driver.json" "$work/nvidia-ctk.json" <<'PY'
import json, os, re, sys
gh = json.load(open(sys.argv[1]))
ctk = json.load(open(sys.argv[2]))
v = gh["version"]
edits = [ctk.get("containerEdits", {})] + [d.get("containerEdits", {}) for d in ctk.get("devices", [])]
mounts = {os.path.realpath(m["hostPath"]): m["containerPath"] for e in edits for m in e.get("mounts", []) or []}
hooks = [a for e in edits for h in e.get("hooks", []) or [] for a in h.get("args", [])]
ctk_v = [a.split("=", 1)[1] for a in hooks if a.startswith("--host-driver-version=")]
mine = {os.path.realpath(f["source"]): f for f in gh["files"]}
fail = False
print(f"gpuhook: driver {v}, {len(mine)} files; nvidia-ctk: driver {ctk_v[0] if ctk_v else '?'}, {len(mounts)} mounts")
if ctk_v and ctk_v[0] != v:
    print(f"FAIL: nvidia-ctk says driver {ctk_v[0]}, gpuhook {v}"); fail = True
def other(p):
    m = re.search(r"\.so\.(\d{3,}\.\d+(\.\d+)?)$", p) or re.search(r"/firmware/nvidia/([\d.]+)/", p)
    return m and m.group(1) != v
for name, paths in (("gpuhook", mine), ("nvidia-ctk", mounts)):
    bad = [p for p in paths if other(p)]
    if bad:
        print(f"FAIL: {name} gives files of another driver: {bad}"); fail = True
only_gh = sorted(set(mine) - set(mounts))
only_ctk = sorted(set(mounts) - set(mine))
for p in only_gh:
    print(f"  only gpuhook:    {mine[p]['kind']:<8} {mine[p]['path']} ({p})")
for p in only_ctk:
    print(f"  only nvidia-ctk: {mounts[p]} ({p})")
both = set(mine) & set(mounts)
moved = [p for p in both if mine[p]["path"] != mounts[p]]
for p in sorted(moved):
    print(f"  other place: gpuhook {mine[p]['path']}, nvidia-ctk {mounts[p]}")
libs = [p for p in mine if mine[p]["kind"] == "library"]
missing = [p for p in mounts if re.search(r"\.so\.[\d.]+$", p) and p not in mine and not other(p)]
print(f"== {len(both)} files given by both; {len(only_gh)} only by gpuhook, {len(only_ctk)} only by nvidia-ctk ({len(missing)} of them libraries of {v})")
sys.exit(1 if fail else 0)
PY
    else
        echo "(nvidia-ctk not installed: no comparison with nvidia-ctk cdi generate)"
    fi
else
    echo "(driver=\"host\" has nothing to give here)"
fi
# health scan waits for the GPU's own state before a memory error's Xid quarantines it: the
# query it runs (the fields of SMI_FIELDS in src/reserve/health/confirm.rs), on the first GPU.
# A field this driver's nvidia-smi does not know makes it refuse the whole query: the scan
# then trusts the driver's record (and says so).
smi_pci=$(sed -n 's/.*"pci": *"\([0-9a-f:.]*\)".*/\1/p' "$work/list.json" | head -n 1)
if [ -n "$smi_pci" ] && [ -x /usr/bin/nvidia-smi ]; then
    echo "== nvidia-smi's memory error counters of $smi_pci, as health scan asks for them:"
    /usr/bin/nvidia-smi --query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure \
        --format=csv,noheader,nounits -i "$smi_pci" ||
        echo "(refused: health scan cannot confirm a memory error's Xid with this nvidia-smi)"
fi
# health reset (docs/guides/health.md): the first GPU, idle
# (nothing holds it; a process with one of its nodes open, nvidia-persistenced for one, makes
# gpuhook refuse in one line naming it), reset with the default reset_command
# (nvidia-smi --gpu-reset -i PCI), re-probed (config space, the driver's list, GPU Excluded),
# and how long it took.
reset_pci=$(sed -n 's/.*"pci": *"\([0-9a-f:.]*\)".*/\1/p' "$work/list.json" | head -n 1)
if [ -n "$reset_pci" ] && [ -x /usr/bin/nvidia-smi ]; then
    export GPUHOOK_CONFIG="$work/config.json"
    echo "== health reset $reset_pci (nvidia-smi --gpu-reset):"
    t0=$(date +%s.%N)
    if "$bin" -v health reset "$reset_pci"; then rc=0; else rc=$?; fi
    t1=$(date +%s.%N)
    echo "health reset: exit $rc after $(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }") s"
    "$bin" list | grep -F "$reset_pci"
    if [ "$rc" -ne 0 ]; then
        echo "(refused or failed: the line above says why; stop what holds the GPU open, e.g. systemctl stop nvidia-persistenced, and run again)"
        exit 1
    fi
    echo "== health reset: the GPU is back, every probe passes"
fi
