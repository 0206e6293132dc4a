#!/bin/bash
# appendfsync benchmark: nibble --data-dir (disk) always/everysec/no, nibble without data dir,
# redis-server 7.0 appendonly yes appendfsync always/everysec. 3 rounds, interleaved.
NIB=${NIB:-target/release/nibble}
B=${BENCH_DIR:-/var/tmp/aof-bench}   # on the disk under test, not tmpfs
OUT=${OUT:-appendfsync.out}
: > $OUT
PORT=7400
run_one() { # name c n startcmd...
  local name=$1 c=$2 n=$3; shift 3
  rm -rf $B; mkdir -p $B
  "$@" > $B.log 2>&1 &
  local pid=$!
  for i in $(seq 100); do redis-cli -p $PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
  local r=$(redis-benchmark -p $PORT -t set -n $n -c $c -P 1 -q 2>&1 | tr '\r' '\n' | grep "per second" | tail -1)
  local fl=$(redis-cli -p $PORT info persistence | grep -E "^aof_flushes:" | tr -d '\r')
  redis-cli -p $PORT shutdown nosave >/dev/null 2>&1
  wait $pid
  echo "$round $name c=$c n=$n $r $fl" | tee -a $OUT
}
for round in 1 2 3; do
 for c in 32 1; do
  for cfg in nib-always nib-everysec nib-no nib-nodir redis-always redis-everysec; do
   case $cfg in
    *always) if [ $c = 32 ]; then n=20000; else n=2000; fi ;;
    *) if [ $c = 32 ]; then n=200000; else n=50000; fi ;;
   esac
   case $cfg in
    nib-nodir) run_one $cfg $c $n $NIB --port $PORT --maxmemory 256mb ;;
    nib-*) run_one $cfg $c $n $NIB --port $PORT --maxmemory 256mb --data-dir $B/store --appendfsync ${cfg#nib-} ;;
    redis-*) run_one $cfg $c $n redis-server --port $PORT --dir $B --save "" --appendonly yes --appendfsync ${cfg#redis-} ;;
   esac
  done
 done
done
echo DONE >> $OUT
