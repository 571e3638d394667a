#!/usr/bin/env python3
"""Side-by-side benchmark: TITAN (`titan bench`) against llama.cpp (`llama-bench`) on the same GGUF.

Usage:
    python3 bench/compare.py MODEL.gguf [MODEL2.gguf ...] --threads 2 --prompt 64 --gen 32 --rounds 5 \
        [--markdown OUT.md] [--json OUT.json] [--no-mmap] [--membw GBPS|auto]

For every model the two engines run alternately, one repetition each per round (TITAN, llama.cpp, TITAN,
llama.cpp, ...), so a drift in machine load hits both. Each run is a fresh process: the prompt test is one batch of
`--prompt` tokens, the decode test `--gen` tokens decoded one at a time from an empty context (llama-bench's pp/tg).
The table gives the median and min-max over rounds of each engine, and the ratio TITAN / llama.cpp of the medians
(> 1 means TITAN is faster; for peak RSS, < 1 means TITAN uses less memory).

Peak RSS of both engines is measured the same way, from outside: each run is wrapped in GNU `/usr/bin/time -f %M`
(the process's ru_maxrss). Without a usable /usr/bin/time, the child's ru_maxrss from wait4(2) is used instead; it
is the same counter, but Linux carries the forking Python's high-water mark into it, so it cannot read below this
script's own RSS (~15-20 MiB; irrelevant for real models, visible on tiny fixtures). The report says which.

Standard library only, so it runs on a fresh machine. Builds TITAN (`cargo build --release -p titan-cli`) and
llama.cpp (`bench/build_llama_cpp.sh`) when needed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TITAN = ROOT / "target" / "release" / "titan"
DEFAULT_LLAMA_BENCH = ROOT / "build" / "llama.cpp" / "bin" / "llama-bench"
BUILD_LLAMA = ROOT / "bench" / "build_llama_cpp.sh"
MEMBW = ROOT / "bench" / "membw.py"


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# running a child and measuring its peak RSS
# ------------------------------------------------------------------------------------------------


class RunResult:
    def __init__(self, argv, rc, stdout, stderr, wall_s, maxrss_bytes, timed_out):
        self.argv = argv
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.wall_s = wall_s
        self.maxrss_bytes = maxrss_bytes
        self.timed_out = timed_out


GNU_TIME = "/usr/bin/time"


def rss_method() -> str:
    """How peak RSS is measured: GNU time's %M when it works, else wait4(2)'s rusage of our own child."""
    if os.access(GNU_TIME, os.X_OK):
        with tempfile.NamedTemporaryFile("r") as f:
            r = subprocess.run([GNU_TIME, "-f", "%M", "-o", f.name, "true"], capture_output=True)
            if r.returncode == 0 and f.read().strip().isdigit():
                return "time"
    return "wait4"


RSS_METHOD_TEXT = {
    "time": "peak RSS = /usr/bin/time -f %M of each engine's process (ru_maxrss)",
    "wait4": "peak RSS = ru_maxrss from wait4(2) of each engine's process (no usable /usr/bin/time; values "
             "below this Python's own RSS, ~15-20 MiB, read as that floor)",
}


def run_measured(argv: list[str], timeout: float, method: str) -> RunResult:
    """Run argv to completion; return its output and its peak RSS (ru_maxrss).

    method "time": wrapped in GNU time (-f %M -o FILE), which forks from a ~2 MiB process, so the number is the
    engine's own. method "wait4": our own child's rusage; Linux carries the pre-exec (forked Python) high-water mark
    into ru_maxrss, so small values are floored at this script's RSS (irrelevant for real models)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r", suffix=".rss") as rssf:
        full = [GNU_TIME, "-f", "%M", "-o", rssf.name, *argv] if method == "time" else argv
        t0 = time.monotonic()
        p = subprocess.Popen(full, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            while True:
                try:
                    _, status, ru = os.wait4(p.pid, 0)
                    break
                except InterruptedError:
                    continue
        finally:
            timer.cancel()
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)  # tell Popen the child is reaped
        out.seek(0)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
        maxrss = None
        if method == "time":
            # GNU time writes "Command exited with non-zero status N" before the number when the child fails
            lines = [l for l in rssf.read().splitlines() if l.strip()]
            if lines and lines[-1].strip().isdigit():
                maxrss = int(lines[-1]) * 1024
        else:
            maxrss = ru.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        return RunResult(argv, p.returncode, out.read().decode(errors="replace"), stderr, wall, maxrss,
                         timed_out.is_set())


