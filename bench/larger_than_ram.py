#!/usr/bin/env python3
"""A model larger than RAM: TITAN streaming experts from its expert store vs llama.cpp on the same GGUF.

    python3 bench/larger_than_ram.py MODEL.gguf --budgets 4GiB,8GiB,12GiB --gen 16 --threads 2 [--direct-io]

Before every run the page cache is dropped (needs root: `echo 3 > /proc/sys/vm/drop_caches`), so each engine starts
cold, as after a reboot. Measured per engine:
  - time to first token: wall time of generating 1 token from a short prompt, load included
    (`titan run … -n 1`, `llama-completion … -n 1 -no-cnv`);
  - decode tok/s: `titan bench -p 0 -n GEN` per expert budget (with the cache's hit rate and bytes read),
    `llama-bench -p 0 -n GEN` (mmap, as users run it).
With --memory-limit SIZE both engines run in a memory cgroup: a machine with SIZE of RAM, page cache included.
Python standard library only. Builds nothing: run bench/compare.py once (or cargo build --release and
bench/build_llama_cpp.sh) first.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TITAN = os.path.join(ROOT, "target", "release", "titan")
LLAMA_BENCH = os.path.join(ROOT, "build", "llama.cpp", "bin", "llama-bench")
LLAMA_COMPLETION = os.path.join(ROOT, "build", "llama.cpp", "bin", "llama-completion")
LIMITED = False


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


CGROUP = "/sys/fs/cgroup/memory/titan-bench"


def limit_memory(limit):
    """A cgroup (v1 memory controller) that caps the memory of the engines run in it, page cache included:
    a machine with `limit` bytes of RAM, as far as the engine can tell."""
    os.makedirs(CGROUP, exist_ok=True)
    with open(os.path.join(CGROUP, "memory.limit_in_bytes"), "w") as f:
        f.write(limit)


def in_cgroup(cmd):
    return ["sh", "-c", f'echo $$ > {CGROUP}/tasks && exec "$@"', "sh"] + cmd


def timed(cmd):
    if os.path.isdir(CGROUP) and LIMITED:
        cmd = in_cgroup(cmd)
    drop_caches()
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return wall, p.stdout, p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--budgets", default="4GiB,8GiB,12GiB")
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--direct-io", action="store_true")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--memory-limit", help="run both engines in a memory cgroup of this size (e.g. 12G): "
                    "a machine with that much RAM, page cache included (needs root and cgroup v1's memory controller)")
    a = ap.parse_args()
    global LIMITED
    LIMITED = bool(a.memory_limit)
    if LIMITED:
        limit_memory(a.memory_limit)

    store = os.path.splitext(a.model)[0] + ".titan"
    if not os.path.exists(os.path.join(store, "manifest.json")):
        subprocess.run([TITAN, "convert", a.model], check=True)
    size = os.path.getsize(a.model)
    mem = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal:"))
    if LIMITED:
        print(f"both engines run in a memory cgroup limited to {a.memory_limit}")
    print(f"model {a.model}: {size / 2**30:.2f} GiB; machine RAM {mem / 2**30:.2f} GiB; {a.threads} threads; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    results = {"model": a.model, "bytes": size, "ram": mem, "titan": [], "llama": {}}
    t = str(a.threads)
    io = ["--direct-io"] if a.direct_io else []

    for b in a.budgets.split(","):
        ttft, _, _ = timed([TITAN, "run", "-m", a.model, "-p", "Hello", "-n", "1", "--temp", "0", "-t", t,
                            "--expert-budget", b] + io)
        _, out, _ = timed([TITAN, "bench", "-m", a.model, "-p", "0", "-n", str(a.gen), "-r", "1", "-t", t,
                           "--expert-budget", b, "--json"] + io)
        j = json.loads(out.strip().splitlines()[-1])
        c = j["expert_cache"]["total"]
        req = c["hits"] + c["misses"]
        r = {"budget": b, "ttft_s": ttft, "decode_tok_s": j["decode_tok_s"], "hit_rate": c["hits"] / max(req, 1),
             "bytes_read": c["bytes_read"], "read_s": c["read_ns"] / 1e9, "stall_s": c["stall_ns"] / 1e9,
             "tokens": a.gen + 8}
        results["titan"].append(r)
        print(f"titan budget {b:>7}: first token {ttft:6.1f} s, decode {r['decode_tok_s']:6.2f} tok/s, "
              f"hit rate {r['hit_rate']:.3f}, read {c['bytes_read'] / 2**30:.2f} GiB "
              f"({c['bytes_read'] / 2**20 / (a.gen + 8):.0f} MiB/token incl. warm-up), stall {r['stall_s']:.1f} s",
              flush=True)

    if not a.skip_llama:
        ttft, _, _ = timed([LLAMA_COMPLETION, "-m", a.model, "-p", "Hello", "-n", "1", "-t", t, "-no-cnv",
                            "--temp", "0"])
        _, out, _ = timed([LLAMA_BENCH, "-m", a.model, "-p", "0", "-n", str(a.gen), "-t", t, "-r", "1", "-o", "json"])
        tg = [e["avg_ts"] for e in json.loads(out) if e.get("n_gen", 0) > 0][0]
        results["llama"] = {"ttft_s": ttft, "decode_tok_s": tg}
        print(f"llama.cpp (mmap): first token {ttft:6.1f} s, decode {tg:6.2f} tok/s", flush=True)
        for r in results["titan"]:
            print(f"  ratio TITAN/llama.cpp at budget {r['budget']}: decode {r['decode_tok_s'] / tg:.2f}x, "
                  f"first token {ttft / r['ttft_s']:.2f}x faster", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
