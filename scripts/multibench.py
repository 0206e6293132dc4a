#!/usr/bin/env python3
"""MULTI/EXEC throughput, closed loop: each of --clients processes sends
--pipeline transactions `MULTI; INCR k{i}a; INCR k{i}b; EXEC` per write and
waits for all their replies (6 reply lines each), for --seconds.

usage: multibench.py PORT [--clients 4] [--pipeline 16] [--seconds 5] [--shared-key]
Prints transactions per second (sum over clients).
"""
import multiprocessing as mp
import socket
import sys
import time


def cmd(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def client(port, idx, pipeline, seconds, shared, q):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    k = "shared" if shared else "c%d" % idx
    tx = cmd("MULTI") + cmd("INCR", k + "a") + cmd("INCR", k + "b") + cmd("EXEC")
    batch = tx * pipeline
    want = 6 * pipeline
    n = 0
    end = time.time() + seconds
    while time.time() < end:
        s.sendall(batch)
        got = 0
        while got < want:
            d = s.recv(1 << 16)
            if not d:
                raise SystemExit("closed")
            got += d.count(b"\r\n")
        n += pipeline
    q.put(n)


def main():
    port = int(sys.argv[1])
    opts = dict(clients=4, pipeline=16, seconds=5)
    a = sys.argv[2:]
    shared = "--shared-key" in a
    for i, x in enumerate(a):
        if x.startswith("--") and x[2:] in opts:
            opts[x[2:]] = int(a[i + 1])
    q = mp.Queue()
    ps = [mp.Process(target=client, args=(port, i, opts["pipeline"], opts["seconds"], shared, q))
          for i in range(opts["clients"])]
    for p in ps:
        p.start()
    total = sum(q.get() for _ in ps)
    for p in ps:
        p.join()
    print("%d tx/s" % (total / opts["seconds"]))


if __name__ == "__main__":
    main()
