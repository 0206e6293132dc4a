#!/usr/bin/env python3
"""BGSAVE of a large store: nibble against redis-server (issue 25).

For each server: fill it with N keys `key:%012d` of SIZE bytes of random
base64 (so LZF has little to gain, as with real data), measure a
redis-benchmark SET/GET run without a save, then start BGSAVE and run
the same benchmark while it saves; report the save time, the client p99
with and without, and memory growth during the save (nibble: peak VmRSS
minus VmRSS before; redis-server: its own `rdb_last_cow_size`, the
pages the fork copied, and the peak of parent RSS + child private
bytes minus the parent's RSS before).

    python3 scripts/rdb_bgsave.py --nibble target/release/nibble [--keys 1000000 --size 1000]

Needs redis-server, redis-cli and redis-benchmark (Debian redis-server,
redis-tools).
"""

import argparse
import base64
import os
import socket
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


def cli(port, *args):
    return subprocess.run(
        ["redis-cli", "-p", str(port), *map(str, args)],
        capture_output=True, text=True, check=True).stdout.strip()


def info(port, section="persistence"):
    d = {}
    for line in cli(port, "info", section).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            d[k] = v.strip()
    return d


def fill(port, n, size):
    s = socket.create_connection(("127.0.0.1", port))
    batch = 2000
    raw = os.urandom(size)
    for start in range(0, n, batch):
        buf = []
        for i in range(start, min(n, start + batch)):
            # A fresh-looking value per key without paying urandom each time.
            v = base64.b64encode(raw[i % 97:] + raw[:i % 97] + i.to_bytes(8, "little"))[:size]
            buf.append(resp("SET", "key:%012d" % i, v))
        s.sendall(b"".join(buf))
        want = 5 * (min(n, start + batch) - start)
        got = 0
        while got < want:
            got += len(s.recv(1 << 20))
    s.close()


def rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def private(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            t = 0
            for line in f:
                if line.startswith(("Private_Dirty:", "Private_Clean:")):
                    t += int(line.split()[1]) * 1024
            return t
    except OSError:
        return 0


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def bench(port, n, keys, size):
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-c", "4", "-n", str(n), "-r", str(keys),
         "-d", str(size), "-t", "set,get", "--csv"],
        capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines()[1:]:
        f = [x.strip('"') for x in line.split(",")]
        rows[f[0]] = {"rps": float(f[1]), "p50": float(f[4]), "p99": float(f[6]), "max": float(f[7])}
    return rows


def run(name, argv, port, keys, size, n_bench):
    d = tempfile.mkdtemp(prefix=f"rdb-bench-{name}-")
    p = subprocess.Popen(argv + ["--dir", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                cli(port, "ping")
                break
            except subprocess.CalledProcessError:
                time.sleep(0.05)
        t = time.time()
        fill(port, keys, size)
        fill_s = time.time() - t
        mem = info(port, "memory")
        t = time.time()
        cli(port, "bgsave")
        while info(port)["rdb_bgsave_in_progress"] != "0":
            time.sleep(0.01)
        idle_s = time.time() - t
        base = bench(port, n_bench, keys, size)
        rss0 = rss(p.pid)
        peak = [rss0]
        stop = threading.Event()

        def sampler():
            while not stop.is_set():
                tot = rss(p.pid) if name == "nibble" else rss(p.pid) + sum(private(c) for c in children(p.pid))
                peak[0] = max(peak[0], tot)
                time.sleep(0.02)

        th = threading.Thread(target=sampler)
        th.start()
        t = time.time()
        cli(port, "bgsave")
        during = bench(port, n_bench, keys, size)
        bench_s = time.time() - t
        while info(port)["rdb_bgsave_in_progress"] != "0":
            time.sleep(0.01)
        save_s = time.time() - t
        stop.set()
        th.join()
        pi = info(port)
        fsize = os.path.getsize(os.path.join(d, "dump.rdb"))
        check = subprocess.run(["redis-check-rdb", os.path.join(d, "dump.rdb")],
                               capture_output=True, text=True).stdout
        print(f"{name}: {keys} keys x {size} B, used_memory {int(mem['used_memory'])/2**30:.2f} GiB, "
              f"RSS before save {rss0/2**30:.2f} GiB, fill {fill_s:.1f} s")
        print(f"  BGSAVE alone {idle_s:.2f} s; under load {save_s:.2f} s (benchmark ran {bench_s:.2f} s of it), file {fsize/2**30:.2f} GiB, "
              f"status {pi['rdb_last_bgsave_status']}, redis-check-rdb {'OK' if 'RDB looks OK' in check else 'FAILED'}")
        for t_ in base:
            b, w = base[t_], during[t_]
            print(f"  {t_:4}: p50 {b['p50']:.3f} -> {w['p50']:.3f} ms, p99 {b['p99']:.3f} -> {w['p99']:.3f} ms "
                  f"({w['p99']/b['p99']:.2f}x), max {b['max']:.1f} -> {w['max']:.1f} ms, "
                  f"{b['rps']:.0f} -> {w['rps']:.0f} req/s")
        extra = f", redis rdb_last_cow_size {int(pi.get('rdb_last_cow_size', 0))/2**20:.0f} MiB" if name == "redis" else ""
        print(f"  memory growth during the save: {(peak[0]-rss0)/2**20:.0f} MiB "
              f"({100*(peak[0]-rss0)/max(rss0,1):.1f} % of RSS){extra}")
    finally:
        p.terminate()
        p.wait()
        subprocess.run(["rm", "-rf", d])


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--nibble", default="target/release/nibble")
    a.add_argument("--keys", type=int, default=1_000_000)
    a.add_argument("--size", type=int, default=1000)
    a.add_argument("--bench", type=int, default=100_000, help="requests per redis-benchmark test")
    a.add_argument("--only", choices=["nibble", "redis"])
    o = a.parse_args()
    cap = str(int(o.keys * (o.size + 100) * 1.6))
    if o.only != "redis":
        run("nibble", [o.nibble, "--port", "7471", "--maxmemory", cap], 7471, o.keys, o.size, o.bench)
    if o.only != "nibble":
        run("redis", ["redis-server", "--port", "7472", "--save", "", "--appendonly", "no"], 7472,
            o.keys, o.size, o.bench)


if __name__ == "__main__":
    main()
