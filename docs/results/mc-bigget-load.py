#!/usr/bin/env python3
# Usage: mc-bigget-load.py MEMCACHED_PORT BATCHES
# 2,000 keys of 1,000 bytes (set noreply), then BATCHES times 16 GETs of random keys in one write.
import socket, sys, random
port=int(sys.argv[1]); n=int(sys.argv[2])
s=socket.create_connection(('127.0.0.1',port))
val=b'v'*1000
# load 2000 keys
buf=b''.join(b'set key:%010d 0 0 1000 noreply\r\n'%i + val + b'\r\n' for i in range(2000))
s.sendall(buf); s.sendall(b'mn\r\n')
def readuntil(tok):
    d=b''
    while not d.endswith(tok):
        d+=s.recv(1<<20)
    return d
readuntil(b'MN\r\n')
r=random.Random(1)
for b in range(n):
    req=b''.join(b'get key:%010d\r\n'%r.randrange(2000) for _ in range(16))
    s.sendall(req)
    got=0; d=b''
    while d.count(b'END\r\n')<16:
        d+=s.recv(1<<20)
print('done')
