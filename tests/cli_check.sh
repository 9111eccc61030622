# cli_check.sh — sourced by the command-line tests: `check NAME RC PATTERN
# -- command...` runs the command with stdout and stderr in $dir (which the
# caller creates), and counts a pass when its exit status is RC and, when
# PATTERN is not empty, its output matches PATTERN (grep -E).
pass=0
fail=0
check() {
    local name=$1 want=$2 pat=$3
    shift 4
    "$@" >"$dir/out" 2>"$dir/err"
    local rc=$?
    if [ "$rc" -ne "$want" ] || { [ -n "$pat" ] && ! grep -qE -- "$pat" "$dir/err" "$dir/out"; }; then
        echo "FAIL $name: rc=$rc (want $want), pattern '$pat'"; sed 's/^/    /' "$dir/err" | head -5
        fail=$((fail + 1))
    else
        pass=$((pass + 1))
    fi
}
