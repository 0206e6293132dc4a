#!/usr/bin/env bash
# The server against redis-server (and memcached) on a quiet many-core
# machine: redis-benchmark -P 16 with the servers and the client pinned to
# separate CPUs, alternating rounds, then `memlab server --quick` with the
# collection and transaction phases (3 runs each; memcached where installed).
#
#   scripts/server-quiet.sh BIN_DIR OUT_DIR [ROUNDS=3]
#
# BIN_DIR: memlab and nibble (release); redis-server, redis-benchmark and
# memcached on PATH. Server on CPU 2, client on CPUs 4-5 (CPU 0 and 1
# on a machine of fewer than 6).
set -uo pipefail
bin=$1
out=$2
rounds=${3:-3}
mkdir -p "$out"
if [ "$(nproc)" -ge 6 ]; then srv=2; cli=4,5; else srv=0; cli=1; fi
rb() {
  taskset -c $cli redis-benchmark -p "$1" -t set,get -P 16 -c 50 -n 2000000 -q 2>/dev/null \
    | tr '\r' '\n' | grep -E '^(SET|GET): [0-9]' 
}
for r in $(seq "$rounds"); do
  taskset -c $srv "$bin/nibble" --port 26379 --threads 1 --no-pin >/dev/null 2>&1 &
  n=$!
  taskset -c $srv redis-server --port 26380 --save '' --appendonly no >/dev/null 2>&1 &
  s=$!
  sleep 1
  echo "round $r nibble: $(rb 26379 | tr '\n' ' ')"
  echo "round $r redis:  $(rb 26380 | tr '\n' ' ')"
  kill $n $s
  wait $n $s 2>/dev/null
done | tee "$out/rb-pipeline.txt"
systems=nibble,redis
command -v memcached >/dev/null && systems=$systems,memcached
timeout --signal=KILL 300 "$bin/memlab" server --quick --repeat 3 --systems $systems \
  --nibble-bin "$bin/nibble" --phases get,set,lpush,sadd,zadd,multi --json --out "$out/server-quick.jsonl" \
  >/dev/null 2>"$out/server-quick.err"
echo "memlab server rc=$? rows=$(wc -l <"$out/server-quick.jsonl")"
tail -n 5 "$out/server-quick.err"
