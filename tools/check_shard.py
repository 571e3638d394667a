#!/usr/bin/env python3
"""Checks a TITAN shard with llama.cpp's own GGUF reader (gguf-py, the `gguf` package on PyPI):

    python3 tools/check_shard.py SHARD.gguf MODEL.gguf

The shard must parse, carry the model's metadata and the titan.shard.* keys, and hold exactly the expert tensors of
its layers (the matrices, and the bias rows where the model has them, as gpt-oss does), cut along the expert axis
(the outermost): each tensor's type and shape as the model's with only the expert count changed, and its bytes equal
to that slice of the model's tensor. Exits non-zero with the reason otherwise."""

import sys

import numpy as np
from gguf import GGUFReader


def field(r, key):
    f = r.fields.get(key)
    if f is None:
        sys.exit(f"{key} missing")
    return [f.parts[i] for i in f.data]


def main():
    shard, model = GGUFReader(sys.argv[1]), GGUFReader(sys.argv[2])
    l0, l1 = (int(v[0]) for v in field(shard, "titan.shard.layers"))
    e0, e1 = (int(v[0]) for v in field(shard, "titan.shard.experts"))
    digests = field(shard, "titan.shard.digests")
    arch = bytes(field(model, "general.architecture")[0]).decode()
    if bytes(field(shard, "general.architecture")[0]).decode() != arch:
        sys.exit("architecture differs from the model's")
    src = {t.name: t for t in model.tensors}
    parts = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    want = {f"blk.{l}.{p}.{k}" for l in range(l0, l1 + 1) for p in parts for k in ("weight", "bias")}
    want &= set(src)
    got = {t.name for t in shard.tensors}
    if got != want:
        sys.exit(f"tensors {sorted(got)} != {sorted(want)}")
    if len(digests) != (l1 - l0 + 1) * (e1 - e0 + 1):
        sys.exit(f"{len(digests)} digests")
    for t in shard.tensors:
        s = src[t.name]
        if t.tensor_type != s.tensor_type or list(t.shape[:-1]) != list(s.shape[:-1]) or int(t.shape[-1]) != e1 - e0 + 1:
            sys.exit(f"{t.name}: {t.tensor_type.name} {list(t.shape)} vs model {s.tensor_type.name} {list(s.shape)}")
        per = s.n_bytes // int(s.shape[-1])
        expect = np.asarray(s.data).reshape(-1).view(np.uint8)[e0 * per:(e1 + 1) * per]
        if not np.array_equal(np.asarray(t.data).reshape(-1).view(np.uint8), expect):
            sys.exit(f"{t.name}: bytes differ from experts {e0}-{e1} of the model")
    print(f"OK: {sys.argv[1]} holds layers {l0}-{l1} x experts {e0}-{e1} ({len(shard.tensors)} tensors), byte-equal to the model")


if __name__ == "__main__":
    main()
