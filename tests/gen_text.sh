#!/usr/bin/env bash
# gen_text.sh OUT [WORDS] — a deterministic English-like text (byte-level
# training data) for tests that must not need the network or data/brown.
set -eu
out=$1
n=${2:-40000}
awk -v n="$n" 'BEGIN {
    nw = split("the of and to a in that is was he for it with as his on be at by this had not are but from " \
               "or have an they which one you were her all she there would their we him been has when who will " \
               "more no if out so said what up its about into than them can only other new some could time these " \
               "two may then do first any my now such like our over man me even most made after also did many " \
               "before must through back years where much your way well down should because each just those " \
               "people how too little state good very make world still own see men work long get here between", w, " ")
    s = 12345
    for (i = 0; i < n; i++) {
        s = (s * 1103515245 + 12345) % 2147483648
        printf "%s%s", w[int(s / 65536) % nw + 1], (i % 13 == 12) ? ".\n" : " "
    }
}' > "$out.tmp.$$"
mv "$out.tmp.$$" "$out"
