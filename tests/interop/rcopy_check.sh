#!/usr/bin/env bash
# rcopy (rdmacm-utils: a file copied over rsockets) with its result checked. Both sides
# write the same file, `seq 1 N` (deterministic, N lines), in their own /tmp:
#   rcopy_check.sh server PORT N    serves one connection (60 s at most), compares what
#                                   arrived with the file, stops rcopy
#   rcopy_check.sh client PORT N PEER   sends the file to PEER:/tmp/rcopy.PORT.copy
# The server's rcopy never exits on its own; this script ends it. Exit 0 when the copy
# arrived identical (server) or rcopy succeeded (client).
set -uo pipefail
role=$1 port=$2 lines=$3
file=/tmp/rcopy.$port.src copy=/tmp/rcopy.$port.copy
seq 1 "$lines" >"$file" || exit 1
case $role in
  server)
    rm -f "$copy"
    log=/tmp/rcopy.$port.log
    rcopy -p "$port" >"$log" 2>&1 &
    pid=$!
    trap 'kill "$pid" 2>/dev/null; cat "$log"; echo; rm -f "$file" "$copy" "$log"' EXIT
    # Done with the connection once it waits for the next (rshutdown and rclose returned).
    for _ in $(seq 600); do
      (($(grep -o "waiting for connection" "$log" | wc -l) >= 2)) && break
      kill -0 "$pid" 2>/dev/null || { echo "rcopy_check: rcopy exited"; exit 1; }
      sleep 0.1
    done
    if cmp -s "$file" "$copy"; then
      echo "rcopy_check: received $(stat -c %s "$copy") bytes, identical"
      exit 0
    fi
    echo "rcopy_check: no identical copy ($(stat -c %s "$copy" 2>/dev/null || echo 0) bytes) after the connection or 60 s"
    exit 1
    ;;
  client)
    rcopy "$file" "$4:$copy" -p "$port"
    rc=$?
    rm -f "$file"
    exit $rc
    ;;
esac
echo "usage: rcopy_check.sh server|client PORT LINES [PEER]" >&2
exit 2
