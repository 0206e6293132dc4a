#!/bin/bash
# perf stat of the server over 2 s of the blpop phase, server on CPU 0, memlab on CPU 1.
for s in nibble redis; do
  P=7851
  if [ $s = redis ]; then taskset -c 0 redis-server --port $P --save '' --appendonly no > /dev/null 2>&1 &
  else taskset -c 0 target/release/nibble --port $P --maxmemory 256mb --threads 1 > /dev/null 2>&1 & fi
  sleep 0.7
  pid=$(ss -ltnpH "sport = :$P" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
  (taskset -c 1 target/release/memlab server --quick --seconds 4 --endpoint 127.0.0.1:$P --rb-requests 0 --phases blpop 2>&1 | grep -E "^external +blpop" | awk '{print "ops", $3}') &
  sleep 2.5
  perf stat -e task-clock,context-switches,raw_syscalls:sys_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sendto,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev -p $pid -- sleep 2 2>&1 | grep -E "task-clock|context|sys" | awk -v s=$s '{print s, $1, $2}'
  wait %2
  redis-cli -p $P shutdown nosave > /dev/null 2>&1; wait
done
