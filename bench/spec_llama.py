#!/usr/bin/env python3
"""Speculative decoding at a chosen acceptance rate, TITAN against llama.cpp's own, on the same GGUF and threads.

    python3 bench/spec_llama.py MODEL.gguf DRAFT.gguf [--rate 0.8] [--drafts 4] [--gen 128] [--rounds 3] [--threads 2]

llama.cpp: `llama-server -m MODEL -md DRAFT --spec-type draft-simple --spec-draft-n-min D --spec-draft-n-max D
--spec-synth-rates …`, its benchmarking mode that accepts each draft at random with the given per-position rates
(α, α², …: each draft right with chance α), against the same server without a draft model; one /completion of
--gen tokens from a 16-word prompt, sampled at temperature 1 with a fixed seed, `ignore_eos`. Its drafts cost a
step of DRAFT each (pass a small model: e.g. `titan synth --layers 1` of the same preset, whose vocabulary is the
model's). TITAN: `titan bench --spec-rate α --draft-min D --draft-max D`, which drafts the plain run's own
continuation with each draft right with chance α (no draft model to run). Rounds alternate the engines; medians.
llama-server from `LLAMA_SERVER=1 bash bench/build_llama_cpp.sh` (or LLAMA_SERVER_BIN).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TITAN = os.environ.get("TITAN_BIN") or os.path.join(ROOT, "target", "release", "titan")
LLAMA_DIR = os.path.join(ROOT, "build", "llama.cpp", "bin")
LLAMA_SERVER = os.environ.get("LLAMA_SERVER_BIN") or os.path.join(LLAMA_DIR, "llama-server")
PROMPT = "the river ran past the old mill and under the stone bridge where the children played every summer"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama(a, spec):
    port = free_port()
    cmd = [LLAMA_SERVER, "-m", a.model, "-t", str(a.threads), "-c", "1024", "--port", str(port), "-np", "1",
           "--no-webui"]
    if spec:
        rates = ",".join(f"{a.rate ** (i + 1):.6f}" for i in range(a.drafts))
        cmd += ["-md", a.draft, "-td", str(a.threads), "--spec-type", "draft-simple", "--spec-draft-n-min",
                str(a.drafts), "--spec-draft-n-max", str(a.drafts), "--spec-synth-rates", rates]
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(LLAMA_SERVER))
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            if p.poll() is not None:
                raise SystemExit(f"llama-server exited: {' '.join(cmd)}")
            try:
                if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        body = {"prompt": PROMPT, "n_predict": a.gen, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                "seed": 1, "ignore_eos": True, "cache_prompt": False}
        req = urllib.request.Request(url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = json.load(urllib.request.urlopen(req, timeout=3600))
        t = r["timings"]
        return t["predicted_per_second"], t.get("draft_n", 0), t.get("draft_n_accepted", 0), t["predicted_n"]
    finally:
        p.kill()
        p.wait()


def titan(a):
    cmd = [TITAN, "bench", "-m", a.model, "-t", str(a.threads), "-p", "16", "-n", str(a.gen), "-r", "1", "--json",
           "--spec-rate", str(a.rate), "--draft-min", str(a.drafts), "--draft-max", str(a.drafts)]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])["speculative"]
    return rows[0], rows[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("draft")
    ap.add_argument("--rate", type=float, default=0.8)
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    lp, ls, tp, ts = [], [], [], []
    for r in range(a.rounds):
        lp.append(llama(a, False))
        ls.append(llama(a, True))
        plain, spec = titan(a)
        tp.append(plain)
        ts.append(spec)
        print(f"round {r + 1}: llama.cpp {lp[-1][0]:.2f} -> {ls[-1][0]:.2f} tok/s ({ls[-1][2]} of {ls[-1][1]} drafts); "
              f"TITAN {plain['decode_tok_s']:.2f} -> {spec['decode_tok_s']:.2f} tok/s "
              f"({spec['accepted']} of {spec['drafted']} drafts)", flush=True)
    med = statistics.median
    l0, l1 = med(x[0] for x in lp), med(x[0] for x in ls)
    t0, t1 = med(x["decode_tok_s"] for x in tp), med(x["decode_tok_s"] for x in ts)
    print(f"\n{os.path.basename(a.model)}, {a.threads} threads, {a.gen} tokens, {a.drafts} drafts a step, each right "
          f"with chance {a.rate}, {a.rounds} rounds (medians)")
    print(f"{'':10} {'plain tok/s':>12} {'speculative':>12} {'× plain':>8}   drafts kept")
    print(f"{'llama.cpp':10} {l0:12.2f} {l1:12.2f} {l1 / l0:7.2f}x   {sum(x[2] for x in ls)} of {sum(x[1] for x in ls)}")
    print(f"{'TITAN':10} {t0:12.2f} {t1:12.2f} {t1 / t0:7.2f}x   {sum(x['accepted'] for x in ts)} of {sum(x['drafted'] for x in ts)}")
    print(f"TITAN / llama.cpp: plain {t0 / l0:.2f}x, speculative {t1 / l1:.2f}x")


if __name__ == "__main__":
    main()
