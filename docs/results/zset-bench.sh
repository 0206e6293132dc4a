#!/bin/bash
# Usage: zset-bench.sh [BIN_DIR] -> figures for nibble (7511) and redis-server (7512).
# Needs /tmp/zadd1m.resp and /tmp/zadd10.resp from zset-gen.py.
NB=${1:-target/release}/nibble
rss() { grep VmRSS /proc/$1/status | awk '{print $2}'; }
$NB --port 7511 --maxmemory 2gb --threads 2 > /tmp/nbz.log 2>&1 &
NPID=$!
redis-server --port 7512 --save '' --appendonly no > /tmp/rsz.log 2>&1 &
RPID=$!
sleep 1
R0N=$(rss $NPID); R0R=$(rss $RPID)
for P in 7511 7512; do
  S=$(date +%s.%N); redis-cli -p $P --pipe < /tmp/zadd1m.resp | tail -1; E=$(date +%s.%N)
  echo "port $P: 1M ZADD via --pipe: $(echo "$E - $S" | bc) s"
  redis-cli -p $P --pipe < /tmp/zadd10.resp > /dev/null
done
sleep 3
R1N=$(rss $NPID); R1R=$(rss $RPID)
echo "RSS delta for a 1M-member zset (KiB): nibble $((R1N-R0N)) redis $((R1R-R0R))"
for P in 7511 7512; do
  echo "== port $P sizes: $(redis-cli -p $P zcard bigz) $(redis-cli -p $P zcard smallz) enc $(redis-cli -p $P object encoding bigz) $(redis-cli -p $P object encoding smallz)"
  for rep in 1 2 3; do
    echo "ZADD update 1M: $(redis-benchmark -p $P -n 50000 -r 1000000 -q ZADD bigz __rand_int__ element:__rand_int__ | tr '\r' '\n' | grep -v '^$' | tail -1)"
    echo "ZADD update 10: $(redis-benchmark -p $P -n 50000 -r 10 -q ZADD smallz __rand_int__ element:__rand_int__ | tr '\r' '\n' | grep -v '^$' | tail -1)"
    echo "ZSCORE 1M: $(redis-benchmark -p $P -n 50000 -r 1000000 -q ZSCORE bigz element:__rand_int__ | tr '\r' '\n' | grep -v '^$' | tail -1)"
    echo "ZRANK 1M: $(redis-benchmark -p $P -n 50000 -r 1000000 -q ZRANK bigz element:__rand_int__ | tr '\r' '\n' | grep -v '^$' | tail -1)"
    echo "ZRANK 10: $(redis-benchmark -p $P -n 50000 -r 10 -q ZRANK smallz element:__rand_int__ | tr '\r' '\n' | grep -v '^$' | tail -1)"
  done
done
kill $NPID $RPID; wait
