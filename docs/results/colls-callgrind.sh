#!/bin/bash
# Usage: colls-callgrind.sh LABEL PORT FILE -- SERVER_CMD...
# Instructions per request of one server on a fixed request file: start
# SERVER_CMD (listening on PORT) under callgrind, zero the counters once it
# answers PING, feed FILE with `redis-cli --pipe`, dump, shut down, print
# the total (every thread: workers, compaction, sweeper). Example:
#   python3 colls-gen.py SADD bigs element: 100000 > /tmp/sadd100k.txt
#   colls-callgrind.sh nb 7612 /tmp/sadd100k.txt -- target/release/nibble --port 7612 --threads 1 --maxmemory 2gb
#   colls-callgrind.sh rs 7611 /tmp/sadd100k.txt -- redis-server --port 7611 --save '' --appendonly no
L=$1; P=$2; F=$3; shift 4
OUT=/tmp/cg.$L
rm -f $OUT $OUT.*
valgrind --tool=callgrind --callgrind-out-file=$OUT "$@" > $OUT.log 2>&1 &
VP=$!
for i in $(seq 200); do redis-cli -p $P ping 2>/dev/null | grep -q PONG && break; sleep 0.5; done
callgrind_control -z $VP > /dev/null
redis-cli -p $P --pipe < $F | tail -1
callgrind_control -d $VP > /dev/null
redis-cli -p $P shutdown nosave > /dev/null 2>&1
wait $VP
N=$(grep -c '^\*' $F)
T=$(callgrind_annotate $OUT.1 2>/dev/null | grep -m1 'PROGRAM TOTALS' | awk '{gsub(",","",$1); print $1}')
echo "$L $(basename $F): $T instructions, $((T / N)) per request ($OUT.1)"
