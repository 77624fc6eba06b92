. /usr/share/gpuhook/hook-install.sh
created=$(gpuhook_install_hook)
gpuhook_runtime_dir
gpuhook_install_runtime_link
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
    if [ "$1" -eq 1 ]; then
        systemctl enable --now gpuhook-reconcile.timer >/dev/null 2>&1 || true
    fi
fi
if [ "$created" = new ]; then
    gpuhook_restart_libvirt
fi
