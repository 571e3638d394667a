#!/usr/bin/env python3
"""A soak of `titan serve` over a cluster on loopback: bounded concurrent streamed load for a while, with one
expert worker killed (SIGKILL) and restarted on its address part-way through.

    python3 bench/soak.py [-m tests/fixtures/qwen3moe/q8_0.gguf] [--minutes 5] [--clients 6] [--workers 2]

Every request is a streamed greedy completion of a prompt from a small set; the text of each prompt is learnt
from its first answer before the worker is killed, and every later answer must equal it (the cluster's failover
changes no byte). Reports requests sent, completed, refused by design (429) and failed (anything else, or a
text that differs), the server's peak RSS, and its open file descriptors and TCP connections sampled every 5 s.
Exits non-zero on any failed request or on descriptors that keep growing. Only the Python standard library.
"""

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "soak-test-node-token-0123456789"


def spawn(cmd):
    """Starts `cmd`, returns (process, the address it prints as `listening on ADDR`)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    m = re.match(r"listening on (\S+)", line)
    if not m:
        raise RuntimeError(f"{cmd[:2]} said {line!r}")
    return p, m.group(1)


def completion(addr, prompt, tokens):
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=300)
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True}), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        body = r.read()
        c.close()
        return r.status, body.decode(errors="replace")
    text = []
    for raw in r:
        line = raw.decode().strip()
        if line.startswith("data: {"):
            ev = json.loads(line[6:])
            if "error" in ev:
                c.close()
                return 500, ev["error"]["message"]
            text.extend(ch.get("text", "") for ch in ev["choices"])
    c.close()
    return 200, "".join(text)


def proc_stats(pid):
    with open(f"/proc/{pid}/status") as f:
        hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:  # closed since the listing
            pass
    return hwm, len(links), sum(1 for l in links if l.startswith("socket:"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "tests/fixtures/qwen3moe/q8_0.gguf"))
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--titan", default=os.path.join(ROOT, "target/release/titan"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    token = os.path.join(tmp, "node.token")
    with open(token, "w") as f:
        f.write(TOKEN)
    worker_cmd = lambda listen: [a.titan, "worker", "-m", a.model, "--listen", listen, "--threads", "1", "--token-file", token]
    workers = [spawn(worker_cmd("127.0.0.1:0")) for _ in range(a.workers)]
    nodes = ",".join(addr for _, addr in workers)
    # Fewer slots than clients, and a short queue: some requests are refused by design (429).
    server, addr = spawn([a.titan, "serve", "-m", a.model, "--threads", "2", "--listen", "127.0.0.1:0", "--parallel", "4", "--queue", "1", "--nodes", nodes, "--token-file", token])
    try:
        run(a, addr, server, workers, worker_cmd)
    finally:
        for p in [server] + [w for w, _ in workers]:
            p.kill()


def run(a, addr, server, workers, worker_cmd):
    prompts = [f"Soak prompt {i}: the quick brown fox" for i in range(8)]
    expected = {p: completion(addr, p, a.tokens)[1] for p in prompts}

    counts = {"sent": 0, "completed": 0, "refused": 0, "failed": 0}
    failures = []
    lock = threading.Lock()
    stop = time.time() + a.minutes * 60

    def client(i):
        n = 0
        while time.time() < stop:
            p = prompts[(i + n) % len(prompts)]
            n += 1
            status, text = completion(addr, p, a.tokens)
            with lock:
                counts["sent"] += 1
                if status == 200 and text == expected[p]:
                    counts["completed"] += 1
                elif status == 429:
                    counts["refused"] += 1
                    time.sleep(0.2)
                else:
                    counts["failed"] += 1
                    failures.append((status, text[:200]))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    samples, killed = [], False
    start = time.time()
    while any(t.is_alive() for t in threads):
        elapsed = time.time() - start
        if not killed and elapsed > a.minutes * 60 / 3:
            victim, vaddr = workers[0]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            time.sleep(2)
            workers[0] = spawn(worker_cmd(vaddr))
            killed = True
            print(f"{elapsed:6.1f} s: worker {vaddr} killed and restarted", flush=True)
        hwm, fds, sockets = proc_stats(server.pid)
        samples.append((elapsed, hwm, fds, sockets))
        print(f"{elapsed:6.1f} s: {counts}, server peak RSS {hwm / 1024:.0f} MiB, {fds} descriptors, {sockets} sockets", flush=True)
        time.sleep(5)
    for t in threads:
        t.join()
    time.sleep(1)
    hwm, fds, sockets = proc_stats(server.pid)
    first_half = max(s[2] for s in samples[: len(samples) // 2])
    result = {**counts, "minutes": a.minutes, "clients": a.clients, "peak_rss_mib": round(hwm / 1024, 1), "descriptors_at_end": fds, "sockets_at_end": sockets, "descriptors_max": max(s[2] for s in samples), "descriptors_max_first_half": first_half}
    print(json.dumps(result))
    if counts["failed"] or fds > first_half + 4:
        print("FAILED:", failures[:5])
        raise SystemExit(1)


if __name__ == "__main__":
    main()
