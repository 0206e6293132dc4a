#!/bin/bash
# zset-ab.sh BIN_A BIN_B : ZADD 1M/10 medians, A (7521), B (7522), redis (7523); needs zset-gen.py files
A=$1; B=$2; N=${N:-50000}
rss() { grep VmRSS /proc/$1/status | awk '{print $2}'; }
$A --port 7521 --maxmemory 2gb --threads 2 > /tmp/zq-a.log 2>&1 & PA=$!
$B --port 7522 --maxmemory 2gb --threads 2 > /tmp/zq-b.log 2>&1 & PB=$!
redis-server --port 7523 --save '' --appendonly no > /tmp/zq-r.log 2>&1 & PR=$!
sleep 1
for P in 7521 7522 7523; do
  S=$(date +%s.%N); redis-cli -p $P --pipe < /tmp/zadd1m.resp | tail -1 >/dev/null; E=$(date +%s.%N)
  echo "port $P load 1M: $(echo "$E - $S" | bc) s"
  redis-cli -p $P --pipe < /tmp/zadd10.resp > /dev/null
done
echo "RSS after load KiB: A $(rss $PA) B $(rss $PB) R $(rss $PR)"
for rep in 1 2 3; do
 for P in 7521 7522 7523; do
  a=$(redis-benchmark -p $P -n $N -r 1000000 -q ZADD bigz __rand_int__ element:__rand_int__ | tr '\r' '\n' | grep -v '^$' | tail -1 | grep -o '[0-9.]* requests' | cut -d' ' -f1)
  b=$(redis-benchmark -p $P -n $N -r 10 -q ZADD smallz __rand_int__ element:__rand_int__ | tr '\r' '\n' | grep -v '^$' | tail -1 | grep -o '[0-9.]* requests' | cut -d' ' -f1)
  echo "rep $rep port $P ZADD1M $a ZADD10 $b"
 done
done
echo "RSS after updates KiB: A $(rss $PA) B $(rss $PB) R $(rss $PR)"
for P in 7521 7522 7523; do echo "port $P zcard $(redis-cli -p $P zcard bigz) rank $(redis-cli -p $P zrank bigz element:000000000500)"; done
kill $PA $PB $PR; wait
