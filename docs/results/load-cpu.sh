#!/bin/bash
# load-cpu.sh BIN FILE : wall time and server CPU seconds (user+sys) to ingest FILE via redis-cli --pipe
B=$1; F=$2
$B --port 7551 --maxmemory 2gb --threads 2 > /tmp/cpu-n.log 2>&1 & P=$!
sleep 1
t() { awk '{print $14+$15}' /proc/$P/stat; }
T0=$(t); S=$(date +%s.%N)
redis-cli -p 7551 --pipe < $F | tail -1 > /dev/null
E=$(date +%s.%N); T1=$(t)
echo "$(basename $B) $(basename $F): wall $(echo "$E - $S" | bc) s, server CPU $(echo "($T1 - $T0)/100" | bc -l | cut -c1-6) s"
kill $P; wait
