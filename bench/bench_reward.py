"""Reward server throughput and latency: `make bench-reward`.

Starts `purplerl serve-reward` (embedded scorer unless --server-args says otherwise) on a free loopback
port in a subprocess, drives `POST /score` with an async httpx client at each concurrency level (32 texts
per request by default) for a bounded number of requests and seconds, and reports requests/s, texts/s and
p50/p99 latency. Writes bench/results/reward-<YYYY-MM-DD>-<hostname>.json and prints a table.

The load generator shares the machine with the server, so on a small CPU it takes a share of the cores
the server would otherwise have: the numbers are a floor for a server on its own host.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

RESULTS = Path(__file__).parent / "results"
# words of both kinds, so the scorer sees texts like a red-team run's: mostly benign, some profane
WORDS = ("you are a nice kind person thank so very much the weather is lovely today please help me with this "
         "stupid idiot moron damn hell crap shut up loser pathetic worthless I will find and hurt what").split()


def make_texts(count: int, seed: int = 0) -> list[str]:
    """Deterministic texts of 20-45 words (~100-250 characters, like 48-token completions)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 45))) for _ in range(count)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int, extra: list[str]) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "purplerl.cli", "serve-reward", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            detail = proc.stderr.read() if proc.stderr else ""
            raise SystemExit(f"reward server exited with {proc.returncode}: {detail}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("reward server did not come up in 120 s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def run_level(url: str, concurrency: int, texts: list[str], per_request: int, max_requests: int,
                    max_seconds: float, warmup: int) -> dict[str, Any]:
    """`concurrency` clients sending back-to-back requests until max_requests or max_seconds.

    Each client has its own AsyncClient (one keep-alive connection): one shared pool of 64 connections
    costs the load generator ~4 ms of CPU per request in httpx's pool bookkeeping, which on 2 cores
    measured the client rather than the server.
    """
    clients = [httpx.AsyncClient(base_url=url, timeout=60) for _ in range(concurrency)]
    for i in range(warmup):
        (await clients[i % concurrency].post("/score", json={"texts": texts[i:i + per_request]})).raise_for_status()
    latencies: list[float] = []
    sent = 0
    started = time.perf_counter()

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal sent
        while sent < max_requests and time.perf_counter() - started < max_seconds:
            offset = (sent * per_request) % (len(texts) - per_request)
            sent += 1
            t0 = time.perf_counter()
            response = await http.post("/score", json={"texts": texts[offset:offset + per_request]})
            response.raise_for_status()
            assert len(response.json()["scores"]) == per_request
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(client(http) for http in clients))
    elapsed = time.perf_counter() - started
    for http in clients:
        await http.aclose()
    return {"concurrency": concurrency, "texts_per_request": per_request, "requests": len(latencies),
            "seconds": round(elapsed, 3), "requests_per_s": round(len(latencies) / elapsed, 1),
            "texts_per_s": round(len(latencies) * per_request / elapsed, 1),
            "p50_ms": round(1000 * statistics.median(latencies), 2),
            "p99_ms": round(1000 * percentile(latencies, 99), 2)}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| concurrency | requests | req/s | texts/s | p50 ms | p99 ms |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['concurrency']} | {r['requests']} | {r['requests_per_s']} | {r['texts_per_s']} | "
              f"{r['p50_ms']} | {r['p99_ms']} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated client counts")
    parser.add_argument("--texts-per-request", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2000, help="most requests per concurrency level")
    parser.add_argument("--seconds", type=float, default=15.0, help="most seconds per concurrency level")
    parser.add_argument("--warmup", type=int, default=20, help="requests sent before timing each level")
    parser.add_argument("--server-args", default="", help="extra serve-reward options, e.g. '--batch-wait-ms 0'")
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/reward-DATE-HOST.json")
    args = parser.parse_args()

    port = free_port()
    extra = shlex.split(args.server_args)
    server = start_server(port, extra)
    try:
        url = f"http://127.0.0.1:{port}"
        info = httpx.get(f"{url}/info").json()
        texts = make_texts(1024)
        rows = [asyncio.run(run_level(url, int(c), texts, args.texts_per_request, args.requests, args.seconds,
                                      args.warmup)) for c in args.concurrency.split(",")]
        health = httpx.get(f"{url}/health").json()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    host = platform.node() or "unknown"
    today = datetime.date.today().isoformat()
    result = {"benchmark": "reward-server", "date": today, "host": host, "cpus": os.cpu_count(),
              "python": platform.python_version(), "server": info, "server_args": extra, "results": rows,
              "server_counters": health}
    out = args.out or RESULTS / f"reward-{today}-{host}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"reward server ({info['model']}, {extra or 'default settings'}) on {host}, {os.cpu_count()} CPUs")
    print(table(rows))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
