#!/usr/bin/env python3
"""Measure memory read bandwidth, the physical floor of batch-1 decode.

    python3 bench/membw.py [--threads 2] [--size-mib 2048] [--reps 7] [--json]

Compiles a tiny C reader (bench/membw.c, with the system C compiler, -O3 -march=native) into build/membw and runs
it: N threads each sum their share of a buffer much larger than the caches, best of --reps passes. Reading (not
copying) is what decode does: quantised weights stream from memory into the cores and nothing large is written.
Prints the best read bandwidth in GB/s (10^9 bytes/s); with --json the last line is {"read_gb_s": ...}.

Decode floor of a model = read bandwidth / weight bytes read per decoded token (`titan bench` reports the latter).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "bench" / "membw.c"
EXE = ROOT / "build" / "membw"


def build() -> Path:
    if EXE.exists() and EXE.stat().st_mtime >= SRC.stat().st_mtime:
        return EXE
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise SystemExit("membw.py needs a C compiler (cc, gcc or clang)")
    EXE.parent.mkdir(parents=True, exist_ok=True)
    flags = ["-O3", "-march=native"] if sys.platform != "darwin" else ["-O3", "-mcpu=native"]
    subprocess.run([cc, *flags, "-pthread", "-o", str(EXE), str(SRC)], check=True)
    return EXE


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--size-mib", type=int, default=2048, help="buffer size (well above the last-level cache)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    exe = build()
    r = subprocess.run([str(exe), str(a.threads), str(a.size_mib), str(a.reps)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        return r.returncode
    gbs = float(r.stdout.split()[0])
    print(f"memory read bandwidth: {gbs:.2f} GB/s ({a.threads} threads, {a.size_mib} MiB buffer, best of {a.reps})")
    if a.json:
        print(json.dumps({"read_gb_s": gbs, "threads": a.threads, "size_mib": a.size_mib, "reps": a.reps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
