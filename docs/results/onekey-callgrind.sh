#!/bin/bash
# Usage: onekey-callgrind.sh LABEL PORT N "BENCH ARGS" -- SERVER_CMD...
# Instructions per request of one server under 50 closed-loop clients on
# one key: start SERVER_CMD (listening on PORT) under callgrind, zero the
# counters once it answers PING, run `redis-benchmark -c 50 -n N BENCH
# ARGS` (no pipelining), dump, shut down, print the total over every
# thread (workers, compaction, sweeper) divided by N. Example:
#   onekey-callgrind.sh nb 7821 5000 "-r 100000000 HSET h element:__rand_int__ xxx" -- \
#     target/release/nibble --port 7821 --threads 2 --maxmemory 2gb
#   onekey-callgrind.sh rs 7822 5000 "-r 100000000 HSET h element:__rand_int__ xxx" -- \
#     redis-server --port 7822 --save '' --appendonly no
# With PRE="N ARGS" in the environment, `redis-benchmark -c 50 -n N ARGS`
# runs first, before the counters are zeroed (fill a list, then count
# the pops): PRE="20000 LPUSH q x" onekey-callgrind.sh ... 20000 "RPOP q" -- ...
L=$1; P=$2; N=$3; BA=$4; shift 5
OUT=/tmp/cg.$L
rm -f $OUT $OUT.*
valgrind --tool=callgrind --callgrind-out-file=$OUT "$@" > $OUT.log 2>&1 &
VP=$!
for i in $(seq 200); do redis-cli -p $P ping 2>/dev/null | grep -q PONG && break; sleep 0.5; done
if [ -n "$PRE" ]; then
  redis-benchmark -p $P -c 50 -n ${PRE%% *} ${PRE#* } > /dev/null 2>&1
fi
callgrind_control -z $VP > /dev/null
redis-benchmark -p $P -c 50 -n $N $BA > /dev/null 2>&1
callgrind_control -d $VP > /dev/null
redis-cli -p $P shutdown nosave > /dev/null 2>&1
wait $VP
T=$(callgrind_annotate $OUT.1 2>/dev/null | grep -m1 'PROGRAM TOTALS' | awk '{gsub(",","",$1); print $1}')
echo "$L: $T instructions, $((T / N)) per request ($OUT.1)"
