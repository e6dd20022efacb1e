# shellcheck shell=bash
# Emulated WAN for bench/wan: client ns —veth— router ns —veth— server ns.
# The router sends each direction to its own NFQUEUE, where hayate-wanemu
# models rate, tail-drop queue, loss and delay. Sourced by bench/wan.
#
# Globals set here: WAN_NS_C WAN_NS_R WAN_NS_S WAN_IPT WAN_EMU_PID WAN_EMU_STATS
# Needs: WAN_PREFIX (unique per run), WAN_LOG (a directory), WANEMU_BIN.

WAN_CLIENT_IP=10.77.1.2
WAN_SERVER_IP=10.77.2.2
WAN_EMU_PID=
export WAN_EMU_STATS=

wan_log() { printf '%s\n' "$*" >&2; }

# iptables-nft would translate NFQUEUE into nft's `queue`, which this kernel lacks.
wan_pick_iptables() {
    if command -v iptables-legacy >/dev/null 2>&1; then
        WAN_IPT=iptables-legacy
    elif command -v iptables >/dev/null 2>&1 && iptables -V 2>/dev/null | grep -q legacy; then
        WAN_IPT=iptables
    elif command -v iptables >/dev/null 2>&1; then
        WAN_IPT=iptables # nft backend: works only where the kernel has nft queue
    else
        return 1
    fi
}

wan_ns() { ip netns exec "$@"; }

wan_net_up() {
    WAN_NS_C="${WAN_PREFIX}c"
    WAN_NS_R="${WAN_PREFIX}r"
    WAN_NS_S="${WAN_PREFIX}s"
    local ns
    for ns in "$WAN_NS_C" "$WAN_NS_R" "$WAN_NS_S"; do
        ip netns add "$ns" || return 1
        wan_ns "$ns" ip link set lo up
        # No IPv6 chatter (router solicitations) through the emulated link.
        wan_ns "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 || true
    done
    # Interfaces are created straight inside the namespaces, so names never collide.
    ip link add cr netns "$WAN_NS_C" type veth peer name rc netns "$WAN_NS_R" || return 1
    ip link add sr netns "$WAN_NS_S" type veth peer name rs netns "$WAN_NS_R" || return 1
    wan_ns "$WAN_NS_C" ip addr add "$WAN_CLIENT_IP/24" dev cr
    wan_ns "$WAN_NS_R" ip addr add 10.77.1.1/24 dev rc
    wan_ns "$WAN_NS_R" ip addr add 10.77.2.1/24 dev rs
    wan_ns "$WAN_NS_S" ip addr add "$WAN_SERVER_IP/24" dev sr
    # No segmentation offloads on the emulated path: with them a 64 KB TCP (or UDP GSO)
    # super-packet crosses the veths as one packet, so the emulator would lose, queue and
    # serialize 45 wire packets as one (random loss turns into rare bursts, which flatters
    # TCP). The kernel then cuts them at the sender, as a real NIC would.
    local dev
    for dev in "$WAN_NS_C:cr" "$WAN_NS_R:rc" "$WAN_NS_R:rs" "$WAN_NS_S:sr"; do
        wan_ns "${dev%%:*}" ethtool -K "${dev#*:}" tso off gso off gro off >/dev/null 2>&1 ||
            wan_log "wan-net: cannot turn offloads off on ${dev#*:} (ethtool missing?): loss and queueing act on super-packets"
    done
    wan_ns "$WAN_NS_C" ip link set cr up
    wan_ns "$WAN_NS_R" ip link set rc up
    wan_ns "$WAN_NS_R" ip link set rs up
    wan_ns "$WAN_NS_S" ip link set sr up
    wan_ns "$WAN_NS_C" ip route add default via 10.77.1.1
    wan_ns "$WAN_NS_S" ip route add default via 10.77.2.1
    wan_ns "$WAN_NS_R" sysctl -qw net.ipv4.ip_forward=1
    # Forwarded traffic only; no --queue-bypass: without wanemu nothing passes.
    wan_ns "$WAN_NS_R" "$WAN_IPT" -t mangle -A FORWARD -i rc -o rs -j NFQUEUE --queue-num 0 || return 1
    wan_ns "$WAN_NS_R" "$WAN_IPT" -t mangle -A FORWARD -i rs -o rc -j NFQUEUE --queue-num 1 || return 1
}

