#!/usr/bin/env python3
"""Insert key:%010d with VALUE-byte values over the memcached text protocol
until the server refuses (nibble) or evicts (memcached); print keys held
and RSS per key. With a fourth argument, nibble's RESP port, also print
where each key's bytes go (from INFO memory): usage
smallkeys.py MC_PORT PID VALUE_BYTES [RESP_PORT]."""
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

BLOCK_BYTES = 64 << 10
KEY_BYTES = len(b"key:%010d" % 0)
INDEX_PERMILLE = 62

def info_memory(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"*2\r\n$4\r\nINFO\r\n$6\r\nmemory\r\n")
    buf = b""
    while True:
        buf += s.recv(65536)
        head, _, rest = buf.partition(b"\r\n")
        if head.startswith(b"$") and len(rest) >= int(head[1:]):
            break
    d = {}
    for l in rest.decode().splitlines():
        k, _, v = l.partition(":")
        d[k] = v
    return d

def breakdown(resp_port, items, vsize, r):
    """Bytes per key: the object (header, key, value), the index, dead
    bytes and segment tails in the log, free blocks held back, the rest of
    RSS (the process itself, block metadata)."""
    m = info_memory(resp_port)
    n = max(items, 1)
    live, index = int(m["used_memory_dataset"]), int(m["used_memory_index"])
    total, used = int(m["nibble_blocks_total"]), int(m["nibble_blocks_in_use"])
    header = live / n - KEY_BYTES - vsize
    # The index's own share of the capacity (Config::index_permille, 62);
    # past it the index borrows free log blocks, below it the share idles.
    share = int(m["maxmemory"]) * INDEX_PERMILLE // 1000
    borrowed, idle = max(0, index - share), max(0, share - index)
    rows = [("key", KEY_BYTES), ("value", vsize), ("header", header),
            ("index", index / n), ("log: dead + tails", (used * BLOCK_BYTES - live) / n),
            ("free blocks", ((total - used) * BLOCK_BYTES - borrowed) / n),
            ("idle index share", idle / n),
            ("rest of RSS", (r - used * BLOCK_BYTES - index) / n)]
    print("  ".join(f"{k}={v:.1f}" for k, v in rows) + f"  (index {index / 1048576:.1f} MiB)")

if __name__ == "__main__":
    port, pid, vsize = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    refused, items, r = run(port, pid, vsize, 20_000_000)
    print(f"value={vsize} first_refusal={refused} items={items} rss={r} rss_per_item={r/max(items,1):.0f}")
    if len(sys.argv) > 4:
        breakdown(int(sys.argv[4]), items, vsize, r)
