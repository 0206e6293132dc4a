#!/bin/bash
# Usage: pinned.sh ROUNDS BIN... : each server on CPU 0 (nibble --threads 1,
# pinned by itself to CPU 0; redis-server under taskset -c 0), the client
# under taskset -c 1. Per round and server: LPUSH/RPOP burst, 2.5 s quiet,
# 5,000 HSETs into a new hash. "redis" as BIN means redis-server.
R=$1; shift
for i in $(seq $R); do
  P=7800
  for B in "$@"; do
    P=$((P+1))
    if [ "$B" = redis ]; then taskset -c 0 redis-server --port $P --save '' --appendonly no > /dev/null 2>&1 &
    else
      extra=""; bin=$B
      case $B in *:d10) bin=${B%:d10}; extra="--memory-decay-ms 10000";; esac
      taskset -c 0 $bin --port $P --maxmemory 2gb --threads 1 $extra > /dev/null 2>&1 &
    fi
    sleep 0.7
    taskset -c 1 redis-benchmark -p $P -n 50000 -c 50 LPUSH q x > /dev/null 2>&1
    taskset -c 1 redis-benchmark -p $P -n 50000 -c 50 RPOP q > /dev/null 2>&1
    sleep 2.5
    o=$(taskset -c 1 redis-benchmark -p $P -n 5000 -c 50 -r 100000000 HSET h element:__rand_int__ xxx 2>/dev/null | tr '\r' '\n')
    echo "$i $B rps $(echo "$o" | grep 'throughput summary' | awk '{print $3}') p99 $(echo "$o" | grep -A3 'latency summary' | tail -1 | awk '{print $5}')"
    redis-cli -p $P shutdown nosave > /dev/null 2>&1
    wait
  done
done
