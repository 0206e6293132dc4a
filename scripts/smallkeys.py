#!/usr/bin/env python3
"""Insert key:%010d with VALUE-byte values over the memcached text protocol
until the server refuses (nibble) or evicts (memcached); print keys held
and RSS per key."""
import socket, sys, subprocess, time, os, re

def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1]) * 1024

def stats(s):
    s.sendall(b"stats\r\n")
    buf = b""
    while not buf.endswith(b"END\r\n"):
        buf += s.recv(65536)
    d = {}
    for l in buf.decode().splitlines():
        p = l.split()
        if len(p) == 3 and p[0] == "STAT":
            d[p[1]] = p[2]
    return d

def run(port, pid, vsize, limit):
    s = socket.create_connection(("127.0.0.1", port))
    val = b"x" * vsize
    n = 0
    batch = 1000
    refused = None
    while n < limit and refused is None:
        req = b"".join(b"set key:%010d 0 0 %d\r\n%s\r\n" % (i, vsize, val) for i in range(n, n + batch))
        s.sendall(req)
        got = b""
        while got.count(b"\r\n") < batch:
            got += s.recv(1 << 20)
        lines = got.split(b"\r\n")[:batch]
        for j, l in enumerate(lines):
            if l != b"STORED":
                refused = (n + j, l.decode())
                break
        n += batch
        if n % 100000 == 0:
            st = stats(s)
            if int(st.get("evictions", "0")) > 0:
                refused = (n, "evictions=" + st["evictions"])
    st = stats(s)
    items = int(st.get("curr_items", "0"))
    r = rss(pid)
    return refused, items, r

if __name__ == "__main__":
    port, pid, vsize = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    refused, items, r = run(port, pid, vsize, 20_000_000)
    print(f"value={vsize} first_refusal={refused} items={items} rss={r} rss_per_item={r/max(items,1):.0f}")
