#!/usr/bin/env bash
# test_cli.sh TAH_CODEC — the tah-codec command line: round trips through
# files, `info` output, and the exit-code contract (0 ok, 1 runtime error
# with a reason, 2 usage with the usage text), atomic outputs.
set -u
codec=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
. "$(dirname "$0")/cli_check.sh"

$codec synth --shape 2,16,96 --seed 3 --out "$dir/x.f32" || { echo "synth failed"; exit 1; }
for spec in fp32 fp16 bf16 tah "tah:tile=32,hi_frac=0.5" fixpt "fixpt:bits=6,stochastic=1" ash-fp8 "int:bits=3"; do
    check "encode $spec" 0 "bits/element" -- $codec encode --codec "$spec" --shape 2,16,96 --in "$dir/x.f32" --out "$dir/x.tahf"
    check "info $spec" 0 "shape: +2,16,96" -- $codec info --in "$dir/x.tahf"
    check "decode $spec" 0 "" -- $codec decode --in "$dir/x.tahf" --out "$dir/y.f32"
    check "size $spec" 0 "" -- test "$(stat -c %s "$dir/y.f32")" -eq $((2 * 16 * 96 * 4))
done
# fp32 is bit-exact through files
$codec encode --codec fp32 --shape 2,16,96 --in "$dir/x.f32" --out "$dir/x.tahf" >/dev/null
$codec decode --in "$dir/x.tahf" --out "$dir/y.f32"
check "fp32 exact" 0 "" -- cmp "$dir/x.f32" "$dir/y.f32"
check "compare exact" 0 "rel_error 0.0000e\\+00" -- $codec compare --in "$dir/y.f32" --ref "$dir/x.f32"
# codec options override the spec and are checked against the codec
check "option" 0 "" -- $codec encode --codec tah --hi-frac 0.5 --tile 32 --shape 2,16,96 --in "$dir/x.f32" --out "$dir/o.tahf"
check "option shown" 0 "hi_frac=0.5" -- $codec info --in "$dir/o.tahf"

# usage errors: exit 2 with the usage text
check "no command" 2 "usage:" -- $codec
check "bad command" 2 "unknown command" -- $codec frobnicate
check "unknown codec" 2 "unknown codec 'zip'" -- $codec encode --codec zip --shape 1,1,4 --in "$dir/x.f32" --out "$dir/z"
check "foreign key" 2 "has no key 'bits'" -- $codec encode --codec tah --bits 4 --shape 2,16,96 --in "$dir/x.f32" --out "$dir/z"
check "bad value" 2 "tile=63" -- $codec encode --codec tah:tile=63 --shape 2,16,96 --in "$dir/x.f32" --out "$dir/z"
check "bad shape" 2 "--shape" -- $codec encode --codec tah --shape 2,0,96 --in "$dir/x.f32" --out "$dir/z"
check "shape junk" 2 "--shape" -- $codec encode --codec tah --shape 2,16 --in "$dir/x.f32" --out "$dir/z"
check "missing value" 2 "needs a value" -- $codec decode --in
check "unknown option" 2 "unknown option" -- $codec info --frob 1
check "decode extra" 2 "decode takes" -- $codec decode --in "$dir/x.tahf" --out "$dir/y" --shape 1,1,1

# runtime errors: exit 1 with the reason, no output file left behind
check "missing input" 1 "No such file" -- $codec decode --in "$dir/nope.tahf" --out "$dir/never.f32"
check "size mismatch" 1 "needs 12000" -- $codec encode --codec tah --shape 1,1,3000 --in "$dir/x.f32" --out "$dir/never.f32"
head -c 100 "$dir/x.tahf" > "$dir/short.tahf"
check "truncated" 1 "truncated" -- $codec decode --in "$dir/short.tahf" --out "$dir/never.f32"
printf 'not a frame at all, but long enough to hold a header of sixty-four bytes........' > "$dir/junk"
check "bad magic" 1 "bad magic" -- $codec info --in "$dir/junk"
cp "$dir/x.tahf" "$dir/flip.tahf"
printf '\x01' | dd of="$dir/flip.tahf" bs=1 seek=100 conv=notrunc 2>/dev/null
check "checksum" 1 "checksum" -- $codec decode --in "$dir/flip.tahf" --out "$dir/never.f32"
check "nothing written" 0 "" -- test ! -e "$dir/never.f32"
check "no temp files" 0 "" -- sh -c "! ls '$dir' | grep -q tmp"
printf '\x00\x00\xc0\x7f' > "$dir/nan.f32" # one little-endian float32 NaN
check "nan input" 1 "NaN|nan" -- $codec encode --codec tah --shape 1,1,1 --in "$dir/nan.f32" --out "$dir/never.f32"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
