#!/bin/bash
# Usage: colls-ab3.sh BIN_BEFORE BIN_AFTER [ROUNDS]
# Two nibble builds (--maxmemory 2gb --threads 2; ports 7561, 7562) and
# redis-server 7.0.15 (7563), interleaved server by server within each
# round (FLUSHALL first). Per server and round:
#  - bulk loads via `redis-cli --pipe` of /tmp/sadd1m.resp, /tmp/hset1m.resp,
#    /tmp/rpush1m.resp (colls-gen.py SADD bigset / HSET bighash / RPUSH
#    biglist element: 1000000): wall seconds and the server's CPU seconds
#    (utime+stime from /proc);
#  - closed loop, redis-benchmark -c 50, no pipelining, 50,000 requests
#    each: SADD of new members into the 1 M set, HSET update of the 1 M
#    hash, LPUSH and RPOP on the 1 M list: requests/s and p99 (ms).
A=$1; B=$2; R=${3:-3}
$A --port 7561 --maxmemory 2gb --threads 2 > /dev/null 2>&1 &
$B --port 7562 --maxmemory 2gb --threads 2 > /dev/null 2>&1 &
redis-server --port 7563 --save '' --appendonly no > /dev/null 2>&1 &
sleep 1
pid_of() { ss -ltnpH "sport = :$1" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2; }
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
tick=$(getconf CLK_TCK)
load() { # port name file
  local pid=$(pid_of $1) c0 c1 s e
  c0=$(cpu $pid); s=$(date +%s.%N)
  redis-cli -p $1 --pipe < $3 | tail -1 > /dev/null
  e=$(date +%s.%N); c1=$(cpu $pid)
  echo "$1 $2 wall $(echo "$e - $s" | bc | xargs printf '%.2f') cpu $(echo "($c1 - $c0) / $tick" | bc -l | xargs printf '%.2f')"
}
bench() { # port name args...
  local P=$1 name=$2; shift 2
  local o=$(redis-benchmark -p $P -c 50 -n 50000 "$@" 2>/dev/null | tr '\r' '\n')
  echo "$P $name rps $(echo "$o" | grep 'throughput summary' | awk '{print $3}')" \
    "p99 $(echo "$o" | grep -A3 'latency summary' | tail -1 | awk '{print $5}')"
}
for i in $(seq $R); do
  for P in 7561 7562 7563; do
    redis-cli -p $P flushall > /dev/null
    load $P sadd1m /tmp/sadd1m.resp
    load $P hset1m /tmp/hset1m.resp
    load $P rpush1m /tmp/rpush1m.resp
    bench $P saddnew -r 1000000000 SADD bigset new:__rand_int__
    bench $P hsetupd -r 1000000 HSET bighash element:__rand_int__ yyy
    bench $P lpush LPUSH biglist x
    bench $P rpop RPOP biglist
  done
done
for P in 7561 7562 7563; do redis-cli -p $P shutdown nosave > /dev/null 2>&1; done
wait
