#!/usr/bin/env bash
# bench/codecs.sh — codec benchmark: throughput table (one core) and a
# fidelity sweep of TAH-Quant vs plain INT4 over several synthetic tensors.
# Writes bench/results/codecs.csv and bench/results/tah_fidelity.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target tah-codec >/dev/null
codec=build/codecs/tah-codec
out=bench/results
mkdir -p "$out"

echo "== throughput (one core)"
$codec bench --seconds "${SECONDS_PER_CODEC:-0.5}" --csv "$out/codecs.csv"

echo
echo "== fidelity: relative L2 error, shape 4,256,768, per seed"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
specs=("tah" "tah:tau=0" "int:bits=4,group=64" "int:bits=4,group=128")
echo "seed,$(IFS=,; echo "${specs[*]}")" > "$out/tah_fidelity.csv"
printf '%-6s' seed; printf ' %22s' "${specs[@]}"; echo
for seed in 0 1 2 3 4 5 6 7 8 42; do
    $codec synth --shape 4,256,768 --seed "$seed" --out "$tmp/x.f32"
    row="$seed"
    printf '%-6s' "$seed"
    for spec in "${specs[@]}"; do
        $codec encode --codec "$spec" --shape 4,256,768 --in "$tmp/x.f32" --out "$tmp/x.tahf" >/dev/null
        $codec decode --in "$tmp/x.tahf" --out "$tmp/y.f32"
        err=$($codec compare --in "$tmp/y.f32" --ref "$tmp/x.f32" | awk '{print $4}')
        printf ' %22s' "$err"
        row="$row,$err"
    done
    echo
    echo "$row" >> "$out/tah_fidelity.csv"
done
