#!/usr/bin/env python3
# Usage: queue-callgrind-load.py RESP_PORT BATCHES [BRPOP|RPOP]
# One connection: BATCHES times 8 pairs of LPUSH queue <16 B> and BRPOP queue 1 (or RPOP) pipelined.
import socket, sys
port=int(sys.argv[1]); n=int(sys.argv[2]); pop=sys.argv[3].encode() if len(sys.argv)>3 else b'BRPOP'
s=socket.create_connection(('127.0.0.1',port))
def cmd(*a): return b'*%d\r\n'%len(a)+b''.join(b'$%d\r\n%s\r\n'%(len(x),x) for x in a)
push=cmd(b'LPUSH', b'queue', b'x'*16)
popc=cmd(b'BRPOP', b'queue', b'1') if pop==b'BRPOP' else cmd(b'RPOP', b'queue')
s.sendall(cmd(b'LPUSH', b'queue', b'a', b'b'))
s.recv(100)
for b in range(n):
    s.sendall((push+popc)*8)
    d=b''
    # 8 integer replies + 8 pop replies
    while d.count(b'\r\n') < (8 + (8*5 if pop==b'BRPOP' else 8*2)):
        d+=s.recv(1<<20)
print('done')
