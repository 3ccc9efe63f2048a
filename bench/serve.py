"""``python -m bench serve``: ``d3d serve`` under concurrent streaming clients, speculative vs ar.

The server runs in its own process (``python -m d3d serve --port 0``); each client is a thread here
that sends its requests one after the other (closed loop) over http.client, streaming. Per
concurrency level and mode: total throughput (completion tokens / wall time), request latency and
time to first token (p50, p90), errors. Prompts: evaluation windows of the bundled pair's held-out
code (never used for a choice), sent as text; answers of mixed lengths (``--max-tokens`` cycled).
``--rss N`` then sends N sequential requests and samples the server's resident memory every 100.
``--abuse`` runs, instead of the levels, the first level's load alone and beside abusive clients
(``bench/serve_abuse.py``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from .common import machine, markdown_table, write_json


def start_server(args) -> tuple[subprocess.Popen, str, int]:
    cmd = [sys.executable, "-m", "d3d", "serve", "--port", "0", "--quiet", "--slots", str(args.slots)]
    if args.model:
        cmd += ["--model", args.model]
    if args.drafter:
        cmd += ["--drafter", args.drafter]
    if args.mode:
        cmd += ["--mode", args.mode]
    print(" ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    line = ""
    while "http://" not in line:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit(f"the server ended before listening (exit {proc.wait()})")
        print(line.rstrip(), file=sys.stderr, flush=True)
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep its pipe drained
    host, port = re.search(r"http://([\d.]+):(\d+)/v1", line).groups()
    return proc, host, int(port)


def request(host: str, port: int, prompt: str, max_tokens: int, mode: str) -> dict:
    """One streamed completion: seconds to the first text, in all, and completion tokens."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                                                        "d3d_mode": mode}).encode(),
                 {"Content-Type": "application/json"})
    res = conn.getresponse()
    if res.status != 200:
        return {"error": f"HTTP {res.status}: {res.read()[:200]!r}"}
    first, tokens = None, None
    for raw in res:
        line = raw.decode().strip()
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        if "error" in event:
            return {"error": event["error"]["message"]}
        if first is None and event["choices"] and event["choices"][0]["text"]:
            first = time.perf_counter() - t0
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    conn.close()
    if tokens is None:
        return {"error": "the stream ended without usage"}
    return {"ttft": first if first is not None else time.perf_counter() - t0, "seconds": time.perf_counter() - t0,
            "tokens": tokens}


