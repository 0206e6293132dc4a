#!/usr/bin/env python3
# Usage: mixed-callgrind-load.py RESP_PORT ROUNDS
# One connection; each round pipelines SET, GET, SADD, SISMEMBER, ZADD, ZRANGE, HSET, HGET, LPUSH, RPOP, INCR and MULTI/SET/INCR/EXEC on one of 1,000 random key suffixes.
import socket, sys, random
port=int(sys.argv[1]); n=int(sys.argv[2])
s=socket.create_connection(('127.0.0.1',port))
def cmd(*a): return b'*%d\r\n'%len(a)+b''.join(b'$%d\r\n%s\r\n'%(len(x),x) for x in a)
r=random.Random(2)
cmds=[]
for b in range(n):
    k=b'%d'%r.randrange(1000)
    cmds.append([cmd(b'SET',b's'+k,b'v'*32), cmd(b'GET',b's'+k), cmd(b'SADD',b'set'+k,b'm%d'%r.randrange(100)),
      cmd(b'SISMEMBER',b'set'+k,b'm1'), cmd(b'ZADD',b'z'+k,b'%d'%r.randrange(100),b'm%d'%r.randrange(100)),
      cmd(b'ZRANGE',b'z'+k,b'0',b'9'), cmd(b'HSET',b'h'+k,b'f%d'%r.randrange(50),b'v'), cmd(b'HGET',b'h'+k,b'f1'),
      cmd(b'LPUSH',b'l'+k,b'x'*16), cmd(b'RPOP',b'l'+k), cmd(b'INCR',b'c'+k),
      cmd(b'MULTI'), cmd(b'SET',b'm'+k,b'1'), cmd(b'INCR',b'mc'+k), cmd(b'EXEC')])
for c in cmds:
    s.sendall(b''.join(c))
    d=b''
    # read until we have 15 replies roughly: count lines heuristically by waiting for EXEC array end
    while True:
        d+=s.recv(1<<20)
        if d.endswith(b'\r\n') and d.count(b'QUEUED')==2 and d.rfind(b'*2\r\n')>d.rfind(b'QUEUED'):
            # EXEC reply "*2\r\n+OK\r\n:N\r\n"
            tail=d[d.rfind(b'*2\r\n'):]
            if tail.count(b'\r\n')>=3: break
print('done')
