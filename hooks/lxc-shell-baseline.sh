#!/bin/sh
# A hand-written libvirt LXC GPU hook, the way an operator would write one without gpuhook:
# flock + grep/sed on the domain XML, a text state file, nsenter + mknod, echo > devices.allow.
# It is the baseline gpuhook is benchmarked against (benches/, docs/BENCHMARKS.md): it works
# (NVIDIA GPUs, count or the blueprint's `gpus` extra_spec, cgroup v1), but it validates
# little, follows symlinks in the container and knows no topology. Do not deploy it.
#
#   GPUHOOK_SH_DEV    host /dev (default /dev)       GPUHOOK_SH_STATE  state file
set -eu
DEV=${GPUHOOK_SH_DEV:-/dev}
STATE=${GPUHOOK_SH_STATE:-/run/gpuhook-sh/state}
name=$1 op=$2
xml=$(cat)
case $xml in *urn:gpuhook:gpu:1*) ;; *) exit 0 ;; esac
uuid=$(printf '%s\n' "$xml" | sed -n 's:.*<uuid>\(.*\)</uuid>.*:\1:p' | head -n 1)
mkdir -p "$(dirname "$STATE")"
[ -e "$STATE" ] || : > "$STATE"
exec 9>"$STATE.lock"
case $op in
prepare)
    count=$(printf '%s\n' "$xml" | sed -n 's/.*gpus[^>]* count="\([0-9]*\)".*/\1/p' | head -n 1)
    [ -n "$count" ] || count=$(printf '%s\n' "$xml" | sed -n 's/.*name="gpus">[=> ]*\([0-9]*\)<.*/\1/p' | head -n 1)
    [ -n "$count" ] || count=1
    flock 9
    grep -q "^$uuid " "$STATE" && exit 0
    free="" n=0
    for node in "$DEV"/nvidia[0-9]*; do
        g=${node##*/}
        grep -q " $g\$" "$STATE" && continue
        free="$free $g" n=$((n + 1))
        [ "$n" -eq "$count" ] && break
    done
    if [ "$n" -lt "$count" ]; then
        echo "gpu hook: domain '$name': only $n of $count GPUs free" >&2
        exit 1
    fi
    for g in $free; do echo "$uuid $g"; done >> "$STATE"
    ;;
stopped|release)
    flock 9
    grep -v "^$uuid " "$STATE" > "$STATE.tmp" || true
    mv "$STATE.tmp" "$STATE"
    ;;
started|reconnect)
    ctrl=$(printf '%s\n' "$xml" | sed -n "s/.*<domain type='lxc' id='\([0-9]*\)'.*/\1/p" | head -n 1)
    init=""
    for c in $(cat /proc/"$ctrl"/task/*/children); do
        grep -q '^NSpid:.*[[:space:]]1$' /proc/"$c"/status && init=$c
    done
    [ -n "$init" ] || { echo "gpu hook: domain '$name': no container init" >&2; exit 1; }
    cg=$(sed -n 's/^[0-9]*:devices:\(.*\)/\1/p' /proc/"$init"/cgroup)
    for g in $(sed -n "s/^$uuid //p" "$STATE") nvidiactl nvidia-uvm nvidia-uvm-tools; do
        [ -e "$DEV/$g" ] || continue
        set -- $(stat -c '%t %T' "$DEV/$g")
        maj=$((0x$1)) min=$((0x$2))
        echo "c $maj:$min rw" > "/sys/fs/cgroup/devices$cg/devices.allow"
        # (mknod -m cannot chmod through /proc/self/fd in there: chmod by path after.)
        nsenter -t "$init" -m -- sh -c "[ -e /dev/$g ] || { mknod /dev/$g c $maj $min && chmod 666 /dev/$g; }"
    done
    ;;
esac
exit 0
