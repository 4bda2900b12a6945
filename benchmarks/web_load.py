"""Load test of the web API: 200 concurrent clients against ``ftplan serve``'s app on loopback.

    python benchmarks/web_load.py [--clients 200] [--duration 20] [--mode mixed|cached|uncached]
                                  [--endpoint all|estimate|recommend|fit] [--workers 1] [--json]

Starts the app with uvicorn in a subprocess (a free loopback port, ``--workers`` processes, one
by default; the settings of ``ftplan serve``), then drives it with ``--clients`` asyncio + httpx clients for ``--duration``
seconds, each sending requests back to back, mixing ``/api/estimate``, ``/api/recommend`` and
``/api/fit``. Modes: ``cached`` draws from a pool of 48 jobs (after the first round each worker
answers from its LRU cache), ``uncached`` makes every request unique (a fresh dataset size or
sequence length: every answer is computed), ``mixed`` (default) is half and half.
``--endpoint recommend`` sends only ``/api/recommend`` (the search, the heaviest answer). A unique
recommend request has a fresh dataset size (``tokens``): its answer is computed (no response-cache
hit), while memory and step times of the same model, method and sequence length are shared by the
planner's SearchCache; ``--fresh-seq`` also gives it a fresh sequence length (the worst case: every
memory breakdown and step time is computed).
Reports throughput, p50/p90/p95/p99 latency overall and per endpoint, cache hits, errors, and the
setup (CPU, cores, workers: the server and this load generator share the machine); the exit code
is 1 if any request failed (a non-200 status or a transport error).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = ["llama-3.1-8b", "qwen2.5-7b", "mistral-7b", "qwen3-8b", "llama-3.2-3b", "gemma-2-9b", "qwen2.5-14b",
          "llama-3.1-70b", "mixtral-8x7b", "phi-3-mini"]
METHODS = ["full", "lora", "qlora"]
GPUS = ["h100-sxm", "a100-80gb-sxm", "l40s", "rtx-4090", "b200", "h200"]
SEQ = [1024, 2048, 4096, 8192]

SERVER = ("import sys, uvicorn\n"
          "from ftplan.cli.web import KEEP_ALIVE_S\n"
          "uvicorn.run('ftplan.web.app:create_app', factory=True, host='127.0.0.1', port=int(sys.argv[1]),\n"
          "            workers=int(sys.argv[2]), log_level='warning', ws='none', access_log=False,\n"
          "            timeout_keep_alive=KEEP_ALIVE_S)\n")
POOL = 48
#: --fresh-seq: unique recommend requests also get a fresh sequence length (nothing can be shared)
FRESH_SEQ = [False]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_request(rng: random.Random, unique: bool, counter: list[int], endpoint: str = "all") -> tuple[str, dict]:
    """(endpoint, body): estimate 40 %, recommend 30 %, fit 30 % (or only ``endpoint``)."""
    model = rng.choice(MODELS)
    method = rng.choice(METHODS)
    seq = rng.choice(SEQ)
    kind = rng.choices(["estimate", "recommend", "fit"], weights=[4, 3, 3])[0] if endpoint == "all" else endpoint
    if unique:
        counter[0] += 1
        if kind != "recommend" or FRESH_SEQ[0]:
            seq = 512 + counter[0] % 7680  # a fresh sequence length: no cache hit
    body: dict = {"model": model, "method": method, "seq_len": seq}
    if kind == "estimate":
        gpus = rng.choice([1, 2, 4, 8])
        body |= {"gpus": gpus, "strategy": "single" if gpus == 1 else rng.choice(["ddp", "zero2", "zero3"]),
                 "gpu": rng.choice(GPUS), "micro_batch": rng.choice([1, 2, 4]),
                 "gradient_checkpointing": rng.random() < 0.5}
    elif kind == "recommend":
        body |= {"tokens": rng.choice(["5M", "20M", "100M"]), "objective": rng.choice(["cost", "time"])}
        if unique:
            body["tokens"] = 1_000_000 + counter[0]
    else:
        body |= {"gpu": rng.sample(GPUS, rng.choice([1, 2])), "micro_batch": rng.choice([1, 2]),
                 "gradient_checkpointing": True}
    return kind, body


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))]


async def drive(base: str, clients: int, duration: float, mode: str, seed: int, endpoint: str = "all") -> dict:
    import httpx

    lat: dict[str, list[float]] = {"estimate": [], "recommend": [], "fit": []}
    errors: list[str] = []
    hits = 0
    counter = [0]
    prng = random.Random(seed)
    pool = [make_request(prng, False, counter, endpoint) for _ in range(POOL)]
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120.0) as client:
        # warm-up: the catalogs load on the first request
        (await client.get("/api/models")).raise_for_status()
        t_end = time.perf_counter() + duration

        async def one(i: int) -> None:
            nonlocal hits
            rng = random.Random(seed * 1000 + i)
            while time.perf_counter() < t_end:
                unique = mode == "uncached" or (mode == "mixed" and rng.random() < 0.5)
                kind, body = make_request(rng, True, counter, endpoint) if unique else rng.choice(pool)
                t0 = time.perf_counter()
                try:
                    r = await client.post(f"/api/{kind}", json=body)
                    dt = time.perf_counter() - t0
                    if r.status_code != 200:
                        errors.append(f"{kind} {r.status_code}: {r.text[:200]} for {json.dumps(body)}")
                    else:
                        lat[kind].append(dt)
                        hits += r.headers.get("x-ftplan-cache") == "hit"
                except Exception as e:  # transport errors count
                    errors.append(f"{kind} {type(e).__name__}: {e!r} after {time.perf_counter() - t0:.2f} s, "
                                  f"{t_end - time.perf_counter():.1f} s before the end")

        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i) for i in range(clients)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    allv = [x for v in lat.values() for x in v]
    per = {k: {"n": len(v), "p50_ms": pct(v, 50) * 1e3, "p90_ms": pct(v, 90) * 1e3, "p95_ms": pct(v, 95) * 1e3,
               "p99_ms": pct(v, 99) * 1e3,
               "mean_ms": (statistics.fmean(v) * 1e3 if v else float("nan"))} for k, v in lat.items()}
    return {"mode": mode, "clients": clients, "pool": POOL, "duration_s": duration, "wall_s": wall, "requests": len(allv),
            "errors": len(errors), "error_samples": errors[:5], "throughput_rps": len(allv) / wall,
            "cache_hits": hits, "client_cpu_s": cpu, "p50_ms": pct(allv, 50) * 1e3, "p90_ms": pct(allv, 90) * 1e3,
            "p95_ms": pct(allv, 95) * 1e3,
            "p99_ms": pct(allv, 99) * 1e3, "max_ms": max(allv) * 1e3 if allv else float("nan"),
            "per_endpoint": per}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}, {platform.system()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load (default 20)")
    ap.add_argument("--mode", choices=["mixed", "cached", "uncached"], default="mixed")
    ap.add_argument("--endpoint", choices=["all", "estimate", "recommend", "fit"], default="all",
                    help="drive one endpoint only (default: the mix)")
    ap.add_argument("--fresh-seq", action="store_true",
                    help="unique recommend requests also get a fresh sequence length (worst case)")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    FRESH_SEQ[0] = a.fresh_seq

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(a.workers)], stdout=subprocess.DEVNULL,
                            stderr=log, text=True)
    try:
        import httpx

        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                log.seek(0)
                print(f"web_load: the server exited: {log.read()[-2000:]}", file=sys.stderr)
                return 1
            try:
                if httpx.get(base + "/api/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                print("web_load: the server did not start in 30 s", file=sys.stderr)
                return 1
            time.sleep(0.1)
        res = asyncio.run(drive(base, a.clients, a.duration, a.mode, a.seed, a.endpoint))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.seek(0)
    server_log = log.read()
    log.close()
    res["server_log_tail"] = server_log[-1500:]
    res["machine"] = machine()
    res["workers"] = a.workers
    res["endpoint"] = a.endpoint
    res["fresh_seq"] = a.fresh_seq
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"ftplan web load: {res['clients']} clients, {res['duration_s']:g} s, mode {res['mode']}, "
              f"endpoint {res['endpoint']}{', fresh seq' if res['fresh_seq'] else ''}, {res['workers']} worker(s), server and load generator on this machine "
              f"({res['machine']})")
        print(f"  {res['requests']} requests in {res['wall_s']:.1f} s: {res['throughput_rps']:.1f} req/s, "
              f"{res['cache_hits']} cache hits, {res['errors']} errors (load generator CPU {res['client_cpu_s']:.1f} s)")
        print(f"  latency p50 {res['p50_ms']:.0f} ms, p90 {res['p90_ms']:.0f} ms, p95 {res['p95_ms']:.0f} ms, "
              f"p99 {res['p99_ms']:.0f} ms, "
              f"max {res['max_ms']:.0f} ms")
        for k, v in res["per_endpoint"].items():
            if not v["n"]:
                continue
            print(f"  {k:<10} n={v['n']:<6} p50 {v['p50_ms']:.0f} ms  p90 {v['p90_ms']:.0f} ms  "
                  f"p95 {v['p95_ms']:.0f} ms  p99 {v['p99_ms']:.0f} ms")
        for e in res["error_samples"]:
            print(f"  error: {e}")
        if res["errors"] and res["server_log_tail"]:
            print("  server log (tail):\n" + res["server_log_tail"])
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
