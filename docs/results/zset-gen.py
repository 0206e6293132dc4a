#!/usr/bin/env python3
"""RESP files for zset-bench.sh: 1 M ZADDs into `bigz` (score i,
member element:%012d) and 10 into `smallz`."""
def cmd(*a):
    out = [b"*%d\r\n" % len(a)]
    for x in a:
        x = x if isinstance(x, bytes) else str(x).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(x), x))
    return b"".join(out)
with open("/tmp/zadd1m.resp", "wb") as f:
    for i in range(1_000_000):
        f.write(cmd(b"ZADD", b"bigz", i, b"element:%012d" % i))
with open("/tmp/zadd10.resp", "wb") as f:
    for i in range(10):
        f.write(cmd(b"ZADD", b"smallz", i, b"element:%012d" % i))
