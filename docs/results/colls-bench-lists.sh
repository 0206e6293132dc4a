#!/bin/bash
# Usage: colls-bench-lists.sh [BIN_DIR] -> LPUSH/RPOP figures for nibble (7501) and redis-server (7502).
# Needs /tmp/rpush1m.resp and /tmp/rpush10.resp (colls-gen.py RPUSH biglist/smalllist).
NB=${1:-target/release}/nibble
$NB --port 7501 --maxmemory 2gb --threads 2 > /tmp/nb.log 2>&1 &
NPID=$!
redis-server --port 7502 --save '' --appendonly no > /tmp/rs.log 2>&1 &
RPID=$!
sleep 1
for P in 7501 7502; do
  redis-cli -p $P --pipe < /tmp/rpush1m.resp | tail -1
  redis-cli -p $P --pipe < /tmp/rpush10.resp > /dev/null
  echo "== port $P (7501 nibble, 7502 redis) len $(redis-cli -p $P llen biglist) $(redis-cli -p $P llen smalllist)"
  for rep in 1 2 3; do
    echo "LPUSH+RPOP 1M: $(redis-benchmark -p $P -n 100000 -q LPUSH biglist x | tr '\r' '\n' | grep -v '^$' | tail -1) / $(redis-benchmark -p $P -n 100000 -q RPOP biglist | tr '\r' '\n' | grep -v '^$' | tail -1)"
    echo "LPUSH+RPOP 10: $(redis-benchmark -p $P -n 100000 -q LPUSH smalllist x | tr '\r' '\n' | grep -v '^$' | tail -1) / $(redis-benchmark -p $P -n 100000 -q RPOP smalllist | tr '\r' '\n' | grep -v '^$' | tail -1)"
  done
done
kill $NPID $RPID; wait