def capture(argv: list[str], cwd: Path | None = None) -> str:
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# ------------------------------------------------------------------------------------------------
# the two engines
# ------------------------------------------------------------------------------------------------


def titan_argv(titan: Path, model: Path, a) -> list[str]:
    return [str(titan), "bench", "-m", str(model), "-p", str(a.prompt), "-n", str(a.gen), "-r", "1",
            "--threads", str(a.threads), "--json"]


def parse_titan(r: RunResult) -> dict:
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    if not lines:
        raise ValueError("titan bench printed nothing on stdout")
    j = json.loads(lines[-1])
    for k in ("prompt_tok_s", "decode_tok_s"):
        if k not in j:
            raise ValueError(f"titan bench JSON lacks {k!r}")
    return {
        "pp": float(j["prompt_tok_s"]) if _enabled(j, "n_prompt") else None,
        "tg": float(j["decode_tok_s"]) if _enabled(j, "n_gen") else None,
        "self_peak_rss_bytes": j.get("peak_rss_bytes"),
        "decode_bytes_per_token": j.get("decode_bytes_per_token"),
        "decode_phase_share": j.get("decode_phase_share"),
        "threads": j.get("threads"),
        "raw": j,
    }


def _enabled(j: dict, key: str) -> bool:
    return j.get(key, 1) != 0


def llama_supports(llama_bench: Path) -> dict:
    """Which options this llama-bench build takes (the no-mmap flag changed names over time)."""
    h = capture([str(llama_bench), "--help"])
    caps = {"help": h}
    if re.search(r"(^|\s)-mmp\b|--mmap\b", h):
        caps["no_mmap"] = ["-mmp", "0"]
    elif re.search(r"(^|\s)-lm\b|--load-mode\b", h):
        caps["no_mmap"] = ["-lm", "none"]
    else:
        caps["no_mmap"] = None
    return caps


def llama_argv(llama_bench: Path, model: Path, a, caps: dict) -> list[str]:
    argv = [str(llama_bench), "-m", str(model), "-p", str(a.prompt), "-n", str(a.gen), "-t", str(a.threads),
            "-r", "1", "-o", "json"]
    if a.no_mmap:
        if not caps.get("no_mmap"):
            raise SystemExit("this llama-bench has no option to turn mmap off (see llama-bench --help)")
        argv += caps["no_mmap"]
    return argv + list(a.llama_arg)


def parse_llama(r: RunResult, a) -> dict:
    s = r.stdout
    start = s.find("[")
    if start < 0:
        raise ValueError("llama-bench printed no JSON array")
    entries = json.loads(s[start:s.rfind("]") + 1])
    pp = tg = None
    for e in entries:
        if e.get("n_prompt", 0) > 0 and e.get("n_gen", 0) == 0:
            pp = float(e["avg_ts"])
        elif e.get("n_gen", 0) > 0 and e.get("n_prompt", 0) == 0:
            tg = float(e["avg_ts"])
    if (a.prompt > 0 and pp is None) or (a.gen > 0 and tg is None):
        raise ValueError("llama-bench JSON lacks the pp or tg entry")
    e0 = entries[0] if entries else {}
    return {
        "pp": pp,
        "tg": tg,
        "build_commit": e0.get("build_commit"),
        "build_number": e0.get("build_number"),
        "cpu_info": e0.get("cpu_info"),
        "backends": e0.get("backends"),
        "threads": e0.get("n_threads"),
        "model_type": e0.get("model_type"),
        "raw": entries,
    }


# ------------------------------------------------------------------------------------------------
# builds, versions, machine
# ------------------------------------------------------------------------------------------------


def ensure_titan(a) -> Path:
    titan = Path(a.titan) if a.titan else DEFAULT_TITAN
    if a.titan:
        if not titan.exists():
            raise SystemExit(f"--titan {titan} does not exist")
        return titan
    if not a.no_build or not titan.exists():
        cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
        log("building TITAN: cargo build --release -p titan-cli")
        rc = subprocess.run([cargo, "build", "--release", "-p", "titan-cli"], cwd=ROOT).returncode
        if rc != 0 or not titan.exists():
            raise SystemExit("cargo build --release -p titan-cli failed")
    return titan


