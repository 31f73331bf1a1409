#!/usr/bin/python3
"""Workload "own" of `lockd bench` for the Python client: --clients workers,
each with its own Client (own connections) and session, take and release
their own lock in a loop. Reports acquire+release pairs per second, the
pair's latency and this process's CPU per pair (user+sys, measured over the
window after the warm-up) and, with --server-pid, the server's CPU per pair
over the same window (from /proc/PID/stat; a server on this machine).

    /usr/bin/python3 clients/python/bench.py --endpoints http://127.0.0.1:7070 --clients 16 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lockd  # noqa: E402


def server_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def worker(i: int, a, stop: float, window: list, lat: list, errs: list):
    async with lockd.Client(a.endpoints) as c:
        async with await c.session(ttl=10) as s:
            m = s.mutex(f"bench/py/{os.getpid()}/{i}")
            while time.monotonic() < stop:
                t0 = time.monotonic()
                try:
                    await m.lock()
                    await m.unlock()
                except lockd.LockdError as e:
                    errs.append(e)
                    continue
                t1 = time.monotonic()
                if window[0] <= t0 and t1 <= window[1]:
                    lat.append(t1 - t0)


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoints", default=os.environ.get("LOCKD_ENDPOINTS", "http://127.0.0.1:7070"))
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--server-pid", type=int, default=0, help="also report this local server's CPU per pair")
    a = p.parse_args()
    start = time.monotonic()
    window = [start + a.warmup, start + a.warmup + a.duration]
    lat: list[float] = []
    errs: list = []
    tasks = [asyncio.ensure_future(worker(i, a, window[1], window, lat, errs)) for i in range(a.clients)]
    await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
    c0, s0 = cpu(), server_cpu(a.server_pid) if a.server_pid else 0.0
    await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
    c1, s1 = cpu(), server_cpu(a.server_pid) if a.server_pid else 0.0
    await asyncio.gather(*tasks)
    lat.sort()
    n = len(lat)
    if n == 0:
        print("no pairs completed; errors:", errs[:3])
        return
    q = lambda f: lat[min(n - 1, int(f * n))] * 1000  # noqa: E731
    print(f"python client, workload own: clients={a.clients} duration={a.duration}s")
    print(f"  pairs: {n}  ({n / a.duration:.0f}/s)  errors: {len(errs)}")
    print(f"  pair latency ms: p50 {q(0.5):.2f}  p99 {q(0.99):.2f}")
    print(f"  client CPU: {c1 - c0:.2f}s = {(c1 - c0) / n * 1e6:.0f} µs per pair")
    if a.server_pid:
        print(f"  server CPU: {s1 - s0:.2f}s = {(s1 - s0) / n * 1e6:.0f} µs per pair (same window); "
              f"client+server {(c1 - c0 + s1 - s0) / n * 1e6:.0f} µs per pair")


if __name__ == "__main__":
    asyncio.run(main())
