#!/usr/bin/env bash
# test_netlab.sh NETLAB LINKPROBE — the network lab shapes what it says and
# leaves nothing behind: per-link, per-direction rates measured with TCP,
# unshaped traffic to the hub, teardown after normal exit, failure and SIGKILL.
# Needs root (network namespaces, tc); exits 77 (skipped) without it.
set -u
L=$1
LP=$2
[ "$(id -u)" -eq 0 ] || { echo "test_netlab: not root, skipped"; exit 77; }
export NETLAB_PREFIX="tn$$"
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
leftovers() { { ip netns list; ip -o link; } | grep -c "$NETLAB_PREFIX-" || true; }
trap '$L down >/dev/null 2>&1' EXIT

# rate K TO BYTES -> Mbit/s measured by the receiver
rate() {
    local k=$1 to=$2 bytes=$3 port=$((5000 + RANDOM % 1000)) addr out
    addr=$($L addr "$to")
    out=$(mktemp)
    $L exec "$to" "$LP" serve --listen "$addr:$port" >"$out" &
    local srv=$!
    for _ in $(seq 50); do grep -q listening "$out" && break; sleep 0.1; done
    $L exec "$k" "$LP" send --to "$addr:$port" --bytes "$bytes"
    wait $srv
    awk '/received/ {print $(NF-1)}' "$out"
    rm -f "$out"
}
within() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v >= lo && v <= hi) }'; }

$L up 3 >/dev/null || { echo "FAIL: up"; exit 1; }
$L chain 40,15 >/dev/null || bad "chain"
r=$(rate 0 1 10000000); within "$r" 32 44 && ok || bad "0->1 forward at 40 Mbit/s measured $r"
r=$(rate 1 0 3750000); within "$r" 12 16.5 && ok || bad "1->0 backward at 15 Mbit/s measured $r"
r=$(rate 2 1 3750000); within "$r" 12 16.5 && ok || bad "2->1 backward at 15 Mbit/s measured $r"
r=$(rate 0 hub 50000000); within "$r" 200 1000000 && ok || bad "0->hub unshaped measured $r"
$L shape 0 1 80 >/dev/null || bad "reshape"
r=$(rate 0 1 20000000); within "$r" 64 88 && ok || bad "0->1 reshaped to 80 Mbit/s measured $r"
$L status | grep -q "class 1:11 rate 80Mbit" && ok || bad "status shows the new rate"
$L down >/dev/null
[ "$(leftovers)" -eq 0 ] && ok || bad "down left $(leftovers) namespaces/links"

# run: torn down after the command, its exit code passed on
$L run 2 50 -- sh -c 'test -n "$NETLAB_ADDR_1" && exit 3' >/dev/null
[ $? -eq 3 ] && ok || bad "run passes the exit code on"
[ "$(leftovers)" -eq 0 ] && ok || bad "run left $(leftovers) behind"

# SIGKILL: the watchdog tears down
$L run 2 50 -- sleep 60 >/dev/null 2>&1 &
victim=$!
for _ in $(seq 50); do [ "$(leftovers)" -gt 0 ] && break; sleep 0.1; done
sleep 0.5
kill -KILL $victim
for _ in $(seq 100); do [ "$(leftovers)" -eq 0 ] && break; sleep 0.1; done
[ "$(leftovers)" -eq 0 ] && ok || bad "SIGKILLed run left $(leftovers) behind"

# bad arguments are refused
$L up 0 2>/dev/null && bad "up 0 accepted" || ok
$L shape 0 1 fast 2>/dev/null && bad "rate 'fast' accepted" || ok

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
