#!/usr/bin/env python3
"""How often prompt-lookup drafts are right on trained weights: the demo model (models/demo, trained on
Shakespeare) continuing held-out passages, and an edit-style task (a passage, then the instruction-free start of the
same passage again, which a model that copies its context continues by copying).

    python3 bench/spec_acceptance.py [--model models/demo/demo-q8_0.gguf] [--drafts 4] [-n 128]

For each task and sampling (greedy; temperature 0.8 with seeds 1-3): `titan run --spec ngram --draft-min D
--draft-max D` (always D drafts where prompt lookup has them, so the figures do not depend on this machine's
timings), summed over the passages: drafts proposed, drafts kept, the share kept, tokens per step, and the share of
steps that had drafts at all.
"""

import argparse
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TITAN = os.environ.get("TITAN_BIN") or os.path.join(ROOT, "target", "release", "titan")
LINE = re.compile(r"generation: (\d+) tokens.*speculation: ([\d.]+) tokens per step, (\d+) of (\d+) drafts")


def passages(path, n, chars):
    """`n` passages of about `chars` characters from the held-out text, each starting at a speech."""
    text = open(path).read()
    starts = [m.start() for m in re.finditer(r"\n\n[A-Z][A-Z ]+\.\n", text)]
    step = max(1, len(starts) // n)
    return [text[s + 2:s + 2 + chars] for s in starts[::step][:n]]


def run(a, prompt, sampling):
    cmd = [TITAN, "run", "-m", a.model, "-p", prompt, "-n", str(a.n), "--threads", "2", "--spec", "ngram",
           "--draft-min", str(a.drafts), "--draft-max", str(a.drafts), "-c", "512"] + sampling
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = LINE.search(p.stderr)
    if not m:
        # No drafts at all: the whole generation was plain steps.
        tokens = int(re.search(r"generation: (\d+) tokens", p.stderr).group(1))
        return tokens, tokens, 0, 0
    tokens, per_step, kept, drafted = int(m.group(1)), float(m.group(2)), int(m.group(3)), int(m.group(4))
    return tokens, round(tokens / per_step), kept, drafted


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "demo", "demo-q8_0.gguf"))
    ap.add_argument("--heldout", default=os.path.join(ROOT, "models", "demo", "heldout.txt"))
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("-n", type=int, default=128)
    a = ap.parse_args()
    held = passages(a.heldout, 6, 300)
    tasks = {
        "held-out continuation": held,
        # The passage, a blank line, then its first line again: continuing means copying the rest.
        "edit (repeat a passage)": [p + "\n\n" + p.split("\n")[0] + "\n" for p in held],
    }
    samplings = {"greedy": [["--temp", "0"]], "temperature 0.8": [["--temp", "0.8", "--seed", str(s)] for s in (1, 2, 3)]}
    print(f"model {os.path.basename(a.model)}, {a.drafts} drafts a step where prompt lookup has them, {a.n} tokens, "
          f"{len(held)} passages")
    print(f"{'task':26} {'sampling':16} {'drafts kept':>14} {'share':>6} {'tokens/step':>11}")
    for task, prompts in tasks.items():
        for name, runs in samplings.items():
            tokens = steps = kept = drafted = 0
            for prompt in prompts:
                for sampling in runs:
                    t, s, k, d = run(a, prompt, sampling)
                    tokens, steps, kept, drafted = tokens + t, steps + s, kept + k, drafted + d
            print(f"{task:26} {name:16} {kept:>6} of {drafted:<5} {kept / max(1, drafted):6.2f} {tokens / max(1, steps):11.2f}")


if __name__ == "__main__":
    main()
