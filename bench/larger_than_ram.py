#!/usr/bin/env python3
"""A model larger than memory: TITAN streaming its experts vs llama.cpp on the same GGUF, in memory cgroups.

    python3 bench/larger_than_ram.py MODEL.gguf --memory-limit 6G --memory-limit 10G \
        --layouts in-place,copy --gen 256 --llama-gen 8 --json results.json

For each memory limit (a cgroup v1 memory controller capping the engines, page cache included: a machine with
that much RAM as far as the engine can tell; without --memory-limit, the whole machine) and each run the page cache
is dropped first (needs root), so every engine starts cold, as after a reboot.

TITAN, per store layout (`in-place`: MODEL.titan-index, no copy; `copy`: the MODEL.titan directory), budget
(default `auto`: TITAN sizes it from the memory the cgroup leaves) and cache policy (--policies lru,lfu):
  - first token: wall time of `titan run … -n 1` from a short prompt, process start and load included;
  - decode: `titan bench -p 0 -n GEN`, all of it and its second half (the steady state, the cache warm), with the
    hit rate and the bytes read from disk per token over that half;
  - percent of the disk floor: the steady state against disk bandwidth / bytes read per token, the bandwidth
    measured with O_DIRECT reads of half the store's records at random, 8 at once (the cache's I/O threads), right
    before and right after the run (their mean is the divisor: a shared disk's speed drifts);
  - how busy the disk was during the bench (the block device's busy time over wall time) and what it read.
llama.cpp, with its defaults (mmap, Q4_0 repacked at load) and with repacking off (`--repack 0` / `-nr`):
first token (`llama-completion -n 1`) and decode (`llama-bench -p 0 -n LLAMA_GEN`), or that it was killed (the
cgroup's OOM killer) or ran past --timeout.

Python standard library only. Builds nothing: `cargo build --release -p titan-cli`, `cargo build --release
-p titan-store --example read_records` and bench/build_llama_cpp.sh first.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TITAN = os.path.join(ROOT, "target", "release", "titan")
READ_RECORDS = os.path.join(ROOT, "target", "release", "examples", "read_records")
LLAMA_BENCH = os.path.join(ROOT, "build", "llama.cpp", "bin", "llama-bench")
LLAMA_COMPLETION = os.path.join(ROOT, "build", "llama.cpp", "bin", "llama-completion")
CGROUP = "/sys/fs/cgroup/memory/titan-bench"


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def cgroup_file(name, value=None):
    path = os.path.join(CGROUP, name)
    if value is None:
        with open(path) as f:
            return f.read()
    with open(path, "w") as f:
        f.write(value)


def set_limit(limit):
    """A cgroup (v1 memory controller) capping the memory of the engines run in it, page cache included."""
    os.makedirs(CGROUP, exist_ok=True)
    cgroup_file("memory.limit_in_bytes", limit)


def oom_kills():
    for line in cgroup_file("memory.oom_control").splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def run(cmd, limited, timeout):
    """Run `cmd` cold (page cache dropped), in the cgroup if `limited`. Returns (seconds, stdout, failure):
    failure is None, or why it did not finish."""
    if limited:
        cmd = ["sh", "-c", f'echo $$ > {CGROUP}/tasks && exec "$@"', "sh"] + cmd
    drop_caches()
    kills = oom_kills() if limited else 0
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.monotonic() - t, "", f"still running after {timeout} s (stopped)"
    wall = time.monotonic() - t
    if p.returncode == 0:
        return wall, p.stdout, None
    if limited and oom_kills() > kills:
        return wall, p.stdout, f"killed by the OOM killer after {wall:.0f} s"
    return wall, p.stdout, f"exit {p.returncode}: {p.stderr.strip()[-300:]}"


def disk_bandwidth(model, store):
    """Bytes/s of O_DIRECT reads of half the store's records chosen at random (a seed from the clock), 8 in flight,
    no digest check: the disk at the record size, sustained. A few hundred records mislead on a virtual disk: its
    host caches what was read (records read a second time came back twice as fast on the EPYC VM, and dropping the
    guest's page cache does not reach the host's) and it may allow bursts. Half the store, read over tens of
    seconds, is read as a run reads it: spread over the whole store, some records twice."""
    seed = time.time_ns() % 2**32
    out = subprocess.run([READ_RECORDS, model, store, "0.5", str(seed), "--no-verify", "--threads", "8"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["mb_per_s"] * 1e6


class DiskActivity:
    """The block device under a file, from its /sys stat: bytes read and the time it was busy (any request in
    flight) between `start` and `stop`."""

    def __init__(self, path):
        dev = os.stat(path).st_dev
        self.stat = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat"

    def sample(self):
        f = open(self.stat).read().split()
        return time.monotonic(), int(f[2]) * 512, int(f[9]) / 1e3  # seconds, bytes read, busy seconds

    def start(self):
        self.t0 = self.sample()

    def stop(self):
        t1 = self.sample()
        wall = t1[0] - self.t0[0]
        return {"bytes_per_s": (t1[1] - self.t0[1]) / wall, "busy": (t1[2] - self.t0[2]) / wall}


def du(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--memory-limit", action="append", default=[],
                    help="a memory cgroup of this size (e.g. 6G); repeat for several; none: the whole machine")
    ap.add_argument("--layouts", default="in-place,copy")
    ap.add_argument("--budgets", default="auto")
    ap.add_argument("--policies", default="lru", help="cache policies to run TITAN with (lru, lfu)")
    ap.add_argument("--titan-arg", action="append", default=[], metavar="ARG",
                    help="pass ARG to every titan run (e.g. --titan-arg=--no-prefetch)")
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--llama-gen", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1200, help="seconds before a run is stopped")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--skip-titan", action="store_true")
    ap.add_argument("--json", help="write the raw results here")
    a = ap.parse_args()

    stores = {"in-place": os.path.splitext(a.model)[0] + ".titan-index",
              "copy": os.path.splitext(a.model)[0] + ".titan"}
    layouts = [] if a.skip_titan else a.layouts.split(",")  # llama.cpp alone needs no store
    for lay in layouts:
        if not os.path.exists(stores[lay]):
            subprocess.run([TITAN, "convert", a.model, "--layout", lay], check=True)
    size = os.path.getsize(a.model)
    mem = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal:"))
    print(f"model {a.model}: {size / 2**30:.2f} GiB; machine RAM {mem / 2**30:.2f} GiB; {a.threads} threads; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    disk = {lay: du(stores[lay]) for lay in layouts}
    for lay in layouts:
        print(f"disk: {lay} store {disk[lay] / 2**30:.2f} GiB beside the model: {(size + disk[lay]) / 2**30:.2f} GiB "
              "in all", flush=True)
    bw = None
    if layouts:  # measured with the store's records, which llama.cpp alone does not need
        bw = disk_bandwidth(a.model, stores[layouts[0]])
        print(f"disk read bandwidth at the record size (O_DIRECT, 8 in flight, half the store): {bw / 1e9:.2f} GB/s",
              flush=True)
    results = {"model": a.model, "bytes": size, "ram": mem, "threads": a.threads, "disk_bytes_per_s": bw,
               "store_bytes": disk, "runs": []}
    t = str(a.threads)

    for limit in a.memory_limit or [None]:
        limited = limit is not None
        if limited:
            set_limit(limit)
        where = f"cgroup {limit}" if limited else "whole machine"
        for lay in layouts:
            for b, pol in [(b, p) for b in a.budgets.split(",") for p in a.policies.split(",")]:
                opts = ["--store", stores[lay], "--expert-budget", b, "--cache-policy", pol] + a.titan_arg
                ttft, _, fail = run([TITAN, "run", "-m", a.model, "-p", "Hello", "-n", "1", "--temp", "0", "-t", t]
                                    + opts, limited, a.timeout)
                r = {"memory": limit, "engine": "titan", "layout": lay, "budget": b, "policy": pol, "ttft_s": ttft,
                     "args": a.titan_arg, "failure": fail}
                if not fail:
                    # The disk is measured again around each run: a shared disk's speed drifts by minutes.
                    around = [disk_bandwidth(a.model, stores[lay])]
                    activity = DiskActivity(a.model)
                    activity.start()
                    _, out, fail = run([TITAN, "bench", "-m", a.model, "-p", "0", "-n", str(a.gen), "-r", "1", "-t", t,
                                        "--json"] + opts, limited, a.timeout)
                    r["disk_during_bench"] = activity.stop()
                    around.append(disk_bandwidth(a.model, stores[lay]))
                    r["failure"] = fail
                if not fail:
                    j = json.loads(out.strip().splitlines()[-1])
                    # The expert source's counters over the steady state, by their Prometheus names.
                    c = j["steady_expert_cache"]
                    hits, misses = c["expert_cache_hits_total"], c["expert_cache_misses_total"]
                    per_token = c["expert_cache_read_bytes_total"] / j["steady_tokens"]
                    run_bw = sum(around) / 2
                    r["disk_bytes_per_s_around"] = around
                    floor = run_bw / per_token if per_token else float("inf")
                    r.update({"budget_bytes": j["experts"]["expert_cache_budget_bytes"], "decode_tok_s": j["decode_tok_s"],
                              "steady_tok_s": j["decode_steady_tok_s"],
                              "steady_hit_rate": hits / max(hits + misses, 1),
                              "steady_read_per_token": per_token, "floor_tok_s": floor,
                              "floor_pct": 100 * j["decode_steady_tok_s"] / floor,
                              "peak_rss_bytes": j["peak_rss_bytes"]})
                    print(f"[{where}] titan {lay:8} {pol} {' '.join(a.titan_arg)} budget {b} ({r['budget_bytes'] / 2**30:.2f} GiB): first token "
                          f"{ttft:5.1f} s, decode {r['decode_tok_s']:.2f} tok/s, steady {r['steady_tok_s']:.2f} tok/s "
                          f"at hit rate {r['steady_hit_rate']:.3f}, {per_token / 2**20:.0f} MiB/token from disk "
                          f"({r['floor_pct']:.0f}% of the disk floor {floor:.2f} tok/s at the disk's "
                          f"{around[0] / 1e9:.2f}/{around[1] / 1e9:.2f} GB/s before/after); "
                          f"disk busy {100 * r['disk_during_bench']['busy']:.0f}% of the bench, reading "
                          f"{r['disk_during_bench']['bytes_per_s'] / 1e6:.0f} MB/s; peak RSS "
                          f"{r['peak_rss_bytes'] / 2**30:.2f} GiB", flush=True)
                else:
                    print(f"[{where}] titan {lay} {pol} budget {b}: {fail}", flush=True)
                results["runs"].append(r)

        if a.skip_llama:
            continue
        for name, bench_flags, run_flags in [("default", [], []), ("no repack", ["--repack", "0"], ["-nr"])]:
            ttft, _, fail = run([LLAMA_COMPLETION, "-m", a.model, "-p", "Hello", "-n", "1", "-t", t, "-no-cnv",
                                 "--temp", "0"] + run_flags, limited, a.timeout)
            r = {"memory": limit, "engine": "llama.cpp", "mode": name, "ttft_s": ttft, "failure": fail}
            if not fail:
                _, out, fail = run([LLAMA_BENCH, "-m", a.model, "-p", "0", "-n", str(a.llama_gen), "-t", t, "-r", "1",
                                    "-o", "json"] + bench_flags, limited, a.timeout)
                r["failure"] = fail
            if not fail:
                r["decode_tok_s"] = [e["avg_ts"] for e in json.loads(out) if e.get("n_gen", 0) > 0][0]
                print(f"[{where}] llama.cpp ({name}): first token {ttft:5.1f} s, decode {r['decode_tok_s']:.2f} tok/s "
                      f"({a.llama_gen} tokens)", flush=True)
            else:
                print(f"[{where}] llama.cpp ({name}): {fail}", flush=True)
            results["runs"].append(r)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
