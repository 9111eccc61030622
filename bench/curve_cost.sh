#!/usr/bin/env bash
# bench/curve_cost.sh — what encryption costs: the demo job (GPT-2 L=4,
# C=128, T=128, byte-level, 4 stages on 4 nodes, 1F1B, 4 micro-batches of
# 8 x 128 tokens) on loopback, each codec pair run once with a plaintext
# coordinator (`serve --open`) and once secure (CURVE on every control and
# data link, join tokens, per-node keys). Prints a table of tokens/s (mean
# over steps 3..N) and writes bench/results/curve_cost.csv.
#
#   bench/curve_cost.sh [--steps N] [--build DIR]
#
# Default 100 steps per run (4 runs, ~2 min on 2 cores). Needs data/brown
# (scripts/fetch-brown).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
steps=100
build="$root/build"
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) steps=$2; shift 2 ;;
        --build) build=$(cd "$2" && pwd); shift 2 ;;
        *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done
coord="$build/coordinator/tah-coord"
node="$build/node/tah-node"
[ -x "$coord" ] && [ -x "$node" ] || { echo "curve_cost: build $build first (tah-coord, tah-node)" >&2; exit 1; }
[ -s "$root/data/brown/train.bin" ] || { echo "curve_cost: no data/brown; run scripts/fetch-brown" >&2; exit 1; }
work=$(mktemp -d /tmp/tah-curve.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

job() { # job FWD BWD
    cat <<EOF
[job]
model = 4,4,128,128,256
train_data = $root/data/brown/train.bin
stages = 4
schedule = 1f1b
micro_batches = 4
batch = 8
seq = 128
steps = $steps
lr = 2e-3
seed = 1337
fwd_codec = $1
bwd_codec = $2
EOF
}

# run MODE FWD BWD -> tokens/s
run() {
    local mode=$1 d="$work/$1-$2" i
    mkdir -p "$d"
    pids=()
    local sec=() cli=()
    if [ "$mode" = open ]; then
        "$coord" serve --open --listen 127.0.0.1:0 --state "$d/state" 2>"$d/coord.log" &
    else
        "$coord" serve --listen 127.0.0.1:0 --state "$d/state" 2>"$d/coord.log" &
    fi
    pids+=($!)
    for _ in $(seq 100); do [ -s "$d/state/endpoint" ] && break; sleep 0.1; done
    local ep
    ep=$(cat "$d/state/endpoint")
    [ "$mode" = secure ] && cli=(--coordinator-key "$d/state/coord.pub" --key "$d/state/admin.key")
    job "$2" "$3" >"$d/job.ini"
    local id
    id=$("$coord" submit --coordinator "$ep" "${cli[@]}" "$d/job.ini")
    if [ "$mode" = secure ]; then
        local tok
        tok=$("$coord" token create --coordinator "$ep" "${cli[@]}" --job "$id" --expires 1h)
    fi
    for i in 0 1 2 3; do
        if [ "$mode" = secure ]; then
            "$node" keygen --out "$d/k$i" >/dev/null
            sec=(--coordinator-key "$d/state/coord.pub" --key "$d/k$i/node.key" --token "$tok")
        fi
        "$node" join --coordinator "$ep" --name "n$i" --threads 1 "${sec[@]}" 2>"$d/n$i.log" &
        pids+=($!)
        sleep 1.5 # one after another: their speed measurements do not overlap
    done
    "$coord" wait --coordinator "$ep" "${cli[@]}" "$id" >/dev/null
    local metrics
    metrics=$("$coord" status --coordinator "$ep" "${cli[@]}" "$id" --json | sed -E 's/.*"metrics":"([^"]*)".*/\1/')
    awk -F'[:,}]' '{ for (i = 1; i < NF; i++) { k = $i; gsub(/[{" ]/, "", k); v[k] = $(i + 1) }
                     if (v["step"] >= 3) { s += v["tokens_per_s"]; n++ } } END { printf "%.0f", s / n }' "$metrics"
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}

csv="$root/bench/results/curve_cost.csv"
echo "codec,open_tokens_per_s,curve_tokens_per_s,cost_pct" >"$csv.tmp"
echo "| codec (fwd / bwd) | --open tokens/s | CURVE tokens/s | cost |"
echo "|---|---:|---:|---:|"
for pair in "fp32 fp32" "tah fixpt:bits=8"; do
    set -- $pair
    o=$(run open "$1" "$2")
    s=$(run secure "$1" "$2")
    cost=$(awk -v o="$o" -v s="$s" 'BEGIN { printf "%.1f", 100 * (o - s) / o }')
    echo "| $1 / $2 | $o | $s | $cost % |"
    echo "$1/$2,$o,$s,$cost" >>"$csv.tmp"
done
mv "$csv.tmp" "$csv"
echo "(mean tokens/s over steps 3..$steps; $(nproc) cores; CSV: bench/results/curve_cost.csv)"
