#!/bin/bash
# Usage: onekey-cpu.sh BIN_BEFORE BIN_AFTER [ROUNDS [N BENCH ARGS...]]
# Server CPU per request (perf stat task-clock, all threads) and context
# switches per request of N requests (default: 5,000 HSETs into a new
# hash, `-r 100000000 HSET hhROUND element:__rand_int__ xxx`; `ROUND`
# in BENCH ARGS becomes the round number) from redis-benchmark -c 50, no
# pipelining, two nibble builds (--maxmemory 2gb --threads 2) and
# redis-server 7.0.15 interleaved round by round. task-clock resolves
# what /proc's 10 ms ticks cannot over a 5,000-request run.
A=$1; B=$2; R=${3:-4}; N=${4:-5000}; shift 4 2>/dev/null || shift $#
[ $# -eq 0 ] && set -- -r 100000000 HSET hhROUND element:__rand_int__ xxx
$A --port 7831 --maxmemory 2gb --threads 2 >/dev/null 2>&1 &
$B --port 7832 --maxmemory 2gb --threads 2 >/dev/null 2>&1 &
redis-server --port 7833 --save '' --appendonly no >/dev/null 2>&1 &
sleep 1
for i in $(seq $R); do for P in 7831 7832 7833; do
  SP=$(ss -ltnpH "sport = :$P" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
  perf stat -e task-clock,context-switches -p $SP -o /tmp/onekey-cpu.$P -x, &
  ST=$!; sleep 0.3
  o=$(redis-benchmark -p $P -c 50 -n $N "${@//ROUND/$i}" 2>/dev/null | tr '\r' '\n')
  kill -INT $ST; wait $ST
  echo "$P rps $(echo "$o" | grep 'throughput summary' | awk '{print $3}')" \
    "p99 $(echo "$o" | grep -A3 'latency summary' | tail -1 | awk '{print $5}')" \
    "cpu_us $(grep task-clock /tmp/onekey-cpu.$P | cut -d, -f1 | awk '{printf "%.1f", $1*1000/'$N'}')" \
    "cs $(grep context /tmp/onekey-cpu.$P | cut -d, -f1 | awk '{printf "%.2f", $1/'$N'}')"
done; done
for P in 7831 7832 7833; do redis-cli -p $P shutdown nosave >/dev/null 2>&1; done
wait
