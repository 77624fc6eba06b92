# Shared by package-test.sh and rpm-test.sh (sourced; they set $work and define fail).

# A fake blueprint host in $work/host, the installed gpuhook's config pointing at it, and a
# reservation made through the hook command "$@" (the installed /usr/bin/gpuhook or the
# /etc/libvirt/hooks/lxc link); the config and state copied to $work/*.before for the
# upgrade checks.
reserve_on_fake_host() {
    cargo build --locked -q -p testbed
    ./target/debug/gpuhook-testbed fakehost blueprint "$work/host" >/dev/null
    cat > /etc/gpuhook/config.json <<EOF
{"sysfs": "$work/host/sys", "proc": "$work/host/proc", "dev": "$work/host/dev", "exclude": ["0000:08:00.0"]}
EOF
    cp /etc/gpuhook/config.json "$work/config.before"
    printf '<domain><name>pkg</name><uuid>12345678-1234-4234-8234-123456789abc</uuid><metadata><gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"/></metadata></domain>' \
        | "$@" pkg prepare begin -
    /usr/bin/gpuhook list | grep -q 'pkg (prepared)' || fail "the installed hook did not reserve"
    cp /run/gpuhook/state.json "$work/state.before"
}
