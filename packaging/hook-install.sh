# Shared by the .deb and .rpm scripts (sourced): install/remove gpuhook as libvirt's LXC hook
# and as its QEMU hook (virtual machines' GPU hostdevs), the same binary.
GPUHOOK_BIN=/usr/bin/gpuhook
GPUHOOK_DRIVERS="lxc qemu"

gpuhook_is_ours() { [ -L "$1" ] && [ "$(readlink "$1")" = "$GPUHOOK_BIN" ]; }

# hooks/DRIVER, or hooks/DRIVER.d/50-gpuhook beside a foreign hooks/DRIVER (libvirt >= 6.5
# runs both). Prints "new" when a link was created (libvirt must restart to see it).
gpuhook_install_one() {
    hook=/etc/libvirt/hooks/$1
    dropin=/etc/libvirt/hooks/$1.d/50-gpuhook
    if gpuhook_is_ours "$hook" || gpuhook_is_ours "$dropin"; then
        return 0
    fi
    if [ -e "$hook" ] || [ -L "$hook" ]; then
        # A foreign hook is there: leave it alone.
        mkdir -p "/etc/libvirt/hooks/$1.d"
        ln -sfn "$GPUHOOK_BIN" "$dropin"
    else
        ln -s "$GPUHOOK_BIN" "$hook"
    fi
    echo new
}

# Prints "new" when any hook link was created.
gpuhook_install_hook() {
    mkdir -p /etc/libvirt/hooks
    made=
    for d in $GPUHOOK_DRIVERS; do
        [ -n "$(gpuhook_install_one "$d")" ] && made=new
    done
    [ -z "$made" ] || echo new
}

gpuhook_remove_hook() {
    for d in $GPUHOOK_DRIVERS; do
        for f in "/etc/libvirt/hooks/$d" "/etc/libvirt/hooks/$d.d/50-gpuhook"; do
            if gpuhook_is_ours "$f"; then rm -f "$f"; fi
        done
        rmdir "/etc/libvirt/hooks/$d.d" 2>/dev/null || true
    done
}

# The libvirt daemons that run hooks: the monolithic one and the LXC and QEMU drivers' own.
GPUHOOK_LIBVIRT_DAEMONS="libvirtd virtlxcd virtqemud"

# libvirt only notices hooks present when it starts: restart the daemons that run.
gpuhook_restart_libvirt() {
    [ -d /run/systemd/system ] || return 0
    for svc in $GPUHOOK_LIBVIRT_DAEMONS; do
        if systemctl is-active --quiet "$svc.service" 2>/dev/null; then
            systemctl restart "$svc.service" || echo "gpuhook: could not restart $svc; restart it to activate the hook" >&2
        fi
    done
}

gpuhook_runtime_dir() {
    if command -v systemd-tmpfiles >/dev/null 2>&1; then
        systemd-tmpfiles --create gpuhook.conf >/dev/null 2>&1 || true
    fi
    [ -d /run/gpuhook ] || install -d -m 0700 /run/gpuhook
}

# The .rpm's /usr/bin/gpuhook-runtime (the .deb ships it as a link): made here, never over a
# file that is not gpuhook's.
gpuhook_install_runtime_link() {
    if [ ! -e /usr/bin/gpuhook-runtime ] && [ ! -L /usr/bin/gpuhook-runtime ]; then
        ln -s gpuhook /usr/bin/gpuhook-runtime
    fi
}

gpuhook_remove_runtime_link() {
    if [ -L /usr/bin/gpuhook-runtime ] && [ "$(readlink /usr/bin/gpuhook-runtime)" = gpuhook ]; then
        rm -f /usr/bin/gpuhook-runtime
    fi
}
