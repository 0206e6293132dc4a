#!/usr/bin/env bash
# redis-benchmark -P 16 -t set,get against two nibble builds (one worker
# each) and redis-server, one server at a time, each on CPU 0, the client
# on CPU 1, ROUNDS rounds alternating the three (the 2-vCPU form of the
# issue 26 target; scripts/server-quiet.sh is the many-core one).
#
#   scripts/p16-rounds.sh NEW_NIBBLE BASE_NIBBLE [ROUNDS=5]
set -uo pipefail
new=$1
base=$2
rounds=${3:-5}
for r in $(seq 1 "$rounds"); do
  for which in new base redis; do
    case $which in
      new) taskset -c 0 "$new" --port 26379 --threads 1 --no-pin >/dev/null 2>&1 & p=$! port=26379 ;;
      base) taskset -c 0 "$base" --port 26381 --threads 1 --no-pin >/dev/null 2>&1 & p=$! port=26381 ;;
      redis) taskset -c 0 redis-server --port 26380 --save '' --appendonly no >/dev/null 2>&1 & p=$! port=26380 ;;
    esac
    sleep 1
    echo "round $r $which: $(taskset -c 1 redis-benchmark -p $port -t set,get -P 16 -c 50 -n 2000000 -q 2>/dev/null \
      | tr '\r' '\n' | grep -E '^(SET|GET): [0-9]' | tr '\n' ' ')"
    kill "$p"
    wait "$p" 2>/dev/null
  done
done