def ensure_llama(a) -> Path:
    lb = Path(a.llama_bench) if a.llama_bench else DEFAULT_LLAMA_BENCH
    if a.llama_bench:
        if not lb.exists():
            raise SystemExit(f"--llama-bench {lb} does not exist")
        return lb
    if not lb.exists():
        log(f"llama-bench missing, running {BUILD_LLAMA.relative_to(ROOT)} (about 5 minutes on 2 cores)")
        rc = subprocess.run(["bash", str(BUILD_LLAMA)], cwd=ROOT, stdout=sys.stderr).returncode
        if rc != 0 or not lb.exists():
            raise SystemExit("building llama.cpp failed")
    return lb


def titan_version(titan: Path) -> str:
    v = capture([str(titan), "--version"]) or "titan (unknown version)"
    commit = capture(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT)
    if commit:
        dirty = capture(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT)
        v += f", git {commit}{' (+ uncommitted changes)' if dirty else ''}"
    return v


def llama_version(lb: Path) -> str:
    v = capture([str(lb), "--version"])
    # llama-bench has no --version in some builds; then its JSON's build fields are used (see report()).
    first = v.splitlines()[0] if v else ""
    src = lb.parent.parent / "SOURCE.txt"
    extra = ""
    if src.exists():
        kv = dict(l.split("=", 1) for l in src.read_text().splitlines() if "=" in l)
        if kv.get("llama_cpp_python_sdist"):
            extra = f"from llama-cpp-python {kv['llama_cpp_python_sdist']} sdist"
            if kv.get("commit"):
                extra += f", commit {kv['commit'][:12]} of {kv.get('commit_date', '?')}"
    return "; ".join(x for x in (first if "version" in first.lower() else "", extra) if x)


def machine() -> dict:
    cpu = "unknown"
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        cpu = platform.processor() or "unknown"
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile", "asimd",
                         "asimddp", "sve") if f in flags]
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "memory": mem,
        "simd": " ".join(simd),
        "kernel": platform.release(),
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "load_at_start": loadavg(),
    }


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def measure_membw(a) -> float | None:
    """The bandwidth given with --membw, or (auto) one probe by bench/membw.py now."""
    if a.membw is None:
        return None
    if a.membw != "auto":
        return float(a.membw)
    log("measuring memory bandwidth with bench/membw.py")
    r = subprocess.run([sys.executable, str(MEMBW), "--threads", str(a.threads), "--json"], cwd=ROOT,
                       capture_output=True, text=True)
    if r.returncode != 0:
        log(f"membw.py failed: {r.stderr.strip()[-500:]}")
        return None
    return float(json.loads(r.stdout.strip().splitlines()[-1])["read_gb_s"])


# ------------------------------------------------------------------------------------------------
# statistics and tables
# ------------------------------------------------------------------------------------------------


def summary(xs: list[float]) -> dict | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt_rate(s: dict | None) -> str:
    if s is None:
        return "n/a"
    if s["n"] == 1:
        return f"{s['median']:.2f}"
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def human_bytes(b: float | None) -> str:
    if b is None:
        return "n/a"
    for unit, d in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= d:
            return f"{b / d:.2f} {unit}"
    return f"{b:.0f} B"


def fmt_rss(s: dict | None) -> str:
    if s is None:
        return "n/a"
    if s["n"] == 1 or s["max"] - s["min"] < 0.005 * s["max"]:
        return human_bytes(s["median"])
    return f"{human_bytes(s['median'])} ({human_bytes(s['min'])}–{human_bytes(s['max'])})"


def ratio(t: dict | None, l: dict | None) -> str:
    if t is None or l is None or not l["median"]:
        return "n/a"
    return f"{t['median'] / l['median']:.2f}×"


