#!/usr/bin/env python3
"""Replication lag under load: nibble as a replica of redis-server 7.0,
against redis-server as the replica of the same kind of primary (issue 25).

For each replica kind, per round: a fresh redis-server primary, the
replica started with --replicaof and waited for (link up, offsets
equal); then `redis-benchmark -t set,incr,lpush,hset` against the
primary while a probe thread, every 50 ms, INCRs a counter on the
primary and polls the replica until it shows that value (the delay of
one write, ms), and a sampler reads both offsets (lag in bytes). After
the benchmark: the time until the replica's offset reaches the
primary's, and DBSIZE on both.

    python3 scripts/replica_lag.py --nibble target/release/nibble [--requests 100000 --clients 16 --rounds 3 --tests set,incr,lpush,hset]

Needs redis-server and redis-benchmark (Debian redis-server, redis-tools).
"""

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.s.makefile("rb")

    def cmd(self, *args):
        self.s.sendall(resp(*args))
        return self.read()

    def read(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t in (b"+", b"-"):
            return rest.decode()
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)[:-2]
            return data.decode(errors="replace")
        if t == b"*":
            return [self.read() for _ in range(int(rest))]
        raise RuntimeError("bad reply %r" % line)


def info_field(conn, field):
    for line in conn.cmd("INFO", "replication").splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            c = Conn(port)
            if c.cmd("PING") == "PONG":
                return c
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("port %d not up" % port)


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] if v else float("nan")


def round_once(kind, nibble, requests, clients, tmp, tests):
    pport, rport = free_port(), free_port()
    primary = subprocess.Popen(
        ["redis-server", "--port", str(pport), "--save", "", "--appendonly", "no",
         "--repl-diskless-sync-delay", "0", "--dir", tmp],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if kind == "nibble":
        cmdline = [nibble, "--port", str(rport), "--replicaof", "127.0.0.1 %d" % pport,
                   "--maxmemory", "1gb", "--loglevel", "warn"]
    else:
        cmdline = ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no",
                   "--replicaof", "127.0.0.1", str(pport), "--dir", tmp,
                   "--dbfilename", "replica.rdb"]
    replica = None
    try:
        pc = wait_port(pport)
        replica = subprocess.Popen(cmdline, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rc = wait_port(rport)
        deadline = time.time() + 30
        while info_field(rc, "master_link_status") != "up":
            assert time.time() < deadline, "replica link not up"
            time.sleep(0.05)
        stop = threading.Event()
        delays, lags = [], []

        def probe():
            p, r = Conn(pport), Conn(rport)
            while not stop.is_set():
                t0 = time.perf_counter()
                v = p.cmd("INCR", "lagprobe")
                while True:
                    got = r.cmd("GET", "lagprobe")
                    if got is not None and int(got) >= v:
                        break
                delays.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.05)

        def sample():
            p, r = Conn(pport), Conn(rport)
            while not stop.is_set():
                po = int(info_field(p, "master_repl_offset"))
                ro = int(info_field(r, "slave_repl_offset"))
                lags.append(max(0, po - ro))
                time.sleep(0.05)

        ths = [threading.Thread(target=probe), threading.Thread(target=sample)]
        for t in ths:
            t.start()
        t0 = time.time()
        out = subprocess.run(
            ["redis-benchmark", "-p", str(pport), "-t", tests,
             "-n", str(requests), "-c", str(clients), "-r", "100000", "-d", "64", "--csv", "-q"],
            capture_output=True, text=True).stdout
        bench_s = time.time() - t0
        stop.set()
        for t in ths:
            t.join()
        # Catch-up: until the replica's offset reaches the primary's.
        target = int(info_field(pc, "master_repl_offset"))
        t1 = time.perf_counter()
        while int(info_field(rc, "slave_repl_offset")) < target:
            time.sleep(0.001)
        catchup_ms = (time.perf_counter() - t1) * 1000
        rps = {}
        for line in out.splitlines()[1:]:
            f = [x.strip('"') for x in line.split(",")]
            if len(f) > 1:
                rps[f[0].split()[0]] = float(f[1])
        same = pc.cmd("DBSIZE") == rc.cmd("DBSIZE")
        return {
            "delay_p50": pct(delays, 0.5), "delay_p99": pct(delays, 0.99),
            "delay_max": max(delays) if delays else float("nan"), "probes": len(delays),
            "lag_p50": pct(lags, 0.5), "lag_max": max(lags) if lags else 0,
            "catchup_ms": catchup_ms, "bench_s": bench_s,
            "rps": rps, "dbsize_equal": same,
        }
    finally:
        for p in (replica, primary):
            if p is not None:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nibble", required=True)
    ap.add_argument("--requests", type=int, default=100000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tests", default="set,incr,lpush,hset")
    a = ap.parse_args()
    res = {"nibble": [], "redis": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for kind in ("nibble", "redis"):
                x = round_once(kind, os.path.abspath(a.nibble), a.requests, a.clients, tmp, a.tests)
                print(kind, "round", r, x, flush=True)
                res[kind].append(x)
    print()
    print("| replica | write delay p50 / p99 / max, ms | offset lag p50 / max, bytes | catch-up after the load, ms | primary SET / INCR / LPUSH / HSET req/s | DBSIZE equal |")
    print("|---|---|---|---|---|---|")
    for kind, rs in res.items():
        med = lambda k: statistics.median(x[k] for x in rs)
        rps = " / ".join("%.0f" % statistics.median(x["rps"].get(t, 0) for x in rs)
                         for t in ("SET", "INCR", "LPUSH", "HSET"))
        print("| %s | %.2f / %.2f / %.1f | %.0f / %.0f | %.1f | %s | %s |" % (
            kind, med("delay_p50"), med("delay_p99"), med("delay_max"), med("lag_p50"),
            med("lag_max"), med("catchup_ms"), rps, all(x["dbsize_equal"] for x in rs)))


if __name__ == "__main__":
    main()
