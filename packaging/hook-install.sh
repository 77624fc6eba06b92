# Shared by the .deb and .rpm scripts (sourced): install/remove gpuhook as libvirt's LXC hook.
GPUHOOK_BIN=/usr/bin/gpuhook
GPUHOOK_HOOK=/etc/libvirt/hooks/lxc
GPUHOOK_DROPIN=/etc/libvirt/hooks/lxc.d/50-gpuhook

gpuhook_is_ours() { [ -L "$1" ] && [ "$(readlink "$1")" = "$GPUHOOK_BIN" ]; }

# Prints "new" when a hook link was created (libvirt must restart to see it).
gpuhook_install_hook() {
    mkdir -p /etc/libvirt/hooks
    if gpuhook_is_ours "$GPUHOOK_HOOK" || gpuhook_is_ours "$GPUHOOK_DROPIN"; then
        return 0
    fi
    if [ -e "$GPUHOOK_HOOK" ] || [ -L "$GPUHOOK_HOOK" ]; then
        # A foreign hook is there: leave it alone; libvirt >= 6.5 also runs hooks/lxc.d/*.
        mkdir -p /etc/libvirt/hooks/lxc.d
        ln -sfn "$GPUHOOK_BIN" "$GPUHOOK_DROPIN"
    else
        ln -s "$GPUHOOK_BIN" "$GPUHOOK_HOOK"
    fi
    echo new
}

gpuhook_remove_hook() {
    for f in "$GPUHOOK_HOOK" "$GPUHOOK_DROPIN"; do
        if gpuhook_is_ours "$f"; then rm -f "$f"; fi
    done
    rmdir /etc/libvirt/hooks/lxc.d 2>/dev/null || true
}

# libvirt only notices hooks present when it starts: restart the daemons that run.
gpuhook_restart_libvirt() {
    [ -d /run/systemd/system ] || return 0
    for svc in libvirtd virtlxcd; do
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
