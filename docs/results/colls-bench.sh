#!/bin/bash
# Usage: colls-bench.sh [BIN_DIR] -> prints figures for nibble (7501) and redis-server (7502)
NB=${1:-target/release}/nibble
rss() { grep VmRSS /proc/$1/status | awk '{print $2}'; }
$NB --port 7501 --maxmemory 2gb --threads 2 > /tmp/nb.log 2>&1 &
NPID=$!
redis-server --port 7502 --save '' --appendonly no > /tmp/rs.log 2>&1 &
RPID=$!
sleep 1
for P in 7501 7502; do
  echo "== port $P (7501 nibble, 7502 redis)"
  for i in 1 2 3; do
    redis-benchmark -p $P -n 5000 -r 100000000 -q HSET h5k$i element:__rand_int__ xxx | tr '\r' '\n' | grep -v "^$" | tail -1
  done
  redis-cli -p $P hlen h5k1
done
R0N=$(rss $NPID); R0R=$(rss $RPID)
for P in 7501 7502; do
  S=$(date +%s.%N); redis-cli -p $P --pipe < /tmp/sadd1m.resp | tail -1; E=$(date +%s.%N)
  echo "port $P: 1M SADD via --pipe: $(echo "$E - $S" | bc) s"
done
R1N=$(rss $NPID); R1R=$(rss $RPID)
echo "RSS delta for a 1M-member set (KiB): nibble $((R1N-R0N)) redis $((R1R-R0R))"
for P in 7501 7502; do
  S=$(date +%s.%N); redis-cli -p $P --pipe < /tmp/hset1m.resp | tail -1; E=$(date +%s.%N)
  echo "port $P: 1M HSET via --pipe: $(echo "$E - $S" | bc) s"
done
R2N=$(rss $NPID); R2R=$(rss $RPID)
echo "RSS delta for a 1M-field hash (KiB): nibble $((R2N-R1N)) redis $((R2R-R1R))"
for P in 7501 7502; do
  redis-cli -p $P --pipe < /tmp/hset10.resp > /dev/null; redis-cli -p $P --pipe < /tmp/sadd10.resp >/dev/null
  echo "== port $P sizes: $(redis-cli -p $P hlen bighash) $(redis-cli -p $P scard bigset) $(redis-cli -p $P hlen smallhash) $(redis-cli -p $P scard smallset) enc $(redis-cli -p $P object encoding bighash)"
  for rep in 1 2 3; do
    echo "HSET update 1M: $(redis-benchmark -p $P -n 100000 -r 1000000 -q HSET bighash element:__rand_int__ yyy | tr '\r' '\n' | grep -v '^$' | tail -1)"
    echo "HSET update 10: $(redis-benchmark -p $P -n 100000 -r 10 -q HSET smallhash element:__rand_int__ yyy | tr '\r' '\n' | grep -v '^$' | tail -1)"
    echo "SADD new into 1M: $(redis-benchmark -p $P -n 100000 -r 1000000000 -q SADD bigset new:__rand_int__ | tr '\r' '\n' | grep -v '^$' | tail -1)"
    echo "SADD present 10: $(redis-benchmark -p $P -n 100000 -r 10 -q SADD smallset element:__rand_int__ | tr '\r' '\n' | grep -v '^$' | tail -1)"
    echo "SADD present 1M: $(redis-benchmark -p $P -n 100000 -r 1000000 -q SADD bigset element:__rand_int__ | tr '\r' '\n' | grep -v '^$' | tail -1)"
  done
done
kill $NPID $RPID; wait
