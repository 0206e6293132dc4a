#!/usr/bin/env bash
# Instructions per request of nibble (one worker) and redis-server under
# `redis-benchmark -P 16 -t set,get`, counted by callgrind over the
# benchmark alone (counters zeroed after start-up, dumped at the end; all
# threads of the process). Unlike throughput, stable on a busy machine.
#
#   scripts/callgrind-per-req.sh NIBBLE_BIN [REQUESTS=100000]
#
# Prints total instructions / (2 x REQUESTS) per server. Needs valgrind,
# redis-server, redis-cli and redis-benchmark on PATH.
set -uo pipefail
nibble=$1
n=${2:-100000}
dir=$(mktemp -d)
run() { # name port cmd...
  local name=$1 port=$2
  shift 2
  valgrind --tool=callgrind --callgrind-out-file="$dir/$name.%p" "$@" >/dev/null 2>"$dir/$name.err" &
  local vg=$!
  for _ in $(seq 60); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.5
  done
  callgrind_control -z $vg >/dev/null 2>&1
  redis-benchmark -p "$port" -t set,get -P 16 -c 4 -n "$n" -q >/dev/null 2>&1
  callgrind_control -d $vg >/dev/null 2>&1
  kill $vg
  wait $vg 2>/dev/null
  local f
  f=$(ls "$dir/$name".*.1 | head -n 1)
  awk -v name="$name" -v n="$n" '/^totals:/ {printf "%-7s %d instructions / %d requests = %.0f per request\n", name, $2, 2 * n, $2 / (2 * n)}' "$f"
}
run nibble 26395 "$nibble" --port 26395 --threads 1 --no-pin
run redis 26396 redis-server --port 26396 --save '' --appendonly no
rm -rf "$dir"
