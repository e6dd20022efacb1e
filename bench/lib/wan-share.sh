# shellcheck shell=bash
# bench/wan --share: how hayate shares one emulated link, measured on the real harness.
#   1. two hayate transfers, the second starting 5 s after the first: their goodput while
#      both run, and Jain's fairness index (the issue's target: >= 0.95 once both run);
#   2. hayate next to one TCP CUBIC stream (iperf3, buffers raised) that was there first:
#      what each gets while both run, once per policy in SHARE_POLICIES (`--policy`); the
#      policy `tcp` puts a second CUBIC stream where hayate would be (the reference: what
#      TCP itself gets as the newcomer in the same window).
# Sourced by bench/wan after its helpers (prof_start, set_tcp_bufs, run_hayate's key, ...).

# Per-second goodput of a `hayate cp --interval 1` log as "seconds-since-T0 bits/s" lines,
# T0 being the test's start and $2 the copy's launch time. Drops the last (partial) line.
share_series() { # LOG LAUNCH T0
    awk -v l="$2" -v t0="$3" '
        $1 ~ /^[0-9.]+s$/ && $3 ~ /^[kMG]bit\/s$/ {
            t = $1; sub(/s$/, "", t)
            m = ($3 ~ /^G/) ? 1e9 : ($3 ~ /^M/) ? 1e6 : 1e3
            n++; ts[n] = l + t - t0; r[n] = $2 * m; own[n] = t }
        END { for (i = 1; i < n; i++) printf "%.3f %.0f %.3f\n", ts[i], r[i], own[i] }' "$1"
}

# hayate_bg NAME [ARGS...]: a `hayate cp` of the source file to share-NAME.bin, in the
# background, with ARGS; without the remembered path (each flow starts as a stranger's
# would, whatever ran before), unless SHARE_CACHE names the cache directory to use.
hayate_bg() {
    local name=$1 cache=(--no-cache)
    shift
    [ -n "${SHARE_CACHE:-}" ] && cache=()
    HAYATE_CC_TRACE=$WAN_LOG/share-cc-$name.tsv XDG_CACHE_HOME=${SHARE_CACHE:-$WORK/cache} \
        ip netns exec "$WAN_NS_C" "$HAYATE_BIN" cp --key-file "$HAYATE_KEY" --json --interval 1 "${cache[@]}" "$@" \
        "$SRC_FILE" "hayate://$WAN_SERVER_IP:$HAYATE_PORT/share-$name.bin" \
        >"$WAN_LOG/share-$name.json" 2>"$WAN_LOG/share-$name.err" &
    BG_PID=$!
}

share_verified() { # NAME → "verified" or why not
    local v
    v=$(jq -r '.verified // empty' "$WAN_LOG/share-$1.json" 2>/dev/null | tail -1)
    if [ "$v" = true ] && cmp -s "$SRC_FILE" "$WORK/fs/dst/share-$1.bin"; then echo verified; else echo "NOT verified ($(tail -c 80 "$WAN_LOG/share-$1.err" | tr '\n' ' '))"; fi
}