def level(host: str, port: int, prompts: list[str], lengths: list[int], clients: int, requests: int,
          mode: str) -> dict:
    """Requests 0 .. ``requests``-1 (prompt i, length i mod len(lengths)) from ``clients`` closed-loop clients."""
    todo, lock, rows = list(range(requests)), threading.Lock(), []

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            try:
                r = request(host, port, prompts[i % len(prompts)], lengths[i % len(lengths)], mode)
            except OSError as e:  # a refused or reset connection is a finding, not a crash
                r = {"error": repr(e)}
            with lock:
                rows.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in rows if "error" not in r]
    pct = lambda xs, q: statistics.quantiles(xs, n=10)[q] if len(xs) > 1 else xs[0]  # noqa: E731
    lat, ttft = [r["seconds"] for r in ok], [r["ttft"] for r in ok]
    return {"mode": mode, "clients": clients, "requests": requests, "completed": len(ok),
            "errors": [r["error"] for r in rows if "error" in r][:5], "tokens": sum(r["tokens"] for r in ok),
            "wall_seconds": wall, "tok_s": sum(r["tokens"] for r in ok) / wall,
            "latency_p50": statistics.median(lat), "latency_p90": pct(lat, 8),
            "ttft_p50": statistics.median(ttft), "ttft_p90": pct(ttft, 8)}


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="target directory (default: the bundled pair)")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--mode", default=None, help="the server's mode (requests name theirs with d3d_mode)")
    ap.add_argument("--modes", default="sync,ar", help="modes compared, comma-separated (default sync,ar)")
    ap.add_argument("--clients", default="1,4,16,32", help="concurrency levels (default 1,4,16,32)")
    ap.add_argument("--requests", type=int, default=32,
                    help="requests per level: the same requests (prompt, length) at every level (default 32)")
    ap.add_argument("--max-tokens", default="32,64,96,128", help="answer lengths, cycled over the requests")
    ap.add_argument("--slots", type=int, default=16, help="the server's --slots")
    ap.add_argument("--rss", type=int, default=0, help="then N sequential requests, the server's RSS sampled")
    ap.add_argument("--abuse", action="store_true",
                    help="instead of the levels: the first level's normal load alone and beside abusive clients "
                         "(bench/serve_abuse.py): latency p50/p99, the server's RSS, requests with no answer")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import d3d
    from d3d.assets import BUNDLED_TARGET, models_dir
    from d3d.data.prompts import code_prompts

    model_dir = Path(args.model) if args.model else models_dir() / BUNDLED_TARGET
    tok = d3d.load_tokenizer(model_dir)
    prompts = [tok.decode(p) for p in code_prompts(tok, 64, prompt_len=64)]
    lengths = [int(x) for x in args.max_tokens.split(",")]
    if args.abuse:  # 1,200 idle connections on each side
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    proc, host, port = start_server(args)
    results, rss, abuse = [], None, None
    try:
        if args.abuse:
            from . import serve_abuse

            mode = args.modes.split(",")[0]
            level(host, port, prompts, [8], 2, 4, mode)  # warm-up
            abuse = serve_abuse.run(host, port, proc.pid, prompts, int(args.clients.split(",")[0]), args.requests,
                                    mode)
            print(serve_abuse.report(abuse))
        for mode in args.modes.split(",") if not args.abuse else []:
            level(host, port, prompts, [8], 2, 4, mode)  # warm-up: kernels, caches, first-call costs
            for c in [int(x) for x in args.clients.split(",")]:
                row = level(host, port, prompts, lengths, c, args.requests, mode)
                results.append(row)
                print(f"{mode} x{c}: {row['tok_s']:.1f} tok/s, latency p50 {row['latency_p50']:.2f} s, "
                      f"ttft p50 {row['ttft_p50']:.3f} s, {row['completed']}/{row['requests']} ok", file=sys.stderr,
                      flush=True)
        if args.rss:
            samples, t0 = [], time.perf_counter()
            for i in range(args.rss):
                r = request(host, port, prompts[i % len(prompts)], 16, args.modes.split(",")[0])
                if "error" in r:
                    raise SystemExit(f"request {i} of the RSS run failed: {r['error']}")
                if (i + 1) % 100 == 0:
                    samples.append({"requests": i + 1, "rss_mib": rss_kib(proc.pid) / 1024})
                    print(f"rss after {i + 1} requests: {samples[-1]['rss_mib']:.1f} MiB", file=sys.stderr, flush=True)
            warm = samples[0]["rss_mib"]
            rss = {"requests": args.rss, "samples": samples, "seconds": time.perf_counter() - t0,
                   "growth_after_warmup": max(s["rss_mib"] for s in samples) / warm - 1}
    finally:
        proc.terminate()
        proc.wait(120)
    base = {m: next((r["tok_s"] for r in results if r["mode"] == m and r["clients"] == 1), None)
            for m in args.modes.split(",")}
    for r in results:
        r["vs_1_client"] = r["tok_s"] / base[r["mode"]] if base[r["mode"]] else None
    ar = {r["clients"]: r["tok_s"] for r in results if r["mode"] == "ar"}
    for r in results:
        r["vs_ar"] = r["tok_s"] / ar[r["clients"]] if r["clients"] in ar else None
    print(markdown_table(["mode", "clients", "tok/s", "vs 1 client", "vs ar", "latency p50 / p90 s",
                          "ttft p50 / p90 s", "ok"],
                         [[r["mode"], r["clients"], f"{r['tok_s']:.1f}", f"{r['vs_1_client']:.2f}x",
                           f"{r['vs_ar']:.2f}x" if r["vs_ar"] else "-",
                           f"{r['latency_p50']:.2f} / {r['latency_p90']:.2f}",
                           f"{r['ttft_p50']:.3f} / {r['ttft_p90']:.3f}", f"{r['completed']}/{r['requests']}"]
                          for r in results]))
    if rss:
        print(f"\nRSS over {rss['requests']} sequential requests: {rss['samples'][0]['rss_mib']:.1f} MiB after 100, "
              f"at most {rss['growth_after_warmup']:+.1%} after that")
    payload = {"bench": "serve", "machine": machine(), "config": vars(args), "model": str(model_dir),
               "results": results, "rss": rss, "abuse": abuse}
    write_json(args.out, payload)
    return payload