wan_net_down() {
    wan_emu_stop >/dev/null 2>&1 || true
    local ns pids
    for ns in "${WAN_NS_C:-}" "${WAN_NS_R:-}" "${WAN_NS_S:-}"; do
        [ -n "$ns" ] || continue
        [ -e "/run/netns/$ns" ] || continue
        # Only processes inside our own namespaces: all of them were started by this run.
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill $pids 2>/dev/null || true
            sleep 0.2
            pids=$(ip netns pids "$ns" 2>/dev/null || true)
            # shellcheck disable=SC2086
            [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
        fi
        ip netns del "$ns" 2>/dev/null || true
    done
}

# wan_emu_start RATE RTT LOSS LOSS_REV BUFFER_BYTES [extra wanemu args...]
# Starts wanemu in the router namespace and waits until both queues are bound.
wan_emu_start() {
    local rate=$1 rtt=$2 loss=$3 loss_rev=$4 buffer=$5
    shift 5
    wan_emu_stop >/dev/null 2>&1 || true
    WAN_EMU_LOG="$WAN_LOG/wanemu.$(date +%s%N).log"
    ip netns exec "$WAN_NS_R" "$WANEMU_BIN" --queue-fwd 0 --queue-rev 1 --rate "$rate" --rtt "$rtt" \
        --loss "$loss" --loss-rev "$loss_rev" --buffer "$buffer" --rt-prio "${WAN_RT_PRIO:-0}" "$@" \
        >"$WAN_EMU_LOG" 2>&1 &
    WAN_EMU_PID=$!
    local i
    for i in $(seq 1 100); do
        if grep -q 'wanemu: ready' "$WAN_EMU_LOG" 2>/dev/null; then
            return 0
        fi
        if ! kill -0 "$WAN_EMU_PID" 2>/dev/null; then
            wan_log "wanemu failed to start:"
            cat "$WAN_EMU_LOG" >&2
            WAN_EMU_PID=
            return 1
        fi
        sleep 0.05
        : "$i"
    done
    wan_log "wanemu did not become ready"
    return 1
}

# Stops wanemu; its exit stats lines go to WAN_EMU_STATS (not a subshell: it must wait).
wan_emu_stop() {
    WAN_EMU_STATS=
    [ -n "${WAN_EMU_PID:-}" ] || return 0
    kill -TERM "$WAN_EMU_PID" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do
        kill -0 "$WAN_EMU_PID" 2>/dev/null || break
        sleep 0.05
        : "$i"
    done
    wait "$WAN_EMU_PID" 2>/dev/null || true
    WAN_EMU_PID=
    WAN_EMU_STATS=$(grep '^wanemu ' "$WAN_EMU_LOG" 2>/dev/null || true)
}

# wan_emu_mark: wanemu prints, per direction, how late it released packets since the last
# mark ("wanemu-window" lines). Mark before and after a run; then wan_emu_window_late.
wan_emu_mark() {
    [ -n "${WAN_EMU_PID:-}" ] || return 0
    kill -USR1 "$WAN_EMU_PID" 2>/dev/null || true
    sleep 0.15 # each direction notices within 50 ms
}

# wan_emu_window_late: the worse direction's p99 and max release lateness (ms) over the
# window the last mark closed, as "P99 MAX" ("- -" if unknown). A faithful link is within a
# millisecond: more means the delay and rate the transfer saw were not the configured ones.
wan_emu_window_late() {
    local m
    m=$(grep '^wanemu-window ' "$WAN_EMU_LOG" 2>/dev/null | sed -n 's/.* mark=\([0-9]*\) .*/\1/p' | tail -1)
    [ -n "$m" ] || { echo "- -"; return 0; }
    grep "^wanemu-window .* mark=$m " "$WAN_EMU_LOG" | awk '
        { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
          if (v["late_p99_us"] != "-" && v["late_p99_us"] > p) p = v["late_p99_us"]
          if (v["late_max_us"] > x) x = v["late_max_us"] }
        END { printf "%.1f %.1f\n", p / 1000, x / 1000 }'
}

# wan_stat KEY LINE: the value of key=value in a wanemu stats line.
wan_stat() {
    local key=$1 line=$2
    printf '%s\n' "$line" | tr ' ' '\n' | sed -n "s/^$key=//p" | head -1
}