run_share() { # RATE RTT LOSS BUF_BDP
    # shellcheck disable=SC2034 # read by bench/wan's emit and prof_* helpers
    P_KEY="share/$1/$2/$3/${4}bdp"
    prof_start "$@"
    echo "== share test: rate=$1 rtt=$2 loss=$3 buffer=$4 BDP; base ping RTT $P_BASE_RTT ms" >&2
    hayate_key || die "hayate keygen failed"
    warm_pages "$WORK/fs/dst" "$((2 * $(stat -c %s "$SRC_FILE")))" # two files arrive at once
    ip netns exec "$WAN_NS_S" "$HAYATE_BIN" serve --listen "$WAN_SERVER_IP:$HAYATE_PORT" --root "$WORK/fs/dst" \
        --key-file "$HAYATE_KEY" >"$WAN_LOG/share-serve.log" 2>&1 &
    local spid=$! t0 la lb pa pb
    sleep 0.5

    # 1. Two hayate flows.
    echo "   two hayate transfers (second 5 s after the first) ..." >&2
    t0=$(now_s)
    la=$t0; hayate_bg a; pa=$BG_PID
    sleep 5
    lb=$(now_s); hayate_bg b; pb=$BG_PID
    timeout 180 bash -c "while kill -0 $pa 2>/dev/null || kill -0 $pb 2>/dev/null; do sleep 0.2; done"
    wait "$pa" "$pb" 2>/dev/null
    share_series "$WAN_LOG/share-a.err" "$la" "$t0" >"$WAN_LOG/share-a.tsv"
    share_series "$WAN_LOG/share-b.err" "$lb" "$t0" >"$WAN_LOG/share-b.tsv"
    # Seconds in which both ran, once the second had run 2 s: each flow's mean, Jain's
    # index of those means, and the lowest per-second index.
    local fair
    fair=$(awk 'NR == FNR { a[int($1)] = $2; next }
        $3 > 2 && (int($1) in a) { s = int($1); x = a[s]; y = $2
            n++; sa += x; sb += y; j = (x + y) ^ 2 / (2 * (x * x + y * y)); if (n == 1 || j < jmin) jmin = j }
        END { if (!n) { print "- - - - 0"; exit }
            ma = sa / n; mb = sb / n; printf "%.0f %.0f %.3f %.3f %d\n", ma, mb, (ma + mb) ^ 2 / (2 * (ma * ma + mb * mb)), jmin, n }' \
        "$WAN_LOG/share-a.tsv" "$WAN_LOG/share-b.tsv")
    local ma mb jain jmin n
    read -r ma mb jain jmin n <<<"$fair"
    SHARE_ROWS+=("| two hayate | first (from 0 s) | $(fmt_mbps "$ma") | $jain (lowest 1-s: $jmin) | $n s both running; $(share_verified a) |")
    SHARE_ROWS+=("| two hayate | second (from 5 s) | $(fmt_mbps "$mb") | | $(share_verified b) |")
    rm -f "$WORK/fs/dst/share-a.bin" "$WORK/fs/dst/share-b.bin"

    # 2. hayate next to a CUBIC stream that started 5 s earlier, per policy.
    local pol c
    for pol in ${SHARE_POLICIES//,/ }; do
        if [ "$pol" = tcp ]; then
            share_tcp_pair
            continue
        fi
        c=c-$pol
        local args=(--policy "$pol")
        SHARE_CACHE=
        if [ "$pol" = fair-remembered ]; then
            # `fair` with the path remembered: a lone transfer just before primes the cache.
            args=(--policy fair)
            SHARE_CACHE=$WORK/share-cache
            rm -rf "$SHARE_CACHE"
            echo "   a lone hayate transfer, for the path to be remembered ..." >&2
            hayate_bg prime; wait "$BG_PID"
            rm -f "$WORK/fs/dst/share-prime.bin"
        fi
        echo "   hayate ${args[*]} next to a TCP CUBIC stream${SHARE_CACHE:+ (the path remembered)} ..." >&2
        set_tcp_bufs raised
        warm_pages "$WORK/fs/dst" "$(stat -c %s "$SRC_FILE")"
        ip netns exec "$WAN_NS_S" iperf3 -s -1 -p "$IPERF_PORT" -B "$WAN_SERVER_IP" >"$WAN_LOG/share-iperf3-server.log" 2>&1 &
        local ips=$! ipc
        sleep 0.3
        t0=$(now_s)
        ip netns exec "$WAN_NS_C" iperf3 -c "$WAN_SERVER_IP" -p "$IPERF_PORT" -t 30 -C cubic --json \
            >"$WAN_LOG/share-iperf3.json" 2>"$WAN_LOG/share-iperf3.err" &
        ipc=$!
        sleep 5
        la=$(now_s); hayate_bg "$c" "${args[@]}"; pa=$BG_PID
        SHARE_CACHE=
        timeout 120 bash -c "while kill -0 $pa 2>/dev/null; do sleep 0.2; done"
        wait "$pa" 2>/dev/null
        wait "$ipc" 2>/dev/null
        kill "$ips" 2>/dev/null; wait "$ips" 2>/dev/null
        set_tcp_bufs default
        share_series "$WAN_LOG/share-$c.err" "$la" "$t0" >"$WAN_LOG/share-$c.tsv"
        jq -r '.intervals[]?.sum | "\(.start) \(.bits_per_second)"' "$WAN_LOG/share-iperf3.json" \
            >"$WAN_LOG/share-tcp.tsv" 2>/dev/null
        local mt mh
        # iperf3's intervals start at its own 0 s, which is T0 (give or take its connect).
        read -r mh mt n < <(awk 'NR == FNR { t[int($1)] = $2; next }
            $3 > 2 && (int($1) in t) { n++; sh += $2; st += t[int($1)] }
            END { if (!n) print "- - 0"; else printf "%.0f %.0f %d\n", sh / n, st / n, n }' \
            "$WAN_LOG/share-tcp.tsv" "$WAN_LOG/share-$c.tsv")
        local pct=-
        [ "$n" != 0 ] && pct=$(awk -v h="$mh" -v t="$mt" 'BEGIN { printf "%.0f", t * 100 / (h + t) }')
        SHARE_ROWS+=("| hayate --policy $pol + TCP CUBIC | CUBIC (from 0 s, raised bufs) | $(fmt_mbps "$mt") | CUBIC's share $pct % | $n s both running |")
        SHARE_ROWS+=("| hayate --policy $pol + TCP CUBIC | hayate (from 5 s) | $(fmt_mbps "$mh") | | $(share_verified "$c") |")
        rm -f "$WORK/fs/dst/share-$c.bin"
    done
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    prof_stop
}

# A TCP CUBIC stream joining another 5 s later, measured as hayate is next to one.
share_tcp_pair() {
    echo "   TCP CUBIC next to a TCP CUBIC stream (the reference) ..." >&2
    set_tcp_bufs raised
    local p2=$((IPERF_PORT + 1)) s1 s2 c1 c2 t0 lb n mt mb pct
    ip netns exec "$WAN_NS_S" iperf3 -s -1 -p "$IPERF_PORT" -B "$WAN_SERVER_IP" >"$WAN_LOG/share-ref-server1.log" 2>&1 &
    s1=$!
    ip netns exec "$WAN_NS_S" iperf3 -s -1 -p "$p2" -B "$WAN_SERVER_IP" >"$WAN_LOG/share-ref-server2.log" 2>&1 &
    s2=$!
    sleep 0.3
    t0=$(now_s)
    ip netns exec "$WAN_NS_C" iperf3 -c "$WAN_SERVER_IP" -p "$IPERF_PORT" -t 30 -C cubic --json \
        >"$WAN_LOG/share-ref-1.json" 2>"$WAN_LOG/share-ref-1.err" &
    c1=$!
    sleep 5
    lb=$(now_s)
    ip netns exec "$WAN_NS_C" iperf3 -c "$WAN_SERVER_IP" -p "$p2" -t 20 -C cubic --json \
        >"$WAN_LOG/share-ref-2.json" 2>"$WAN_LOG/share-ref-2.err" &
    c2=$!
    wait "$c1" "$c2" 2>/dev/null
    kill "$s1" "$s2" 2>/dev/null; wait "$s1" "$s2" 2>/dev/null
    set_tcp_bufs default
    jq -r '.intervals[]?.sum | "\(.start) \(.bits_per_second)"' "$WAN_LOG/share-ref-1.json" \
        >"$WAN_LOG/share-ref-1.tsv" 2>/dev/null
    # The second stream's seconds, on the first one's clock (as for hayate's), and its own.
    jq -r '.intervals[]?.sum | "\(.start) \(.bits_per_second) \(.start)"' "$WAN_LOG/share-ref-2.json" 2>/dev/null |
        awk -v o="$(echo "$lb - $t0" | bc -l)" '{ printf "%.3f %s %s\n", $1 + o, $2, $3 }' >"$WAN_LOG/share-ref-2.tsv"
    read -r mb mt n < <(awk 'NR == FNR { t[int($1)] = $2; next }
        $3 > 2 && (int($1) in t) { n++; sh += $2; st += t[int($1)] }
        END { if (!n) print "- - 0"; else printf "%.0f %.0f %d\n", sh / n, st / n, n }' \
        "$WAN_LOG/share-ref-1.tsv" "$WAN_LOG/share-ref-2.tsv")
    pct=-
    [ "$n" != 0 ] && pct=$(awk -v h="$mb" -v t="$mt" 'BEGIN { printf "%.0f", t * 100 / (h + t) }')
    SHARE_ROWS+=("| TCP CUBIC + TCP CUBIC (reference) | CUBIC (from 0 s, raised bufs) | $(fmt_mbps "$mt") | the first's share $pct % | $n s both running |")
    SHARE_ROWS+=("| TCP CUBIC + TCP CUBIC (reference) | CUBIC (from 5 s) | $(fmt_mbps "$mb") | | |")
}

print_share_table() {
    echo
    echo "Link: $RATE, RTT $RTT, loss $LOSS, buffer $BUF_BDP BDP; capacity (UDP payload) $(fmt_mbps "$P_CAP") Mbit/s; file $SIZE each; Mbit/s are means over the seconds both flows ran (the later one's first 2 s left out)"
    echo
    echo "| test | flow | goodput Mbit/s | fairness | note |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${SHARE_ROWS[@]}"
}
