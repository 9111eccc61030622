#!/usr/bin/env bash
# test_node_cli.sh TAH_NODE — tah-node's command line contract: usage
# errors exit 2 with the usage text, runtime errors exit 1 with a reason;
# `leave` refuses pid files that do not name a running tah-node (pids are
# reused) and never signals anything else.
set -u
node=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
. "$(dirname "$0")/cli_check.sh"
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
check "stop timeout negative" 2 "--stop-timeout wants" -- "$node" join --coordinator 127.0.0.1:1 --stop-timeout -1
check "stop timeout junk" 2 "--stop-timeout wants" -- "$node" join --coordinator 127.0.0.1:1 --stop-timeout 5s
check "stop timeout nan" 2 "--stop-timeout wants" -- "$node" join --coordinator 127.0.0.1:1 --stop-timeout nan
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
