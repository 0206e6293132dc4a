#!/bin/bash
# Usage: colls-percall-callgrind.sh LABEL BIN|redis CMD...   (CMD: zadd zrange sadd sismember lpush rpop set get)
# Instructions per request of one server (nibble BIN with its default
# threads, or redis-server) under `redis-benchmark -c 32 -n 10000` (no
# pipelining) over 1,000 keys (`-r 1000`; SET/GET over 100,000), each
# command on its own fresh server: it starts under callgrind, a fill
# (`pre`) runs for the read and pop commands, the counters are zeroed, the
# benchmark runs, and the total over every thread is divided by 10,000.
# Uses onekey-callgrind.sh's steps with -c 32 and a fill; needs valgrind,
# redis-server, redis-cli, redis-benchmark. Example:
#   colls-percall-callgrind.sh new target/release/nibble zadd zrange
#   colls-percall-callgrind.sh rs redis zadd zrange
L=$1; B=$2; shift 2
for n in "$@"; do
 case $n in
  zadd) pre="10000 -r 1000 ZADD zset:__rand_int__ __rand_int__ __rand_int__"; a="-r 1000 ZADD zset:__rand_int__ __rand_int__ __rand_int__";;
  zrange) pre="10000 -r 1000 ZADD zset:__rand_int__ __rand_int__ __rand_int__"; a="-r 1000 ZRANGE zset:__rand_int__ 0 9";;
  sadd) pre=""; a="-r 1000 SADD set:__rand_int__ __rand_int__";;
  sismember) pre="10000 -r 1000 SADD set:__rand_int__ __rand_int__"; a="-r 1000 SISMEMBER set:__rand_int__ __rand_int__";;
  lpush) pre=""; a="-r 1000 LPUSH list__rand_int__ xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";;
  rpop) pre="20000 -r 1000 LPUSH list__rand_int__ xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; a="-r 1000 RPOP list__rand_int__";;
  set) pre=""; a="-r 100000 -d 128 -t set";;
  get) pre="20000 -r 100000 -d 128 -t set"; a="-r 100000 -d 128 -t get";;
 esac
 if [ $B = redis ]; then cmd=(redis-server --port 7844 --save '' --appendonly no); else cmd=($B --port 7844 --maxmemory 256mb); fi
 OUT=/tmp/cg.$L-$n
 rm -f $OUT $OUT.*
 valgrind --tool=callgrind --callgrind-out-file=$OUT "${cmd[@]}" > $OUT.log 2>&1 &
 VP=$!
 for i in $(seq 200); do redis-cli -p 7844 ping 2>/dev/null | grep -q PONG && break; sleep 0.5; done
 [ -n "$pre" ] && redis-benchmark -p 7844 -c 32 -n ${pre%% *} ${pre#* } > /dev/null 2>&1
 callgrind_control -z $VP > /dev/null
 redis-benchmark -p 7844 -c 32 -n 10000 $a > /dev/null 2>&1
 callgrind_control -d $VP > /dev/null
 redis-cli -p 7844 shutdown nosave > /dev/null 2>&1
 wait $VP
 T=$(callgrind_annotate $OUT.1 2>/dev/null | grep -m1 'PROGRAM TOTALS' | awk '{gsub(",","",$1); print $1}')
 echo "$L-$n: $T instructions, $((T / 10000)) per request ($OUT.1)"
done
