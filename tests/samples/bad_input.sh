#!/usr/bin/env bash
# Bad input for the sample programs: each case must end quickly with exit status != 0 and
# exactly one line on stderr, "PROGRAM: message" (help: status 0 and the usage text).
#   bad_input.sh LAUNCHER BINDIR PORT CASE
# CASE: help | connect_refused | missing_file | unwritable_output | accept_timeout |
#       peer_dies | peer_killed | bad_option
set -euo pipefail
launcher=$1 bindir=$2 port=$3 case=$4
programs=(hello-write rw-server rw-client file-send file-recv cm-pingpong atomic-counter)
tmp=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in ${pids[@]+"${pids[@]}"}; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
failures=0
fail() { echo "FAILED: $*"; failures=$((failures + 1)); }

# expect_error NAME REGEX CMD...: CMD (a sample, under the launcher) fails within 20 s with
# one stderr line matching REGEX.
expect_error() {
  local name=$1 regex=$2
  shift 2
  local rc=0
  timeout 20 "$launcher" run -- "$@" >"$tmp/out" 2>"$tmp/err" </dev/null || rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if ((rc == 0)); then
    fail "$name: exit status 0"
  elif ((rc == 124)); then
    fail "$name: still running after 20 s"
  elif ((lines != 1)) || ! grep -Eq "$regex" "$tmp/err"; then
    fail "$name: expected one stderr line matching '$regex', got: $(cat "$tmp/err")"
  else
    echo "ok: $name -> status $rc: $(cat "$tmp/err")"
  fi
}

case $case in
  help)
    for p in "${programs[@]}"; do
      rc=0
      "$bindir/$p" --help >"$tmp/out" 2>&1 || rc=$?
      if ((rc != 0)) || ! grep -q "^usage: $p" "$tmp/out"; then fail "$p --help: status $rc, output: $(head -1 "$tmp/out")"
      else echo "ok: $p --help"; fi
    done ;;
  connect_refused) # nothing listens on PORT
    expect_error hello-write "^hello-write: connect to 127.0.0.1:$port: Connection refused" \
      "$bindir/hello-write" --port "$port" 127.0.0.1
    expect_error rw-client "^rw-client: connect to .*refused" "$bindir/rw-client" --port "$port" 127.0.0.1
    echo data >"$tmp/in"
    expect_error file-send "^file-send: connect to .*refused" "$bindir/file-send" --port "$port" "$tmp/in" 127.0.0.1
    expect_error atomic-counter "^atomic-counter: connect to .*refused" "$bindir/atomic-counter" --port "$port" 127.0.0.1
    expect_error cm-pingpong "^cm-pingpong: rdma_connect: " "$bindir/cm-pingpong" --port "$port" 127.0.0.1
    expect_error hello-write_bad_host "^hello-write: cannot resolve" "$bindir/hello-write" --port "$port" no.such.host.invalid ;;
  missing_file)
    expect_error file-send "^file-send: cannot read '$tmp/missing': No such file" \
      "$bindir/file-send" --port "$port" "$tmp/missing" 127.0.0.1
    mkdir "$tmp/dir"
    expect_error file-send_dir "^file-send: cannot read '$tmp/dir': Is a directory" \
      "$bindir/file-send" --port "$port" "$tmp/dir" 127.0.0.1 ;;
  unwritable_output)
    expect_error file-recv "^file-recv: cannot write '$tmp/no/such/dir/out'" \
      "$bindir/file-recv" --port "$port" "$tmp/no/such/dir/out" ;;
  accept_timeout) # a server nobody connects to gives up after --timeout
    expect_error hello-write "^hello-write: timed out after 1 s waiting for a client" \
      "$bindir/hello-write" --port "$port" --timeout 1
    expect_error cm-pingpong "^cm-pingpong: timed out after 1 s waiting for a connection request" \
      "$bindir/cm-pingpong" --port "$port" --timeout 1
    expect_error atomic-counter "^atomic-counter: timed out after 1 s waiting for a client" \
      "$bindir/atomic-counter" --port "$port" --clients 2 --timeout 1 ;;
  peer_dies) # a client that connects and goes away at once: the server must notice
    for p in hello-write rw-server file-recv atomic-counter; do
      args=("$bindir/$p" --port "$port" --timeout 5)
      [[ $p == file-recv ]] && args+=("$tmp/out.bin")
      timeout 20 "$launcher" run -- "${args[@]}" >"$tmp/out" 2>"$tmp/err" </dev/null &
      pid=$!
      pids+=("$pid")
      for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
      done
      rc=0
      wait "$pid" || rc=$?
      if ((rc == 0 || rc == 124)) || (($(wc -l <"$tmp/err") != 1)) || ! grep -Eq "^$p: peer (closed|reset) the connection" "$tmp/err"; then
        fail "$p: status $rc, stderr: $(cat "$tmp/err")"
      else
        echo "ok: $p -> status $rc: $(cat "$tmp/err")"
      fi
    done ;;
  peer_killed) # the server is killed (SIGKILL) in the middle of a run: the client fails in bounded time
    # (`uroce run` execs the program: the pid is the server itself)
    "$launcher" run -- "$bindir/cm-pingpong" --port "$port" >"$tmp/server" 2>&1 </dev/null &
    server=$!
    pids+=("$server")
    for _ in $(seq 100); do grep -q listening "$tmp/server" && break; sleep 0.1; done
    timeout 30 "$launcher" run -- "$bindir/cm-pingpong" --port "$port" --timeout 3 --iters 100000000 127.0.0.1 \
      >"$tmp/out" 2>"$tmp/err" </dev/null &
    client=$!
    pids+=("$client")
    sleep 1
    kill -KILL "$server"
    rc=0
    wait "$client" || rc=$?
    if ((rc == 0 || rc == 124)) || (($(wc -l <"$tmp/err") != 1)) || ! grep -q "^cm-pingpong: " "$tmp/err"; then
      fail "cm-pingpong client: status $rc, stderr: $(cat "$tmp/err")"
    else
      echo "ok: cm-pingpong client -> status $rc: $(cat "$tmp/err")"
    fi ;;
  bad_option)
    expect_error rw-server_mode "^rw-server: --mode must be read or write" "$bindir/rw-server" --mode sideways
    expect_error cm-pingpong_size "^cm-pingpong: --size: expected a number" "$bindir/cm-pingpong" --size 1 127.0.0.1
    expect_error hello-write_unknown "^hello-write: unknown argument '--frobnicate'" "$bindir/hello-write" --frobnicate
    expect_error rw-client_no_server "^rw-client: missing SERVER_IP" "$bindir/rw-client" ;;
  *) echo "unknown case '$case'"; exit 2 ;;
esac
((failures == 0)) || exit 1
echo "PASSED: $case"
