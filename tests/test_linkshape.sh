#!/usr/bin/env bash
# test_linkshape.sh BUILD [DATA] — the node's in-process link emulation does
# what the job asks, measured: a coordinator and 4 nodes on loopback run
# `tah-coord experiment` (shaping = inprocess, fp32, one micro-batch, so a
# step is a chain of transfers: ACT 0>1>2>3, GRAD 3>2>1>0, then the norm's
# partial sums down and the norm back up, 12 messages in all, untied).
#   rate:  the step gets longer by (fwd+bwd bytes per step) * 8 / rate
#   delay: the step gets longer by 12 * delay (every message is delayed)
# Step times are each point's median step (see sec below).
# Tolerances: 12 % on the rate (headers counted both ways, poll wake-ups
# of ~1 ms per message), 15 % on the delay (a ms of timer slack per hop).
# Also: status and the node logs name the mechanism, a bad experiment file
# is refused with FILE:LINE and exit 2. No root needed.
set -u
B=$(cd "$1" && pwd)
DATA=${2:-} # optional: training text or token file; generated when absent
W=$(mktemp -d /tmp/tah-linkshape.XXXXXX)
case $DATA in /*|"") ;; *) DATA=$PWD/$DATA ;; esac
[ -n "$DATA" ] && [ -s "$DATA" ] || { DATA=$W/train.txt; bash "$(dirname "$0")/gen_text.sh" "$DATA"; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
coord=$B/coordinator/tah-coord

"$coord" serve --open --listen 127.0.0.1:0 --state "$W/state" 2>"$W/coord.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$W/state/endpoint" ] && break; sleep 0.1; done
ep=$(sed 's|^tcp://||' "$W/state/endpoint")
for k in 0 1 2 3; do
    OPENBLAS_NUM_THREADS=1 "$B/node/tah-node" join --coordinator "$ep" --name "ls$k" --threads 1 2>"$W/node$k.log" &
    pids+=($!)
    for _ in $(seq 300); do
        [ "$("$coord" status --coordinator "$ep" --json | grep -o '"state":"idle"' | wc -l)" -gt "$k" ] && break
        sleep 0.1
    done
done

cat >"$W/exp.ini" <<EOF2
[job]
model = 4,2,64,64,256
train_data = $DATA
stages = 4
batch = 16
seq = 64
lr = 1e-3
steps = 10
untied = true
val_every = 1000
[sweep]
bandwidths = none 20
delays = 0 30
codecs = fp32/fp32
micro_batches = 1
steps = 10
shaping = inprocess
EOF2
"$coord" experiment --coordinator "$ep" "$W/exp.ini" --out "$W/out" >"$W/exp.log" 2>&1 || { cat "$W/exp.log"; bad "experiment failed"; }
csv=$W/out/results.csv
# step seconds and fwd+bwd bytes of the point at bandwidth $1, delay $2
col() { awk -F, -v bw="\"$1\"" -v dl="\"$2\"" -v c="$3" '$6 == bw && $7 == dl { print $c }' "$csv"; }
# median step seconds of that point, from its job's metrics (steps after the
# first, validation steps left out): one stalled step on a loaded machine
# moves the mean, not the median
sec() {
    grep -v '"val_loss"' "$W/state/jobs/$(col "$1" "$2" 2)/metrics.jsonl" |
        sed -n 's/.*"step":\([0-9]*\).*"ms":\([0-9.]*\).*/\1 \2/p' | awk '$1 > 1 { print $2 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (!NR) { print "nan"; exit } printf "%.6f", (v[int((NR + 1) / 2)] + v[int(NR / 2) + 1]) / 2e3 }'
}
bytes=$(awk -v f="$(col none 0 20)" -v b="$(col none 0 21)" 'BEGIN { print f + b }')
t0=$(sec none 0)
t_rate=$(sec 20 0)
t_delay=$(sec none 30)
rate=$(awk -v b="$bytes" -v a="$t_rate" -v z="$t0" 'BEGIN { printf "%.2f", b * 8 / (a - z) / 1e6 }')
delay=$(awk -v a="$t_delay" -v z="$t0" 'BEGIN { printf "%.2f", (a - z) / 12 * 1e3 }')
echo "step: unthrottled $t0 s, 20 Mbit/s $t_rate s, 30 ms $t_delay s; measured rate $rate Mbit/s, delay $delay ms"
within() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v >= lo && v <= hi) }'; }
within "$rate" 17.6 22.4 && ok || bad "token bucket at 20 Mbit/s measured $rate Mbit/s"
within "$delay" 25.5 34.5 && ok || bad "one-way delay of 30 ms measured $delay ms"
[ "$(col none 30 11)" = "in-process (no netem)" ] || [ "$(col none 30 11)" = "in-process (netem not used)" ] && ok ||
    bad "csv delay mechanism '$(col none 30 11)'"
grep -q "delay: in-process (" "$W/node1.log" && ok || bad "node log does not say how delays are made"
last=$(col none 30 2)
"$coord" status --coordinator "$ep" "$last" | grep -q "links: rate none Mbit/s (in-process token bucket); delay 30 ms; delay: in-process" &&
    ok || bad "status does not show the link settings: $("$coord" status --coordinator "$ep" "$last" | grep links)"
for f in results.csv table.md points/p0.ini curves/p0.dat; do [ -s "$W/out/$f" ] && ok || bad "missing output $f"; done

# bad files: FILE:LINE and exit 2, nothing submitted
printf '[job]\nmodel = 4,2,64,64,256\ntrain_data = %s\nbatch = 2\nseq = 8\nsteps = 2\nlr = 1e-3\nstages = 4\n[sweep]\nbandwidths = 50 fast\n' "$DATA" >"$W/bad1.ini"
printf '[job]\nmodel = 4,2,64,64,256\ntrain_data = %s\nbatch = 2\nseq = 8\nsteps = 2\nlr = 1e-3\nstages = 4\nlink_rate_mbps = 5\n[sweep]\n' "$DATA" >"$W/bad2.ini"
printf '[job]\nmodel = 4,2,64,64,256\ntrain_data = %s\nbatch = 2\nseq = 8\nsteps = 2\nlr = 1e-3\nstages = 4\n[sweep]\ncodecs = tah/fixpt:bits=99\n' "$DATA" >"$W/bad3.ini"
printf '[job]\nmodel = 4,2,64,64,256\ntrain_data = %s\nbatch = x\nseq = 8\nsteps = 2\nlr = 1e-3\n[sweep]\n' "$DATA" >"$W/bad4.ini"
printf '[job]\nmodel = 4,2,64,64,256\ntrain_data = %s\nbatch = 2\nseq = 8\nsteps = 2\nlr = 1e-3\nstages = 4\n[sweep]\nbandwidths = 0>7:5\nshaping = inprocess\n' "$DATA" >"$W/bad5.ini"
for c in "bad1.ini:10:" "bad2.ini:9:" "bad3.ini:10:" "bad4.ini:4:" "bad5.ini"; do
    f=${c%%:*}
    out=$("$coord" experiment --coordinator "$ep" "$W/$f" 2>&1)
    rc=$?
    [ $rc -eq 2 ] && ok || bad "$f: exit $rc (expected 2): $out"
    grep -q "$c" <<<"$out" && ok || bad "$f: message does not name $c: $out"
done
"$coord" experiment --coordinator "$ep" 2>/dev/null; [ $? -eq 2 ] && ok || bad "no file: exit not 2"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
