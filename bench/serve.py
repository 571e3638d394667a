#!/usr/bin/env python3
"""Serving throughput, TITAN against llama-server, side by side in one run on the same GGUF and threads.

Each server is started with the same number of parallel slots and the same context per slot, then sent 1, 4
and 8 concurrent streamed greedy completion requests (distinct prompts each round, so llama-server's prompt
cache cannot answer from an earlier round). Per level and round: aggregate generated tokens per second
(all requests' completion tokens / wall time from the first request sent to the last finished) and the mean
time to first token. Prints the medians over the rounds as a Markdown table and one JSON line.

    python3 bench/serve.py -m /work/models/olmoe-1b-7b-q4_0.gguf --threads 2 [--clients 1,4,8] [--tokens 64]

Only the Python standard library; llama-server from `LLAMA_SERVER=1 bash bench/build_llama_cpp.sh`.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stream(port, prompt, tokens):
    """One streamed completion: (completion tokens, seconds to first text, seconds in all)."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:300]!r}")
    first, n = None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            n = ev["usage"]["completion_tokens"]
        if first is None and any(ch.get("text") for ch in ev.get("choices", [])):
            first = time.perf_counter() - t0
    c.close()
    return n, first or 0.0, time.perf_counter() - t0


def level(port, clients, tokens, round_no):
    prompts = [f"Round {round_no}, request {i}: the history of the northern kingdoms began when" for i in range(clients)]
    results = [None] * clients

    def go(i):
        results[i] = stream(port, prompts[i], tokens)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if any(r is None for r in results):
        raise RuntimeError("a request failed")
    total = sum(r[0] for r in results)
    return total / wall, statistics.mean(r[1] for r in results), total


def start(cmd, port):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p
        except OSError:
            pass
        if p.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {p.returncode}")
        time.sleep(0.5)
    raise RuntimeError(f"{cmd[0]} did not become healthy")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=512, help="context per slot")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--titan", default=os.path.join(ROOT, "target/release/titan"))
    ap.add_argument("--llama-server", default=os.path.join(ROOT, "build/llama.cpp/bin/llama-server"))
    a = ap.parse_args()
    levels = [int(x) for x in a.clients.split(",")]
    slots = max(levels)
    servers = {
        "titan": lambda port: [a.titan, "serve", "-m", a.model, "--threads", str(a.threads), "--parallel", str(slots), "-c", str(a.ctx), "--listen", f"127.0.0.1:{port}"],
        # llama-server's -c is the total over its slots.
        "llama.cpp": lambda port: [a.llama_server, "-m", a.model, "-t", str(a.threads), "-tb", str(a.threads), "-np", str(slots), "-c", str(a.ctx * slots), "--host", "127.0.0.1", "--port", str(port), "--no-webui"],
    }
    results = {}
    for i, (name, cmd) in enumerate(servers.items()):
        port = 18480 + i
        p = start(cmd(port), port)
        try:
            level(port, 1, 4, -1)  # warm-up: pages the weights in
            for n in levels:
                rounds = [level(port, n, a.tokens, r) for r in range(a.rounds)]
                results[(name, n)] = (statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds), [r[2] for r in rounds])
                print(f"{name:9} {n} clients: {results[(name, n)][0]:.2f} tok/s, TTFT {results[(name, n)][1] * 1000:.0f} ms, tokens {results[(name, n)][2]}", file=sys.stderr)
        finally:
            p.terminate()
            p.wait()
    print(f"| concurrent requests | TITAN tok/s | llama-server tok/s | ratio | TITAN TTFT | llama-server TTFT |")
    print(f"| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in levels:
        t, l = results[("titan", n)], results[("llama.cpp", n)]
        print(f"| {n} | {t[0]:.2f} | {l[0]:.2f} | {t[0] / l[0]:.2f}× | {t[1] * 1000:.0f} ms | {l[1] * 1000:.0f} ms |")
    print(json.dumps({f"{name}_{n}": {"tok_s": v[0], "ttft_s": v[1], "tokens": v[2]} for (name, n), v in results.items()}))


if __name__ == "__main__":
    main()
