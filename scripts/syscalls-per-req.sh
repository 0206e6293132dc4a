#!/usr/bin/env bash
# Syscalls, context switches and CPU time per request of a server under
# `redis-benchmark -P 16`, for nibble (one worker) and redis-server in
# alternation: counts that, unlike throughput, hold still on a busy machine.
#
#   ROUNDS=3 REQUESTS=1000000 TESTS=set,get RT=1 scripts/syscalls-per-req.sh NIBBLE_BIN...
#
# Several nibble binaries (e.g. before and after a change) are measured in
# turn with redis-server, labelled nibble1, nibble2, ... RT=1 runs the
# servers and the client under SCHED_FIFO (`chrt -f 10`), so that other
# jobs on a shared machine do not preempt them: closer to a quiet machine.
#
# Each server runs pinned to CPU 0, the client to CPU 1 (one core each on
# a 2-vCPU machine). Per test (SET, GET) the server's syscalls are counted
# with `perf stat` tracepoints attached to its process over the test alone,
# its context switches from /proc/PID/status and its CPU time from
# /proc/PID/stat. Printed per request: syscalls by name, context switches
# (voluntary + involuntary), user and system CPU ns; and the client's
# req/s. Needs perf with syscall tracepoints (root or perf_event_paranoid
# <= -1), redis-server and redis-benchmark on PATH.
set -uo pipefail
rounds=${ROUNDS:-1}
n=${REQUESTS:-1000000}
tests=${TESTS:-set,get}
rt=()
[ "${RT:-0}" = 1 ] && rt=(chrt -f 10)
clk=$(getconf CLK_TCK)
evs=raw_syscalls:sys_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_ctl
evs=$evs,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_write
evs=$evs,syscalls:sys_enter_sendto,syscalls:sys_enter_writev,syscalls:sys_enter_futex
evs=$evs,syscalls:sys_enter_clock_gettime

# Context switches of the thread that serves (nibble's worker, redis-server's
# main thread): those of background threads are not per request.
csw() {
  local t
  for t in /proc/"$1"/task/*; do
    case $(cat "$t"/comm) in nibble-worker-* | redis-server) cat "$t"/status ;; esac
  done | awk '/ctxt_switches/ {s += $2} END {print s}'
}
cpu() { awk '{print $14, $15}' /proc/"$1"/stat; }

measure() { # name pid port test
  local name=$1 pid=$2 port=$3 t=$4
  # Keys exist for GET: a SET pass of the same size first, unmeasured.
  [ "$t" = get ] && "${rt[@]}" taskset -c 1 redis-benchmark -p "$port" -t set -P 16 -c 50 -n "$n" -q >/dev/null 2>&1
  local c0 u0 s0 c1 u1 s1 rps
  c0=$(csw "$pid")
  read -r u0 s0 < <(cpu "$pid")
  perf stat -x, -e "$evs" -p "$pid" -o /tmp/sysreq.$$ &
  local p=$!
  sleep 0.2
  rps=$("${rt[@]}" taskset -c 1 redis-benchmark -p "$port" -t "$t" -P 16 -c 50 -n "$n" -q 2>/dev/null \
    | tr '\r' '\n' | grep -E '^[A-Z]+: [0-9]' | tail -n 1 | awk '{print $2}')
  kill -INT $p
  wait $p 2>/dev/null
  c1=$(csw "$pid")
  read -r u1 s1 < <(cpu "$pid")
  awk -F, -v name="$name" -v t="$t" -v n="$n" -v rps="$rps" -v csw=$((c1 - c0)) \
    -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v clk="$clk" '
    /sys_enter/ { sub(/.*sys_enter_?/, "", $3); if ($3 == "") $3 = "all"; c[$3] = $1 }
    END {
      printf "%-6s %-3s %9s req/s  syscalls/req %.3f (epoll_wait %.3f epoll_ctl %.3f read %.3f recvfrom %.3f write %.3f sendto %.3f writev %.3f futex %.3f)  csw/req %.4f  user %.0f ns sys %.0f ns\n",
        name, t, rps, c["all"] / n, c["epoll_wait"] / n, c["epoll_ctl"] / n, c["read"] / n,
        c["recvfrom"] / n, c["write"] / n, c["sendto"] / n, c["writev"] / n, c["futex"] / n,
        csw / n, u * 1e9 / clk / n, s * 1e9 / clk / n
    }' /tmp/sysreq.$$
}

for r in $(seq "$rounds"); do
  pids=()
  i=0
  for b in "$@"; do
    i=$((i + 1))
    "${rt[@]}" taskset -c 0 "$b" --port $((26380 + i)) --threads 1 --no-pin >/dev/null 2>&1 &
    pids+=($!)
  done
  "${rt[@]}" taskset -c 0 redis-server --port 26380 --save '' --appendonly no >/dev/null 2>&1 &
  rp=$!
  sleep 1
  for t in ${tests//,/ }; do
    i=0
    for p in "${pids[@]}"; do
      i=$((i + 1))
      measure nibble$i "$p" $((26380 + i)) "$t"
    done
    measure redis $rp 26380 "$t"
  done
  kill "${pids[@]}" $rp
  wait "${pids[@]}" $rp 2>/dev/null
done
rm -f /tmp/sysreq.$$
