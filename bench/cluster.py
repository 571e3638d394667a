#!/usr/bin/env python3
"""The cluster against one machine, side by side in one run: `titan bench` on a single node, then the same
command as the backbone of `--workers` `titan worker` processes, alternating for `--rounds`; medians and ratios.

    python3 bench/cluster.py MODEL.gguf --workers 2 --threads 2 --gen 32 --prompt 64 --rounds 3
        [--pin]                      each worker on its own core (taskset), the backbone and the single node on all
        [--veth RATE]                each worker in its own network namespace behind a veth pair shaped to RATE
                                     (tc tbf, e.g. 1gbit); the backbone reaches it at 10.77.N.2
        [--memory-limit 6G]          every process (the single node, the backbone, each worker) in its own memory
                                     cgroup of that size, page cache included: a machine of that size each
        [--cpu-quota 0.5]            every process in its own CPU cgroup allowed that many cores' time (CFS quota):
                                     a machine of that speed each, however many share this host's cores. Polling is
                                     turned off (TITAN_POLL=0) for every process then: a quota charges spinning as work
        [--project]                  after the runs, the calibrated projection for real machines (see below)
        [--single-args "..."]        extra arguments of the single node (e.g. "--expert-budget 4GiB --direct-io")
        [--backbone-args "..."]      extra arguments of the backbone
        [--worker-args "..."]        extra arguments of each worker (e.g. "--expert-budget 5GiB --direct-io")
        [--warmup N]                 a first cluster run of N tokens, not counted (fills streaming workers' caches)
        [--shards A.gguf,B.gguf]     worker i serves shard i (`titan slice`) instead of the whole model
        [--relay-delay-ms D]         each worker reached through bench/delay_relay.py, which delays every byte by D ms
                                     each way (a link's latency, on loopback; this kernel has no netem)
        [--spec-rate 0.8,0.6]        measure speculative decoding instead (`titan bench --spec-rate`, the drafts right
                                     at each rate), on the single node and on the cluster: decode against each
                                     one's own plain decode of the same text [--draft-min 4 --draft-max 4]

Needs root for --veth, --memory-limit and --cpu-quota (cgroup v1's cpu and memory controllers, or v2's
cpu.max and memory.max).

What a harness on one host cannot show: every "machine" here shares one memory bus and one last-level cache, so
memory-bound work (all of decode) runs slower on each of them than on machines of their own; a quota bounds the CPU
time a process gets per 100 ms period, not when within the period it runs, so a process that waits on another can
be scheduled late; and loopback has no wire. The projection (--project) takes each phase's time from the single
node's own run and the round trips and bytes per token from the cluster's, and predicts real machines:

    t(N) = serial + parallel / (N + 1) + round_trips × rtt + bytes / bandwidth

with N workers and the backbone sharing the parallel work (experts, projections, LM head) in proportion, the rest
(norms, attention over the cache, output projections, routers, the combine, sampling) on the backbone. It is
checked against the runs made here: the loopback prediction (the measured empty round trip, no wire) beside the
measured cluster speed. Prints the network counters of the cluster runs (round trips, bytes, time
per exchange against an empty round trip) and, with --veth, the decode time that a one-way delay of --delay-ms would
add (this machine's kernel has no netem, so the delay is predicted from the round trips, not emulated).
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TITAN = os.environ.get("TITAN_BIN") or os.path.join(ROOT, "target", "release", "titan")


def sh(cmd):
    subprocess.run(cmd, shell=True, check=True)


V2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers") and not os.path.exists("/sys/fs/cgroup/memory")


def size_bytes(limit):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    m = re.fullmatch(r"(\d+)([KMGT]?)", limit.strip().upper())
    if not m:
        sys.exit(f"--memory-limit {limit}: use a size like 6G")
    return int(m.group(1)) * units[m.group(2)]


def cgroup(name, a):
    """The cgroups of one process: memory and CPU as asked; the files a process joins them by."""
    tasks = []
    period = 100_000
    if V2:
        path = f"/sys/fs/cgroup/{name}"
        os.makedirs(path, exist_ok=True)
        if a.memory_limit:
            open(os.path.join(path, "memory.max"), "w").write(str(size_bytes(a.memory_limit)))
        if a.cpu_quota:
            open(os.path.join(path, "cpu.max"), "w").write(f"{int(a.cpu_quota * period)} {period}")
        tasks.append(os.path.join(path, "cgroup.procs"))
        return tasks
    if a.memory_limit:
        path = f"/sys/fs/cgroup/memory/{name}"
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "memory.limit_in_bytes"), "w").write(str(size_bytes(a.memory_limit)))
        tasks.append(os.path.join(path, "tasks"))
    if a.cpu_quota:
        path = f"/sys/fs/cgroup/cpu/{name}"
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "cpu.cfs_period_us"), "w").write(str(period))
        open(os.path.join(path, "cpu.cfs_quota_us"), "w").write(str(int(a.cpu_quota * period)))
        tasks.append(os.path.join(path, "tasks"))
    return tasks


def wrap(cmd, cg=None, cores=None, netns=None):
    """cmd, run inside its cgroups, on some cores and in a network namespace, as asked."""
    if cores is not None:
        cmd = ["taskset", "-c", cores] + cmd
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns] + cmd
    if cg:
        joins = " && ".join(f"echo $$ > {t}" for t in cg)
        cmd = ["sh", "-c", f'{joins} && exec "$@"', "sh"] + cmd
    return cmd


def make_netns(i, rate):
    ns, host, peer = f"titan-w{i}", f"veth-tb{i}", f"veth-tw{i}"
    sh(f"ip netns del {ns} 2>/dev/null || true; ip link del {host} 2>/dev/null || true")
    sh(f"ip netns add {ns} && ip link add {host} type veth peer name {peer} && ip link set {peer} netns {ns}")
    sh(f"ip addr add 10.77.{i}.1/24 dev {host} && ip link set {host} up")
    sh(f"ip netns exec {ns} sh -c 'ip addr add 10.77.{i}.2/24 dev {peer} && ip link set {peer} up && ip link set lo up'")
    for dev, pre in [(host, ""), (peer, f"ip netns exec {ns} ")]:
        if rate != "none":
            sh(f"{pre}tc qdisc add dev {dev} root tbf rate {rate} burst 64kb latency 50ms")
    return ns, f"10.77.{i}.2:7471"


def drop_netns(i):
    sh(f"ip netns del titan-w{i} 2>/dev/null || true; ip link del veth-tb{i} 2>/dev/null || true")


def start_worker(i, a, token, log_dir):
    netns, listen = (None, "127.0.0.1:0")
    if a.veth:
        netns, listen = make_netns(i, a.veth)
    cg = cgroup(f"titan-w{i}", a)
    cores = str(i % os.cpu_count()) if a.pin else None
    source = ["--shard", a.shards.split(",")[i]] if a.shards else ["-m", a.model]
    cmd = [TITAN, "worker", *source, "--token-file", token, "--listen", listen, "--threads", "1"] + shlex.split(a.worker_args)
    log = open(os.path.join(log_dir, f"worker{i}.log"), "w")
    p = subprocess.Popen(wrap(cmd, cg, cores, netns), stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline().strip()
    if not line.startswith("listening on "):
        sys.exit(f"worker {i} did not start: {line!r}; see {log.name}")
    return p, line[len("listening on "):]


def start_relay(target, delay_ms):
    """bench/delay_relay.py in front of `target`: its process and the address to reach `target` through."""
    relay = os.path.join(ROOT, "bench", "delay_relay.py")
    p = subprocess.Popen([sys.executable, relay, "127.0.0.1:0", target, str(delay_ms)], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if not line.startswith("listening on "):
        sys.exit(f"the relay to {target} did not start: {line!r}")
    return p, line[len("listening on "):]


REPORT = re.compile(r"^\s+(\S+): (\d+) round trips, (\d+) experts, (\d+) rows, (\d+) B out, (\d+) B in, ([\d.]+) ms per exchange "
                    r"\(ping ([\d.]+) ms, waited ([\d.]+) ms\), (\d+) failovers")


def bench(a, extra, cg):
    cmd = [TITAN, "bench", "-m", a.model, "-t", str(a.threads), "-p", str(a.prompt), "-n", str(a.gen), "-r", "1", "--json"] + extra
    p = subprocess.run(wrap(cmd, cg), capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    nodes = [REPORT.match(l) for l in p.stderr.splitlines()]
    return json.loads(p.stdout.strip().splitlines()[-1]), [m.groups() for m in nodes if m]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--veth")
    ap.add_argument("--delay-ms", type=float, default=0.1)
    ap.add_argument("--memory-limit")
    ap.add_argument("--cpu-quota", type=float)
    ap.add_argument("--project", action="store_true")
    ap.add_argument("--single-args", default="")
    ap.add_argument("--backbone-args", default="")
    ap.add_argument("--worker-args", default="")
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--relay-delay-ms", type=float)
    ap.add_argument("--spec-rate")
    ap.add_argument("--draft-min", type=int, default=4)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("--shards", help="comma-separated shards (titan slice), one per worker, served instead of the whole model")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="titan-cluster-bench-")
    token = os.path.join(tmp, "node.token")
    with open(token, "w") as f:
        f.write(os.urandom(16).hex())
    if a.cpu_quota:
        # A quota charges a spinning thread as working: polling would only burn it.
        os.environ["TITAN_POLL"] = "0"
    single_cg = cgroup("titan-single", a)
    backbone_cg = cgroup("titan-backbone", a)
    workers = []
    try:
        workers = [start_worker(i, a, token, tmp) for i in range(a.workers)]
        nodes = ",".join(addr for _, addr in workers)
        if a.relay_delay_ms is not None:
            relays = [start_relay(addr, a.relay_delay_ms) for _, addr in workers]
            workers += [(p, None) for p, _ in relays]
            nodes = ",".join(addr for _, addr in relays)
        cluster_args = ["--nodes", nodes, "--token-file", token] + shlex.split(a.backbone_args)
        if a.warmup:
            warm = [TITAN, "run", "-m", a.model, "-t", str(a.threads), "-p", "Hello", "-n", str(a.warmup), "--temp", "0"] + cluster_args
            subprocess.run(wrap(warm, backbone_cg), capture_output=True, check=True)
        single, cluster = [], []
        if a.spec_rate:
            spec = ["--spec-rate", a.spec_rate, "--draft-min", str(a.draft_min), "--draft-max", str(a.draft_max)]
            for r in range(a.rounds):
                single.append(bench(a, shlex.split(a.single_args) + spec, single_cg))
                cluster.append(bench(a, cluster_args + spec, backbone_cg))
            report_speculative(a, single, cluster)
            return
        for r in range(a.rounds):
            single.append(bench(a, shlex.split(a.single_args), single_cg))
            cluster.append(bench(a, cluster_args, backbone_cg))
            print(f"round {r + 1}: single pp {single[-1][0]['prompt_tok_s']:.2f} tg {single[-1][0]['decode_tok_s']:.2f} | "
                  f"cluster pp {cluster[-1][0]['prompt_tok_s']:.2f} tg {cluster[-1][0]['decode_tok_s']:.2f} tok/s", flush=True)
        run = [TITAN, "run", "-m", a.model, "-t", str(a.threads), "-p", "Hello", "-n", str(a.gen), "--temp", "0"] + cluster_args
        p = subprocess.run(wrap(run, backbone_cg), capture_output=True, text=True, check=True)
        g = [m.groups() for m in map(REPORT.match, p.stderr.splitlines()) if m]
        net = (sum(int(x[1]) for x in g), sum(int(x[4]) for x in g), sum(int(x[5]) for x in g),
               statistics.median(float(x[6]) for x in g), statistics.median(float(x[7]) for x in g),
               max(int(x[1]) for x in g))
    finally:
        for p, _ in workers:
            p.kill()
            p.wait()
        if a.veth:
            for i in range(a.workers):
                drop_netns(i)

    med = lambda runs, k: statistics.median(r[0][k] for r in runs)
    print(f"\nmodel {os.path.basename(a.model)}, {a.workers} workers, threads {a.threads}, prompt {a.prompt}, decode {a.gen}, "
          f"{a.rounds} rounds{', pinned' if a.pin else ''}{', veth ' + a.veth if a.veth else ', loopback'}"
          f"{', cgroups of ' + a.memory_limit if a.memory_limit else ''}"
          f"{f', {a.cpu_quota} cores each (CFS quota), polling off' if a.cpu_quota else ''}")
    for k, name in [("prompt_tok_s", "prompt"), ("decode_tok_s", "decode")]:
        s, c = med(single, k), med(cluster, k)
        print(f"{name:7} single {s:8.2f} tok/s   cluster {c:8.2f} tok/s   cluster/single {c / s:.2f}x")
    # Network counters per decoded token: a greedy run from a one-word prompt, whose report counts every exchange.
    trips, out_b, in_b, exch, ping, most = net
    print(f"network per generated token ({a.gen} tokens from a 1-word prompt): {trips / a.gen:.1f} round trips, "
          f"{out_b / a.gen / 1024:.1f} KiB sent and {in_b / a.gen / 1024:.1f} KiB received; median exchange "
          f"{exch:.3f} ms against a {ping:.3f} ms empty round trip")
    if a.project:
        project(a, single, cluster, net)
    if a.veth:
        tg = med(cluster, "decode_tok_s")
        info = subprocess.run([TITAN, "inspect", a.model], capture_output=True, text=True, check=True).stdout
        layers = int(re.search(r"^layers:\s+(\d+)", info, re.M).group(1))
        added = layers * 2 * a.delay_ms / 1e3
        print(f"predicted with {a.delay_ms} ms one-way delay: {1 / (1 / tg + added):.2f} tok/s "
              f"(+{added * 1e3:.2f} ms per token: {layers} layers, each one exchange in parallel across the nodes)")


def report_speculative(a, single, cluster):
    """Per rate: decode and its ratio to plain decode in the same invocation, single node and cluster."""
    print(f"\nmodel {os.path.basename(a.model)}, {a.workers} workers, threads {a.threads}, decode {a.gen} after a "
          f"{a.prompt}-token prompt, {a.draft_min}..={a.draft_max} drafts a step, {a.rounds} rounds"
          f"{f', {a.relay_delay_ms} ms each way to each worker (relay)' if a.relay_delay_ms is not None else ''}"
          f"{f', {a.cpu_quota} cores each (CFS quota), polling off' if a.cpu_quota else ''}")
    print(f"{'drafts right':>12}  {'single tok/s':>12} {'× plain':>8} {'tok/step':>8}  {'cluster tok/s':>13} {'× plain':>8} "
          f"{'tok/step':>8}  {'cluster/single':>14}")
    rows = lambda runs, i: [r[0]["speculative"][i] for r in runs]
    for i, row in enumerate(single[0][0]["speculative"]):
        cells = []
        for runs in (single, cluster):
            rs = rows(runs, i)
            tok_s = statistics.median(r["decode_tok_s"] for r in rs)
            cells.append((tok_s, statistics.median(r["speedup"] for r in rs), sum(r["tokens"] for r in rs) / max(1, sum(r["steps"] for r in rs))))
        rate = "plain" if row["rate"] is None else f"{row['rate']:.2f}"
        print(f"{rate:>12}  {cells[0][0]:12.2f} {cells[0][1]:7.2f}x {cells[0][2]:8.2f}  {cells[1][0]:13.2f} {cells[1][1]:7.2f}x "
              f"{cells[1][2]:8.2f}  {cells[1][0] / cells[0][0]:13.2f}x")


LINKS = [("1 GbE", 0.2e-3, 125e6), ("Wi-Fi, 300 Mbit/s", 2e-3, 37.5e6)]


def project(a, single, cluster, net):
    """The calibrated projection of decode for real machines (the module's docstring has the formula)."""
    trips, out_b, in_b, _, ping, most = net
    t1 = 1 / statistics.median(r[0]["decode_tok_s"] for r in single)
    shares = single[-1][0]["decode_phase_share"]
    serial = shares["attention"] + shares["router"]
    parallel = shares["projections"] + shares["experts"] + shares["head"]
    # Every node takes part in each sequential exchange at most once: the busiest node's count is theirs.
    rounds = most / (a.gen + 1)
    n = a.workers
    sent, received = out_b / (a.gen + 1), in_b / (a.gen + 1)
    measured = 1 / statistics.median(r[0]["decode_tok_s"] for r in cluster)
    model = t1 * (serial + parallel / (n + 1)) + rounds * ping / 1e3
    # What the formula leaves out here (encoding, copies, the harness's scheduling) per exchange, carried over.
    overhead = max(0.0, (measured - model) / rounds)
    print(f"\nprojection, from the single node's decode ({1 / t1:.2f} tok/s: serial {serial:.0%}, parallel "
          f"{parallel:.0%} of its time) and the cluster's {rounds:.1f} sequential exchanges and "
          f"{(sent + received) / 1024:.0f} KiB per token:")
    print(f"  loopback, {n} workers: the formula {1 / model:.2f} tok/s, measured {1 / measured:.2f} tok/s; the "
          f"{overhead * 1e3:.3f} ms per exchange between them is carried into the projection")
    print(f"  {'workers':>7}  " + "  ".join(f"{name:>22}" for name, _, _ in LINKS) + "   (decode tok/s, × one node)")
    for w in range(1, 9):
        # Bytes scale with the share computed remotely (answers) and with the node count (inputs).
        b = received * (w / (w + 1)) / (n / (n + 1)) + sent * w / n
        cells = []
        for _, rtt, bw in LINKS:
            t = t1 * (serial + parallel / (w + 1)) + rounds * (rtt + overhead) + b / bw
            cells.append(f"{1 / t:10.2f} ({t1 / t:4.2f}×)")
        print(f"  {w:>7}  " + "  ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
