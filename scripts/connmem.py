#!/usr/bin/env python3
"""Memory per connection: open N connections to a RESP server (each sends
one PING and reads +PONG, so the server has set the connection up), read
the server's RSS, close them all, wait, read RSS again; repeat ROUNDS
times. Prints one line per round: RSS before, with N open, after close.

  scripts/connmem.py PORT PID [N=10000] [ROUNDS=3] [SETTLE_S=2]
"""
import resource, socket, sys, time

def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1]) * 1024

def main():
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    settle = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1000), hard))
    base = rss(pid)
    print(f"start rss={base}")
    for r in range(rounds):
        before = rss(pid)
        socks = []
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"PING\r\n")
            socks.append(s)
        for s in socks:
            got = b""
            while not got.endswith(b"\r\n"):
                got += s.recv(64)
            assert got == b"+PONG\r\n", got
        time.sleep(settle)
        opened = rss(pid)
        for s in socks:
            s.close()
        time.sleep(settle)
        after = rss(pid)
        print(f"round={r+1} n={n} rss_before={before} rss_open={opened} "
              f"per_conn={(opened-before)/n:.0f} rss_after_close={after} "
              f"after/start={after/base:.2f}")

main()
