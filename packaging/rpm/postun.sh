if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
    for svc in libvirtd virtlxcd virtqemud; do
        if systemctl is-active --quiet "$svc.service" 2>/dev/null; then
            systemctl restart "$svc.service" || true
        fi
    done
fi
