#!/bin/bash
# blpop phase with the server on CPU 0 and memlab's client threads on CPU 1.
R=${1:-3}
for i in $(seq $R); do
  for s in nibble redis; do
    P=7850
    if [ $s = redis ]; then taskset -c 0 redis-server --port $P --save '' --appendonly no > /dev/null 2>&1 &
    else taskset -c 0 target/release/nibble --port $P --maxmemory 256mb --threads 1 $NARGS > /dev/null 2>&1 & fi
    sleep 0.7
    o=$(taskset -c 1 target/release/memlab server --quick --seconds 3 --endpoint 127.0.0.1:$P --rb-requests 0 --phases blpop 2>&1 | grep -E "^external +blpop")
    echo "$i $s $(echo $o | awk '{print $3, $6, $7}')"
    redis-cli -p $P shutdown nosave > /dev/null 2>&1; wait
  done
done
