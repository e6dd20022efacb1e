# shellcheck shell=bash
# Free page reporting, held for a bench's run. This VM hands memory its guest frees back to
# the host, and the next writer of those pages waits for the host to back them again
# (bench/wan measured 1 GiB into tmpfs at 1.2 s cold, 0.37 s warm). A bench whose copies
# each write a fresh file would otherwise charge that to whichever copy ran first after a
# free. As root (where the kernel has the knob), freed pages stay unreported for 10 minutes
# while the bench runs, and each copy starts right after pages for its file were written
# and freed (`warm_pages`). Sourced by bench/fastpath, bench/wan and bench/delta.

PR_KNOB=/sys/module/page_reporting/parameters/min_free_ms
PR_SAVED=
page_reporting_hold() {
    if [ -w "$PR_KNOB" ]; then
        PR_SAVED=$(cat "$PR_KNOB")
        echo 600000 >"$PR_KNOB" 2>/dev/null || PR_SAVED=
    fi
}
page_reporting_restore() {
    [ -n "$PR_SAVED" ] && echo "$PR_SAVED" >"$PR_KNOB" 2>/dev/null
    PR_SAVED=
}
warm_pages() { # DIR BYTES: write and free that much in DIR (the bench's tmpfs)
    local mib=$((($2 + 1048575) / 1048576))
    dd if=/dev/zero of="$1/.warm" bs=1M count="$mib" status=none 2>/dev/null
    rm -f "$1/.warm"
}
