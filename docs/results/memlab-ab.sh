#!/bin/bash
# Usage: memlab-ab.sh PHASES ROUNDS "LABEL:NIBBLE_BIN:ARG ARG" ...
# A/B of nibble builds (or flags) against redis-server in `memlab server
# --quick` (32 connections, pipeline 1, 1 s phases), the builds
# alternated round by round; per run, the nibble and redis rows (ops/s,
# p99 ns, server CPU ns per op) and the ratio rows. ARGs go to nibble via
# --nibble-arg. MEMLAB (default target/release/memlab) is the generator.
# Example: memlab-ab.sh zadd,lpush,sadd,set,multi,get 3 \
#   "base:BASE/nibble:" "new:target/release/nibble:"
PH=$1; R=$2; shift 2
for r in $(seq $R); do
  for spec in "$@"; do
    IFS=: read -r lab bin args <<< "$spec"
    extra=()
    for a in $args; do extra+=("--nibble-arg=$a"); done
    echo "# $lab round $r $(date -u +%H:%M:%S) load $(uptime | sed 's/.*average: //')"
    nice ${MEMLAB:-target/release/memlab} server --quick --systems nibble,redis --phases $PH --rb-requests 0 --nibble-bin $bin "${extra[@]}" > /tmp/memlab-ab.last 2>&1
    grep -E "^(nibble|redis) +($(echo $PH | tr , '|')) " /tmp/memlab-ab.last | awk -v l=$lab 'NF>12 {print l, $1, $2, "ops", $3, "p99", $7, "cpu", $NF} NF<=12 {print l, "ratio", $2, $3, "p99r", $6}'
  done
done
