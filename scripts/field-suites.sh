#!/bin/sh
# Other projects' tests: a subset of podman's test/system/*.bats and runc's
# tests/integration/*.bats, from Debian's sources of the installed versions (deps.sh full
# fetches them), run three times on private storage with a local busybox image:
#   runc     the runtime is runc itself
#   gpuhook  gpuhook-runtime (a link to the gpuhook under test; oci_runtime = runc)
#   gpu      the same, with a GPU request (annotation gpuhook.io/gpus=1) put into every
#            container's config.json by a shim, on a fake 16-GPU host
# The results must be identical test for test; the only differences allowed are those
# docs/FIELD-SUITES.md lists (and the tests it lists as skipped are skipped in all runs).
# Usage: scripts/field-suites.sh [GPUHOOK]   (as root; default target/debug/gpuhook)
set -eu
cd "$(dirname "$0")/.."
repo=$(pwd)
doc=$repo/docs/FIELD-SUITES.md
helper="/usr/bin/python3 -B $repo/scripts/field_suites.py"
bin=$(readlink -f "${1:-target/debug/gpuhook}")
testbed=$repo/target/debug/gpuhook-testbed
src=${GPUHOOK_FIELD_SRC:-/var/cache/gpuhook-field-suites}
# GPUHOOK_FIELD_RUNS, _PODMAN, _RUNC: fewer runs or files, for trying by hand (no comparison then)
runs=${GPUHOOK_FIELD_RUNS:-runc gpuhook gpu}
podman_files=${GPUHOOK_FIELD_PODMAN-030-run 045-start 055-rm 075-exec 080-pause 130-kill 170-run-userns 190-run-ipcns}
runc_files=${GPUHOOK_FIELD_RUNC-create delete dev exec kill list mask mounts pause ps run start start_detached start_hello state userns cwd umask no_pivot}
# 030-run.bats has 46 tests (~85 s a run): the ones about what a runtime is handed and
# does (its command line, flags, fds, id mappings, cgroup rules, exit paths).
run030='^podman run (- basic tests|- global runtime option|--memory=0 runtime option|--preserve-fds|- uidmapping has no /sys/kernel mounts|--rm|--name|--conmon-pidfile --cidfile|: user namespace preserved root ownership|: full path to --runtime is preserved|--timeout - basic test|--device-cgroup-rule tests|closes stdin|--attach stdin prints container ID|doesn.t override oom-score-adj)$|^Verify /run/.containerenv exist$|^podman create --security-opt$'
die() { echo "field-suites: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root"
for t in bats jq gawk cc script podman conmon /usr/sbin/runc /bin/busybox /usr/bin/python3; do
    command -v "$t" >/dev/null || die "$t missing: run scripts/deps.sh full"
done
[ -x "$bin" ] && [ -x "$testbed" ] || die "$bin or $testbed missing: cargo build --workspace"
upstream() { v=$(dpkg-query -W -f='${source:Version}' "$1") && v=${v#*:} && echo "${v%-*}"; }
podsrc=$src/libpod-$(upstream podman)/test/system
runcsrc=$src/runc-$(upstream runc)/tests/integration
[ -f "$podsrc/helpers.bash" ] && [ -f "$runcsrc/helpers.bash" ] ||
    die "no sources of the installed podman and runc in $src: run scripts/deps.sh full"

w=$(mktemp -d /var/tmp/gpuhook-field.XXXXXX)
chmod 711 "$w" # runc's userns tests mount the rootfs as a mapped root
cleanup() {
    for r in runc gpuhook gpu; do
        [ -f "$w/$r/containers.conf" ] || continue
        CONTAINERS_CONF=$w/$r/containers.conf CONTAINERS_STORAGE_CONF=$w/$r/storage.conf \
            podman rm -a -f -t 0 >/dev/null 2>&1 || true
    done
    awk -v w="$w" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do
        umount -l "$m" || true
    done
    # 030-run's "full path to --runtime" test copies the runtime to /var/tmp/myruntime…
    # and removes it only when it passes.
    for f in /var/tmp/myruntime*; do grep -qs "$w" "$f" && rm -f "$f"; done
    rm -rf "$w"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
start=$(date +%s)

# The image: busybox-static with every applet, users and groups as in docker's busybox, and
# what podman's testimage adds (/home/podman/testimage-id, pause, its workdir and command).
r=$w/rootfs
mkdir -p "$r/bin" "$r/etc" "$r/home/podman" "$r/root" "$r/tmp" "$r/var" "$r/dev" "$r/proc" "$r/sys"
chmod 1777 "$r/tmp"
cp /bin/busybox "$r/bin/busybox"
for a in $("$r/bin/busybox" --list); do [ -e "$r/bin/$a" ] || ln -s busybox "$r/bin/$a"; done
mkdir -p "$r/usr" "$r/sbin" && ln -s ../bin "$r/usr/bin" && ln -s ../bin "$r/usr/sbin"
cat >"$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
EOF
printf '%s\n' root:x:0: daemon:x:1: bin:x:2: sys:x:3: adm:x:4: tty:x:5: disk:x:6: lp:x:7: \
    mail:x:8: kmem:x:9: wheel:x:10:root cdrom:x:11: dialout:x:18: floppy:x:19: video:x:28: \
    audio:x:29: tape:x:32: www-data:x:33: operator:x:37: utmp:x:43: plugdev:x:46: \
    staff:x:50: lock:x:54: netdev:x:82: users:x:100: nogroup:x:65534: >"$r/etc/group"
echo busybox >"$r/home/podman/testimage-id"
printf 'echo Confirmed: testimage pause invoked as $0\nwhile :; do\n    sleep 0.1\ndone\n' >"$r/home/podman/pause"
chmod 755 "$r/home/podman/pause"
tar -C "$r" -cf "$w/busybox.tar" .

# The fake GPU host, gpuhook-runtime (a link named so) and the GPU shim.
"$testbed" fakehost wide16 "$w/host" >/dev/null
jq '.oci_runtime = "/usr/sbin/runc"' "$w/host/config.json" >"$w/host/c" && mv "$w/host/c" "$w/host/config.json"
chmod 644 "$w/host/config.json"
mkdir -p "$w/link" "$w/rt"
ln -s "$bin" "$w/link/gpuhook-runtime"
printf '#!/bin/sh\nGPUHOOK_CONFIG=%s exec %s "$@"\n' "$w/host/config.json" "$w/link/gpuhook-runtime" >"$w/rt/gpuhook"
sed "s|@NEXT@|$w/rt/gpuhook|" scripts/field-suites-gpu-shim >"$w/rt/gpu"
chmod 755 "$w/rt/gpuhook" "$w/rt/gpu"
# Reservations held by a live holder (a stale one, whose create or init is gone, is taken
# by the next request: docs/guides/oci.md, "Crashes").
held() { GPUHOOK_CONFIG=$w/host/config.json "$bin" list --json | jq '[.reservations[]? | select(.holder.stale != true)] | length'; }

# The suites, copied; the tests docs/FIELD-SUITES.md lists as skipped get a `skip`.
$helper prepare "$podsrc" "$w/podman-tests" podman "$doc"
mkdir -p "$w/runc-src/tests" "$w/runc-src/contrib/cmd/recvtty"
$helper prepare "$runcsrc" "$w/runc-src/tests/integration" runc "$doc"
# runc's get-images.sh downloads images: ours is local (no debian image: tests wanting it are skipped).
printf '#!/bin/sh\necho BUSYBOX_IMAGE=%s\necho DEBIAN_IMAGE=/nonexistent/debian.tar.xz\n' "$w/busybox.tar" \
    >"$w/runc-src/tests/integration/get-images.sh"
cc -O2 -pthread -o "$w/runc-src/contrib/cmd/recvtty/recvtty" scripts/field-suites-recvtty.c
chmod 755 "$w/runc-src/tests/integration/get-images.sh"

# Does the runtime `$1` hand the busybox container a GPU? (the probe: its /dev)
runc_probe() {
    b=$w/probe-$2 && mkdir -p "$b" && (cd "$b" && /usr/sbin/runc spec)
    jq --arg r "$r" '.root = {path: $r, readonly: true} | .process.terminal = false
        | .process.args = ["sh", "-c", "ls /dev"]' "$b/config.json" >"$b/c" && mv "$b/c" "$b/config.json"
    "$1" --root "$w/probe-root" run --bundle "$b" "probe-$2" | grep -c '^nvidia[0-9]' || true
}

for run in $runs; do
    case $run in
    runc) rt=/usr/sbin/runc ;;
    *) rt=$w/rt/$run ;;
    esac
    d=$w/$run
    mkdir -p "$d/tmp" "$w/results/$run" && chmod 711 "$d" "$d/tmp"
    cat >"$d/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$d/root"
runroot = "$d/runroot"
EOF
    cat >"$d/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
netns = "none"
[network]
network_config_dir = "$d/networks"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$d/events.log"
tmp_dir = "$d/libpod-tmp"
static_dir = "$d/root/libpod"
volume_path = "$d/root/volumes"
runtime = "runc"
[engine.runtimes]
runc = ["$rt"]
EOF
    export CONTAINERS_CONF=$d/containers.conf CONTAINERS_STORAGE_CONF=$d/storage.conf TMPDIR=$d/tmp
    export PODMAN_TEST_IMAGE_REGISTRY=localhost PODMAN_TEST_IMAGE_USER=gpuhook \
        PODMAN_TEST_IMAGE_NAME=testimage PODMAN_TEST_IMAGE_TAG=busybox
    image=localhost/gpuhook/testimage:busybox
    podman import -q --change 'WORKDIR=/home/podman' \
        --change 'CMD ["/bin/echo", "This container is intended for podman CI testing"]' \
        "$w/busybox.tar" "$image" >/dev/null
    # The injection is what tells the runs apart: a GPU in the gpu run's containers only.
    n=$(podman run --rm "$image" ls /dev | grep -c '^nvidia[0-9]' || true)
    m=$(runc_probe "$rt" "$run")
    want=0 && [ $run = gpu ] && want=1
    [ "$n" = $want ] && [ "$m" = $want ] || die "$run: podman container has $n GPUs, runc's $m (want $want)"
    printf '\n== run %s (runtime %s)\n' $run "$rt"
    for f in $podman_files; do
        t0=$(date +%s)
        flt='.' && [ "$f" != 030-run ] || flt=$run030
        bats --tap --filter "$flt" "$w/podman-tests/$f.bats" >"$w/results/$run/podman--$f.bats.tap" 2>"$w/results/$run/podman--$f.err" || true
        printf '  podman %-16s %3ss  %s\n' $f $(($(date +%s) - t0)) "$(grep -c '^not ok' "$w/results/$run/podman--$f.bats.tap" || true) not ok"
    done
    for f in $runc_files; do
        t0=$(date +%s)
        # On a terminal, as runc's own CI runs it (`script -e -c`): `runc run` of a bundle
        # with `terminal: true` opens /dev/tty.
        script -qec "RUNC=$rt bats --tap $w/runc-src/tests/integration/$f.bats >$w/results/$run/runc--$f.bats.tap 2>$w/results/$run/runc--$f.err" /dev/null </dev/null >/dev/null || true
        printf '  runc   %-16s %3ss  %s\n' $f $(($(date +%s) - t0)) "$(grep -c '^not ok' "$w/results/$run/runc--$f.bats.tap" || true) not ok"
    done
    podman rm -a -f -t 0 >/dev/null 2>&1 || true
    [ -z "${GPUHOOK_FIELD_KEEP:-}" ] || { mkdir -p "$GPUHOOK_FIELD_KEEP" && cp -r "$w/results" "$GPUHOOK_FIELD_KEEP/"; }
    [ $run = runc ] || GPUHOOK_CONFIG=$w/host/config.json "$bin" list | grep stale || true
    [ $run = runc ] || [ "$(held)" = 0 ] || die "$run: GPUs still held after the suites: $(GPUHOOK_CONFIG=$w/host/config.json "$bin" list)"
done
unset CONTAINERS_CONF CONTAINERS_STORAGE_CONF

[ "$runs" = "runc gpuhook gpu" ] || { echo "field-suites: runs $runs only: no comparison"; exit 0; }
printf '\n== comparison (%ss)\n' $(($(date +%s) - start))
$helper compare "$doc" "$w/results"

# The comparison can fail: one flipped result, one missing file, each must be caught.
cp -r "$w/results" "$w/flipped"
f=$(grep -l '^ok ' "$w/flipped/gpuhook/"*.tap | head -n 1)
sed -i '0,/^ok /s//not ok /' "$f"
! $helper compare "$doc" "$w/flipped" >/dev/null 2>&1 || die "a flipped result went unnoticed"
rm -rf "$w/flipped" && cp -r "$w/results" "$w/flipped" && rm "$w/flipped/gpu/runc--kill.bats.tap"
! $helper compare "$doc" "$w/flipped" >/dev/null 2>&1 || die "a missing file went unnoticed"
echo "field-suites: passed in $(($(date +%s) - start)) s"
