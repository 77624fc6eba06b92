if [ "$1" -eq 0 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl disable --now gpuhook-reconcile.timer gpuhook-reconcile.service gpuhook-device-plugin.service >/dev/null 2>&1 || true
    fi
    . /usr/share/gpuhook/hook-install.sh
    gpuhook_remove_hook
    gpuhook_remove_runtime_link
fi
