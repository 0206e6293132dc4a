#!/bin/bash
# colls-ab.sh BIN_A BIN_B : HSET 5k into a new hash, LPUSH/RPOP, 1M SADD load (colls-gen.py file); A 7541, B 7542, redis 7543
A=$1; B=$2
$A --port 7541 --maxmemory 2gb --threads 2 > /tmp/cq-a.log 2>&1 & PA=$!
$B --port 7542 --maxmemory 2gb --threads 2 > /tmp/cq-b.log 2>&1 & PB=$!
redis-server --port 7543 --save '' --appendonly no > /tmp/cq-r.log 2>&1 & PR=$!
sleep 1
q() { redis-benchmark -p $1 "${@:2}" | tr '\r' '\n' | grep -v '^$' | tail -1 | grep -o '[0-9.]* requests' | cut -d' ' -f1; }
for rep in 1 2 3; do
 for P in 7541 7542 7543; do
  echo "rep $rep port $P HSET5k $(q $P -n 5000 -r 100000000 -q HSET h5k$rep element:__rand_int__ xxx) LPUSH $(q $P -n 50000 -q LPUSH l$rep x) RPOP $(q $P -n 50000 -q RPOP l$rep)"
 done
done
for P in 7541 7542 7543; do
  S=$(date +%s.%N); redis-cli -p $P --pipe < /tmp/sadd1m.resp | tail -1 > /dev/null; E=$(date +%s.%N)
  echo "port $P: 1M SADD via --pipe: $(echo "$E - $S" | bc) s"
done
kill $PA $PB $PR; wait
