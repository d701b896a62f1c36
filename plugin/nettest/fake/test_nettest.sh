#!/usr/bin/env bash
# Functional tests of mpib-nettest against the TCP fake plugin (no RDMA needed).
# Usage: plugin/nettest/fake/test_nettest.sh   (from the repository root; builds what it needs)
set -u
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p build
gcc -std=gnu11 -O2 -g -Wall -Wextra -Werror -Iplugin -o build/mpib-nettest plugin/nettest/*.c -ldl -lpthread -lm || exit 1
gcc -std=gnu11 -O2 -g -Wall -Wextra -Werror -shared -fPIC -Iplugin -o build/libnccl-net-fake.so \
  plugin/nettest/fake/fakenet.c || exit 1

NT=$PWD/build/mpib-nettest
FAKE=$PWD/build/libnccl-net-fake.so
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# Side-channel ports below Linux's ephemeral range (32768-60999 by default): a port in it can be
# taken by any outgoing connection on the host (the lab VM's, Docker's), and the server then
# fails to listen (a CI run failed its garbage-peer case so). Each case takes the next port.
PORT=$((20000 + RANDOM % 10000))
fails=0

ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

# pair NAME WANT_SERVER_RC WANT_CLIENT_RC [server-only env as S:VAR=VAL ...] -- common args
# Runs both sides on loopback; outputs in $TMP/NAME.{s,c}.{out,err}.
pair() {
  local name=$1 ws=$2 wc=$3
  shift 3
  local senv=()
  while [ "$1" != "--" ]; do senv+=("${1#S:}"); shift; done
  shift
  PORT=$((PORT + 1))
  env "${senv[@]}" "$NT" --role server --oob-listen 127.0.0.1:$PORT --plugin "$FAKE" "$@" \
    >"$TMP/$name.s.out" 2>"$TMP/$name.s.err" &
  local spid=$!
  "$NT" --role client --oob-connect 127.0.0.1:$PORT --plugin "$FAKE" "$@" >"$TMP/$name.c.out" 2>"$TMP/$name.c.err"
  local crc=$?
  wait $spid
  local src=$?
  if [ $src -eq "$ws" ] && [ $crc -eq "$wc" ]; then
    ok "$name (server rc=$src client rc=$crc)"
  else
    bad "$name: server rc=$src (want $ws) client rc=$crc (want $wc)"
    tail -n 5 "$TMP/$name".*.err
  fi
}

has() { # has NAME FILE-SUFFIX REGEX
  if grep -Eq "$3" "$TMP/$1.$2"; then ok "$1: $2 matches /$3/"; else bad "$1: $2 lacks /$3/"; cat "$TMP/$1.$2"; fi
}

pair verify1 0 0 -- --mode verify --count 200 --max-size 1M --timeout-s 20
has verify1 s.out '^nettest-result: role=server mode=verify messages=200 payload_bytes=[0-9]+ verified=true seconds=[0-9.]+ mbps=[0-9.]+'
has verify1 c.out '^nettest-result: role=client mode=verify messages=200 .* verified=true'
pair verify-multi 0 0 -- --mode verify --count 333 --multi 8 --window 3 --max-size 256K --seed 7 --timeout-s 20
has verify-multi s.out 'messages=333 .*verified=true.* window=3 multi=8'
pair verify-bytes 0 0 -- --mode verify --bytes 64M --multi 4 --max-size 8M --full-canary --timeout-s 20
has verify-bytes s.out 'verified=true'
pair verify-abi8 0 0 -- --abi 8 --mode verify --count 100 --multi 2 --max-size 64K --timeout-s 20
has verify-abi8 s.out 'verified=true'
pair verify-abi7 0 0 -- --abi 7 --mode verify --count 100 --multi 2 --max-size 64K --timeout-s 20
has verify-abi7 s.out 'verified=true'
# The fake emits no profiler events: the callback path and the report line, not MPIB's events.
pair verify-profiler 0 0 -- --abi 11 --profiler --mode verify --count 20 --max-size 64K --timeout-s 20
has verify-profiler s.out '^nettest-profiler: starts=0 stops=0 open=0 bad=0 '
pair verify-zero 0 0 -- --mode verify --count 50 --max-size 0 --timeout-s 20
has verify-zero s.out 'messages=50 payload_bytes=0 verified=true'
pair verify-memlimit 0 0 -- --mode verify --count 40 --multi 4 --max-size 16M --mem-limit 100M --timeout-s 20
has verify-memlimit s.err 'window lowered from 8 to 1'

pair corrupt 1 1 S:FAKENET_CORRUPT_MSG=17 -- --mode verify --count 100 --max-size 1M --timeout-s 20
has corrupt s.out 'verified=false'
has corrupt s.err 'msg=17 .*first mismatch at offset'
has corrupt c.out 'verified=false'
pair overrun 1 1 S:FAKENET_OVERRUN_MSG=5 -- --mode verify --count 20 --max-size 1M --timeout-s 20
has overrun s.err 'past the received size was overwritten'
pair badsize 1 1 S:FAKENET_BAD_SIZE_MSG=3 -- --mode verify --count 20 --max-size 1M --timeout-s 20
has badsize s.err 'received size [0-9]+, sent size'

pair bw 0 0 -- --mode bw --sizes 4096,65536,1M --iters 30 --warmup 2 --timeout-s 20
has bw s.out '^nettest-bw: size=1048576 iters=30 seconds=[0-9.]+ mbps=[0-9.]+ role=server verified=true'
has bw c.out '^nettest-bw: size=65536 iters=30 seconds=[0-9.]+ mbps=[0-9.]+ role=client rx_mbps=[0-9.]+ verified=true'
pair bw-seconds 0 0 -- --mode bw --min-size 64K --max-size 256K --seconds 0.3 --multi 2 --timeout-s 20
has bw-seconds s.out '^nettest-bw: size=262144 iters=[1-9][0-9]* '
has bw-seconds c.out 'nettest-result: role=client mode=bw .*verified=true'

pair lat 0 0 -- --mode lat --iters 200 --warmup 10 --sizes 8,4096 --timeout-s 20
has lat c.out '^nettest-lat: size=8 iters=200 avg_us=[0-9.]+ p50_us=[0-9.]+ p99_us=[0-9.]+ rtt_avg_us='
has lat s.out 'nettest-result: role=server mode=lat messages=400 .*verified=true'

pair connect 0 0 -- --mode connect --comms 3 --timeout-s 20
has connect c.out '^nettest-connect: comms=3 total_s=[0-9.]+ .*verified=true role=client'
has connect s.out '^connect-phases: comms=3 role=server round=1 lines=0 .* setup_ctxsw=[0-9]+ setup_ctxsw_caller=[0-9]+ setup_ctxsw_busiest=[0-9]+ setup_threads_new=[0-9]+$'

# --call-stats on kernel counters: a connect that sleeps 30 ms blocked, for at least that long.
pair callstats 0 0 -- --mode connect --comms 2 --timeout-s 20 --call-stats
has callstats c.out '^nettest-connect: .* calls_blocked=[0-9]+ calls_descheduled=[0-9]+ longest_blocked_ms=[0-9.]+ longest_unswitched_ms=[0-9.]+ longest_call_cpu_ms=[0-9.]+ longest_call_wait_ms=[0-9.]+ longest_own_ms=[0-9.]+$'
pair callstats-blocked 0 0 S:FAKENET_CONNECT_SLEEP_MS=30 -- --mode connect --comms 2 --timeout-s 20 --call-stats
has callstats-blocked s.out ' calls_blocked=[1-9][0-9]* .*longest_blocked_ms=([3-9][0-9]|[1-9][0-9]{2,})\.[0-9] .*longest_own_ms=([3-9][0-9]|[1-9][0-9]{2,})\.[0-9]$'

pair badhandle 0 0 -- --mode badhandle --timeout-s 10
has badhandle c.out '^nettest-badinput: case=handle rc=[1-9]'
pair garbage 0 0 -- --mode garbage-peer --timeout-s 10
has garbage s.out '^nettest-badinput: case=metadata rc=0$'
has garbage c.out '^nettest-garbage: sent=4096 to=127.0.0.1:'

# Parameters that differ between the sides: both exit 2 with a clear message.
PORT=$((PORT + 1))
"$NT" --role server --oob-listen 127.0.0.1:$PORT --plugin "$FAKE" --count 10 --timeout-s 5 >/dev/null 2>"$TMP/pm.err" &
"$NT" --role client --oob-connect 127.0.0.1:$PORT --plugin "$FAKE" --count 11 --timeout-s 5 >/dev/null 2>&1
crc=$?
wait $!
src=$?
if [ $src -eq 2 ] && [ $crc -eq 2 ] && grep -q 'disagree on parameters' "$TMP/pm.err"; then ok "param-mismatch"; else bad "param-mismatch ($src $crc)"; fi

# The server dies mid-run: the client must fail fast (side channel EOF), not hang.
PORT=$((PORT + 1))
"$NT" --role server --oob-listen 127.0.0.1:$PORT --plugin "$FAKE" --count 100000 --max-size 1M >/dev/null 2>&1 &
spid=$!
( sleep 1; kill -9 $spid ) &
start=$SECONDS
"$NT" --role client --oob-connect 127.0.0.1:$PORT --plugin "$FAKE" --count 100000 --max-size 1M --timeout-s 30 \
  >/dev/null 2>"$TMP/kill.err"
crc=$?
wait 2>/dev/null
if [ $crc -eq 1 ] && [ $((SECONDS - start)) -lt 15 ]; then ok "peer killed -> client rc=1 in $((SECONDS - start)) s"; else
  bad "peer killed: client rc=$crc after $((SECONDS - start)) s"; tail -n 3 "$TMP/kill.err"; fi

# Init failure: exit 3, the plugin's WARN on stderr, nettest-init on stdout.
FAKENET_FAIL_INIT=1 "$NT" --role server --oob-listen 127.0.0.1:1 --plugin "$FAKE" >"$TMP/init.out" 2>"$TMP/init.err"
rc=$?
if [ $rc -eq 3 ] && grep -q '^nettest-init: rc=2 ndev=0' "$TMP/init.out" &&
  grep -q '^NCCL WARN NET/FAKE init failed on purpose' "$TMP/init.err"; then ok "init-failure"; else
  bad "init-failure rc=$rc"; cat "$TMP/init.out" "$TMP/init.err"; fi
FAKENET_FAIL_INIT=1 NCCL_DEBUG=NONE "$NT" --role server --oob-listen 127.0.0.1:1 --plugin "$FAKE" >/dev/null 2>"$TMP/quiet.err"
if ! grep -q '^NCCL ' "$TMP/quiet.err"; then ok "NCCL_DEBUG=NONE silences the logger"; else bad "NCCL_DEBUG=NONE"; fi
NCCL_DEBUG=INFO "$NT" --role client --oob-connect 127.0.0.1:1 --timeout-s 1 --plugin "$FAKE" >/dev/null 2>"$TMP/info.err"
if grep -q '^NCCL INFO NET/FAKE init ok' "$TMP/info.err"; then ok "NCCL_DEBUG=INFO"; else bad "NCCL_DEBUG=INFO"; fi

# Usage and setup errors: exit 2.
usage() {
  "$NT" "$@" >/dev/null 2>"$TMP/usage.err"
  local rc=$?
  if [ $rc -eq 2 ]; then ok "usage: $* -> 2 ($(head -n1 "$TMP/usage.err"))"; else bad "usage: $* -> $rc"; fi
}
usage
usage --role both --oob-listen 1.2.3.4:5
usage --role server
usage --role server --oob-listen nowhere
usage --role client --oob-connect 127.0.0.1:1 --multi 9
usage --role client --oob-connect 127.0.0.1:1 --window 0
usage --role client --oob-connect 127.0.0.1:1 --mode nope
if grep -q "unknown --mode 'nope' (verify, bw, lat, .*connect, resources)" "$TMP/usage.err"; then ok "a bad --mode lists every mode"; else bad "a bad --mode: $(cat "$TMP/usage.err")"; fi
usage --role client --oob-connect 127.0.0.1:1 --max-size 2G
usage --role client --oob-connect 127.0.0.1:1 --sizes 1,x
usage --role client --oob-connect 127.0.0.1:1 --abi 13
usage --role client --oob-connect 127.0.0.1:1 --abi 6
usage --role client --oob-connect 127.0.0.1:1 --abi 9 --profiler
usage --role client --oob-connect 127.0.0.1:1 --bogus
usage --role client --oob-connect 127.0.0.1:1 extra
usage --role client --oob-connect 127.0.0.1:1 --plugin /nonexistent/libx.so
usage --role client --oob-connect 127.0.0.1:1 --plugin "$FAKE" --timeout-s 1
if "$NT" --help >/dev/null; then ok "--help exits 0"; else bad "--help"; fi

echo "$fails failure(s)"
[ $fails -eq 0 ]
