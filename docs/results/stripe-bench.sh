#!/bin/bash
# Usage: stripe-bench.sh BIN_BEFORE BIN_AFTER [ROUNDS]
# 50 clients (redis-benchmark -c 50, no pipelining) writing ONE key:
# 5,000 HSETs into a new hash, 50,000 LPUSH and 50,000 RPOP on one list.
# Two nibble builds (--maxmemory 2gb --threads 2) and redis-server 7.0.15,
# interleaved round by round. Per run: requests/s, p50 and p99 (ms), the
# server's CPU per request (µs, utime+stime from /proc) and its voluntary
# context switches per request. PORT0 (default 7701): the first of the
# three ports used.
A=$1; B=$2; R=${3:-3}
P1=${PORT0:-7701}; P2=$((P1 + 1)); P3=$((P1 + 2))
$A --port $P1 --maxmemory 2gb --threads 2 > /dev/null 2>&1 &
$B --port $P2 --maxmemory 2gb --threads 2 > /dev/null 2>&1 &
redis-server --port $P3 --save '' --appendonly no > /dev/null 2>&1 &
sleep 1
pid_of() { ss -ltnpH "sport = :$1" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2; }
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
vcs() { cat /proc/$1/task/*/status | awk '/^voluntary_ctxt/{s+=$2} END{print s}'; }
run() { # port name n args...
  local P=$1 name=$2 n=$3; shift 3
  local pid=$(pid_of $P) c0 c1 v0 v1 o
  c0=$(cpu $pid); v0=$(vcs $pid)
  o=$(redis-benchmark -p $P -n $n "$@" 2>/dev/null | tr '\r' '\n')
  c1=$(cpu $pid); v1=$(vcs $pid)
  local tick=$(getconf CLK_TCK)
  echo "$P $name rps $(echo "$o" | grep 'throughput summary' | awk '{print $3}')" \
    "p50 $(echo "$o" | grep -A3 'latency summary' | tail -1 | awk '{print $3}')" \
    "p99 $(echo "$o" | grep -A3 'latency summary' | tail -1 | awk '{print $5}')" \
    "cpu_us $(echo "($c1 - $c0) * 1000000 / $tick / $n" | bc -l | xargs printf '%.1f')" \
    "vcs $(echo "($v1 - $v0) / $n" | bc -l | xargs printf '%.2f')"
}
for i in $(seq $R); do
  for P in $P1 $P2 $P3; do
    run $P hsetnew 5000 -r 100000000 HSET h$i element:__rand_int__ xxx
    run $P lpush 50000 LPUSH q$i x
    run $P rpop 50000 RPOP q$i
  done
done
for P in $P1 $P2 $P3; do redis-cli -p $P shutdown nosave > /dev/null 2>&1; done
wait
