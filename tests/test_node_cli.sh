#!/usr/bin/env bash
# test_node_cli.sh TAH_NODE — tah-node's command line contract: usage
# errors exit 2 with the usage text, runtime errors exit 1 with a reason;
# `leave` refuses pid files that do not name a running tah-node (pids are
# reused) and never signals anything else.
set -u
node=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0
check() { # check NAME EXPECTED_RC PATTERN -- command...
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
check "no command" 2 "usage:" -- "$node"
check "bad command" 2 "join.*leave.*keygen" -- "$node" frobnicate
check "leave needs --pid-file" 2 "--pid-file FILE is required" -- "$node" leave
check "leave bad timeout" 2 "--timeout wants" -- "$node" leave --pid-file "$dir/p" --timeout -3
check "leave unknown arg" 2 "unknown argument" -- "$node" leave --frob
check "leave missing file" 1 "leave: .*p" -- "$node" leave --pid-file "$dir/p"
printf 'garbage\n' >"$dir/g"
check "leave garbage" 1 "does not hold a process id" -- "$node" leave --pid-file "$dir/g"
sleep 30 &
victim=$!
echo "$victim" >"$dir/s"
check "leave not a node" 1 "is not a running tah-node" -- "$node" leave --pid-file "$dir/s"
check "not signalled" 0 "" -- kill -0 "$victim"
kill "$victim" 2>/dev/null
check "advertise port" 2 "--advertise wants" -- "$node" join --coordinator 127.0.0.1:1 --advertise host:99999
check "advertise junk" 2 "--advertise wants" -- "$node" join --coordinator 127.0.0.1:1 --advertise host:12x
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