def model_rows(m: dict, a) -> list[tuple[str, str, str, str]]:
    """(metric, TITAN, llama.cpp, ratio) rows of one model."""
    t, l = m["titan"], m["llama"]
    rows = []
    if a.prompt > 0:
        rows.append((f"prompt pp{a.prompt} (tok/s)", fmt_rate(t["pp"]), fmt_rate(l["pp"]), ratio(t["pp"], l["pp"])))
    if a.gen > 0:
        rows.append((f"decode tg{a.gen} (tok/s)", fmt_rate(t["tg"]), fmt_rate(l["tg"]), ratio(t["tg"], l["tg"])))
    rows.append(("peak RSS", fmt_rss(t["rss"]), fmt_rss(l["rss"]), ratio(t["rss"], l["rss"])))
    bpt = m.get("decode_bytes_per_token")
    if a.gen > 0 and bpt:
        rows.append(("weight bytes / decoded token", human_bytes(bpt), "", ""))
        bw = m["membw"]["median"] if m.get("membw") else m.get("membw_gb_s")
        if bw:
            floor = bw * 1e9 / bpt
            pct = lambda s: f"{100 * s['median'] / floor:.0f}% of floor" if s else "n/a"
            rows.append((f"decode floor {floor:.1f} tok/s ({bw:.1f} GB/s)", pct(t["tg"]), pct(l["tg"]), ""))
            if m.get("membw") and m["membw"]["n"] > 1:
                lo, hi = (m["membw"][k] * 1e9 / bpt for k in ("min", "max"))
                span = lambda s: f"{100 * s['median'] / hi:.0f}–{100 * s['median'] / lo:.0f}%" if s else "n/a"
                rows.append((f"  with the rounds' {m['membw']['min']:.1f}–{m['membw']['max']:.1f} GB/s",
                             span(t["tg"]), span(l["tg"]), ""))
    return rows


def table_text(rows, header=("", "TITAN", "llama.cpp", "TITAN / llama.cpp")) -> str:
    all_rows = [header] + rows
    w = [max(len(r[i]) for r in all_rows) for i in range(4)]
    line = lambda r: "  ".join(r[i].ljust(w[i]) if i == 0 else r[i].rjust(w[i]) for i in range(4)).rstrip()
    return "\n".join([line(header), "  ".join("-" * x for x in w)] + [line(r) for r in rows])


