#!/bin/bash
# SET throughput of nibble --data-dir (everysec) with and without checkpoints.
NIB=${NIB:-target/release/nibble}
B=${BENCH_DIR:-/var/tmp/ckpt-set-bench}   # on the disk under test, not tmpfs
PORT=7411
run_one() { # name ckpt
  rm -rf $B; mkdir -p $B
  $NIB --port $PORT --maxmemory 512mb --data-dir $B/store --appendfsync everysec --checkpoint-interval $2 > $B.log 2>&1 &
  local pid=$!
  for i in $(seq 100); do redis-cli -p $PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
  local r=$(redis-benchmark -p $PORT -t set -n 400000 -r 300000 -c 32 -P 1 -q 2>&1 | tr '\r' '\n' | grep "per second" | tail -1)
  local ck=$(redis-cli -p $PORT info persistence | grep -E "^checkpoints:|^checkpoint_last_ms:" | tr -d '\r' | tr '\n' ' ')
  redis-cli -p $PORT shutdown nosave >/dev/null 2>&1
  wait $pid
  echo "$(date -u +%H:%M:%S) load=$(cut -d' ' -f1 /proc/loadavg) $1 ckpt=$2 $r $ck"
}
for round in 1 2 3; do run_one off 0; run_one on 5; done