def report(results: list[dict], a, info: dict, markdown: bool) -> str:
    out = []
    mach = info["machine"]
    mach_line = (f"{mach['cpu']}, {mach['usable_cpus']} usable of {mach['logical_cpus']} logical CPUs, "
                 f"{mach['memory']} RAM, SIMD: {mach['simd'] or 'none detected'}, Linux {mach['kernel']}, "
                 f"load average {mach['load_at_start']} at start, {mach.get('load_at_end', '?')} at end")
    llama_v = info["llama_version"]
    builds = {(r["llama"].get("build_commit"), r["llama"].get("build_number")) for r in results}
    builds = [b for b in builds if b[0]]
    if builds:
        llama_v += "; llama-bench reports " + ", ".join(f"build_commit {c}, build_number {n}" for c, n in builds)
    mmap = "off (" + " ".join(info["no_mmap_flag"] or []) + ")" if a.no_mmap else "on (llama-bench default)"
    settings = (f"{a.threads} threads, prompt {a.prompt} tokens, decode {a.gen} tokens, {a.rounds} rounds "
                f"alternating TITAN / llama.cpp, llama.cpp mmap {mmap}")
    if markdown:
        out.append(f"**Date:** {mach['date']}  ")
        out.append(f"**Machine:** {mach_line}  ")
        out.append(f"**TITAN:** {info['titan_version']}  ")
        out.append(f"**llama.cpp:** {llama_v}  ")
        out.append(f"**Settings:** {settings}; medians (min–max) over rounds; ratio = TITAN / llama.cpp of the "
                   "medians (tok/s: > 1 is TITAN faster; RSS: < 1 is TITAN smaller); "
                   + RSS_METHOD_TEXT[a.rss_method] + ".  ")
        if info.get("membw_gb_s"):
            out.append(f"**Memory read bandwidth:** {info['membw_gb_s']:.1f} GB/s ({info.get('membw_source')}); "
                       "decode floor = bandwidth / weight bytes read per token (as counted by TITAN).  ")
        elif info.get("membw_source"):
            out.append(f"**Memory read bandwidth:** {info['membw_source']}; decode floor = the median of a model's "
                       "probes / weight bytes read per token (as counted by TITAN), and the range its probes give.  ")
        out.append("")
        out.append("| model | metric | TITAN | llama.cpp | TITAN / llama.cpp |")
        out.append("|---|---|---:|---:|---:|")
        for m in results:
            name = f"`{Path(m['model']).parent.name}/{Path(m['model']).name}`"
            for i, r in enumerate(model_rows(m, a)):
                out.append(f"| {name if i == 0 else ''} | {r[0]} | {r[1]} | {r[2]} | {r[3]} |")
        errs = [(m["model"], e) for m in results for e in m["errors"]]
        if errs:
            out.append("")
            for model, e in errs:
                out.append(f"- `{Path(model).name}`: {e}")
        out.append("")
        out.append("Commands (one repetition per round, per model):")
        out.append("")
        out.append("```")
        out.append(info["invocation"])
        for m in results:
            out.append(m["titan_cmd"])
            out.append(m["llama_cmd"])
        out.append("```")
    else:
        out.append(f"date:      {mach['date']}")
        out.append(f"machine:   {mach_line}")
        out.append(f"TITAN:     {info['titan_version']}")
        out.append(f"llama.cpp: {llama_v}")
        out.append(f"settings:  {settings}")
        out.append("           medians (min–max) over rounds; ratio = TITAN / llama.cpp of the medians "
                   "(tok/s: >1 = TITAN faster; RSS: <1 = TITAN smaller)")
        out.append("           " + RSS_METHOD_TEXT[a.rss_method])
        if info.get("membw_gb_s"):
            out.append(f"membw:     {info['membw_gb_s']:.1f} GB/s read ({info.get('membw_source')})")
        elif info.get("membw_source"):
            out.append(f"membw:     {info['membw_source']}")
        for m in results:
            out.append("")
            size = Path(m["model"]).stat().st_size if Path(m["model"]).exists() else None
            out.append(f"== {m['model']} ({human_bytes(size)}"
                       + (f", {m['llama'].get('model_type')}" if m["llama"].get("model_type") else "") + ")")
            out.append(table_text(model_rows(m, a)))
            if m.get("phases"):
                out.append("TITAN decode phases: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in m["phases"].items()))
            for e in m["errors"]:
                out.append(f"ERROR: {e}")
            out.append(f"  $ {m['titan_cmd']}")
            out.append(f"  $ {m['llama_cmd']}")
        out.append("")
        out.append(f"invocation: {info['invocation']}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------


def bench_model(model: Path, titan: Path, lb: Path, caps: dict, a) -> dict:
    t_argv = titan_argv(titan, model, a)
    l_argv = llama_argv(lb, model, a, caps)
    m = {"model": str(model), "titan_cmd": shlex.join(t_argv), "llama_cmd": shlex.join(l_argv), "errors": [],
         "rounds": []}
    engines = [("titan", t_argv, parse_titan), ("llama", l_argv, lambda r: parse_llama(r, a))]
    failed = set()
    for rnd in range(a.rounds):
        row = {}
        # With --membw auto, the bandwidth is probed in every round, between the engines' runs: on a shared
        # machine it drifts by a third within minutes, and a probe taken once before all rounds can be
        # divided into every round's speeds while matching none of them.
        if a.membw == "auto":
            row["membw_gb_s"] = measure_membw(a)
        for name, argv, parse in engines:
            if name in failed:
                continue
            r = run_measured(argv, a.timeout, a.rss_method)
            rec = {"rc": r.rc, "wall_s": r.wall_s, "maxrss_bytes": r.maxrss_bytes}
            try:
                if r.timed_out:
                    raise ValueError(f"timed out after {a.timeout:.0f} s")
                if r.rc != 0:
                    raise ValueError(f"exit status {r.rc}: {r.stderr.strip()[-800:] or r.stdout.strip()[-800:]}")
                rec.update(parse(r))
            except (ValueError, KeyError, json.JSONDecodeError) as e:
                msg = f"{'TITAN' if name == 'titan' else 'llama.cpp'} failed in round {rnd + 1}: {e}"
                log(msg)
                m["errors"].append(msg)
                failed.add(name)  # do not waste the other rounds on a run that cannot succeed
                rec["error"] = str(e)
            row[name] = rec
            if "error" not in rec:
                log(f"{model.name} round {rnd + 1}/{a.rounds} {name:5s}: pp {fmt_opt(rec.get('pp'))} tok/s, "
                    f"tg {fmt_opt(rec.get('tg'))} tok/s, peak RSS {human_bytes(r.maxrss_bytes)}, {r.wall_s:.1f} s")
        m["rounds"].append(row)
    for name in ("titan", "llama"):
        ok = [r[name] for r in m["rounds"] if name in r and "error" not in r[name]]
        m[name] = {
            "pp": summary([r.get("pp") for r in ok]),
            "tg": summary([r.get("tg") for r in ok]),
            "rss": summary([r["maxrss_bytes"] for r in ok if r["maxrss_bytes"]]),
        }
        if name == "llama" and ok:
            for k in ("build_commit", "build_number", "cpu_info", "backends", "model_type"):
                m["llama"][k] = ok[0].get(k)
    if a.membw == "auto":
        m["membw"] = summary([r.get("membw_gb_s") for r in m["rounds"]])
    tok = [r["titan"] for r in m["rounds"] if "titan" in r and "error" not in r["titan"]]
    if tok:
        bpts = [r["decode_bytes_per_token"] for r in tok if r.get("decode_bytes_per_token")]
        m["decode_bytes_per_token"] = statistics.median(bpts) if bpts else None
        m["phases"] = tok[-1].get("decode_phase_share")
        m["titan_self_peak_rss_bytes"] = max((r.get("self_peak_rss_bytes") or 0) for r in tok)
    return m


def fmt_opt(x):
    return "n/a" if x is None else f"{x:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", type=Path, help="GGUF files")
    p.add_argument("--threads", "-t", type=int, default=2)
    p.add_argument("--prompt", "-p", type=int, default=64, help="prompt tokens, processed as one batch")
    p.add_argument("--gen", "-n", type=int, default=32, help="tokens decoded one at a time")
    p.add_argument("--rounds", "-r", type=int, default=5, help="alternating rounds (one run of each engine each)")
    p.add_argument("--markdown", type=Path, help="also write the table as Markdown to this file")
    p.add_argument("--json", type=Path, help="write every round's raw numbers as JSON to this file")
    p.add_argument("--no-mmap", action="store_true",
                   help="run llama-bench with mmap off (-mmp 0, or -lm none in newer builds)")
    p.add_argument("--membw", metavar="GBPS|auto",
                   help="memory read bandwidth in GB/s, or 'auto' to probe it with bench/membw.py in every round: adds the decode floor")
    p.add_argument("--titan", help="titan binary to use (default: build target/release/titan)")
    p.add_argument("--llama-bench", help="llama-bench binary to use (default: build build/llama.cpp/bin/llama-bench)")
    p.add_argument("--llama-arg", action="append", default=[], metavar="ARG",
                   help="extra argument passed to llama-bench (repeatable)")
    p.add_argument("--no-build", action="store_true", help="do not run cargo build when the titan binary exists")
    p.add_argument("--timeout", type=float, default=3600, help="seconds allowed per engine run")
    a = p.parse_args()
    if a.rounds < 1 or a.threads < 1 or a.prompt < 0 or a.gen < 0 or (a.prompt == 0 and a.gen == 0):
        p.error("need --rounds >= 1, --threads >= 1, and a positive --prompt or --gen")
    for m in a.models:
        if not m.is_file():
            p.error(f"{m}: no such file")

    a.rss_method = rss_method()
    titan = ensure_titan(a)
    lb = ensure_llama(a)
    caps = llama_supports(lb)
    info = {
        "machine": machine(),
        "titan_version": titan_version(titan),
        "llama_version": llama_version(lb),
        "no_mmap_flag": caps.get("no_mmap"),
        "invocation": shlex.join([sys.executable, *sys.argv]),
        "rss_method": a.rss_method,
        "titan": str(titan),
        "llama_bench": str(lb),
    }
    bw = None if a.membw == "auto" else measure_membw(a)
    if bw:
        info["membw_gb_s"] = bw
        info["membw_source"] = "given with --membw"
    elif a.membw == "auto":
        info["membw_source"] = "bench/membw.py, probed once per round between the engines' runs"

    load1 = float(info["machine"]["load_at_start"].split()[0]) if info["machine"]["load_at_start"] != "?" else 0.0
    if load1 > 0.5:
        log(f"warning: load average is {info['machine']['load_at_start']} before starting; other processes "
            "will slow both engines and widen the min-max ranges")
    results = []
    for model in a.models:
        m = bench_model(model.resolve(), titan, lb, caps, a)
        m["membw_gb_s"] = bw
        results.append(m)

    info["machine"]["load_at_end"] = loadavg()
    text = report(results, a, info, markdown=False)
    print(text, end="")
    if a.markdown:
        a.markdown.write_text(report(results, a, info, markdown=True))
        log(f"wrote {a.markdown}")
    if a.json:
        a.json.write_text(json.dumps({"info": info, "args": {k: str(v) for k, v in vars(a).items()},
                                      "results": results}, indent=1, default=str))
        log(f"wrote {a.json}")
    return 1 if any(m["errors"] for m in results) else 0


if __name__ == "__main__":
    sys.exit(main())
