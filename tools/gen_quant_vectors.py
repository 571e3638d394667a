#!/usr/bin/env python3
"""Generate the quantisation test vectors in tests/fixtures/quant/ (read by crates/kernels' tests).

For every tensor format gguf-py can dequantise, writes random blocks (fixed seed, scale fields set to
sane finite values; MXFP4's exponent bytes also at the edges of its conversion) as <TYPE>.bin and
gguf-py's dequantisation of them as <TYPE>.f32 (raw little-endian f32). For every activation format gguf-py can quantise (Q8_0), also writes a fixed f32 vector as
<TYPE>.quantize.f32 and gguf-py's quantisation of it as <TYPE>.quantize.bin.

Set up once and run from the repository root:
    python3 -m venv /work/venv-quant && /work/venv-quant/bin/pip install gguf numpy
    /work/venv-quant/bin/python tools/gen_quant_vectors.py
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant"
BLOCKS = 8
FLOAT_LEN = 64  # elements for the float formats, whose blocks are single elements
SEED = 20240611

# Byte offsets of each format's f16 scale fields (d, dmin / m) inside a block, from ggml-common.h.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


def random_blocks(rng: np.random.Generator, qtype: T) -> np.ndarray:
    block_len, block_bytes = GGML_QUANT_SIZES[qtype]
    n = max(BLOCKS * block_len, FLOAT_LEN)
    if qtype == T.F32:
        return rng.standard_normal(n).astype("<f4").view(np.uint8)
    if qtype == T.F16:
        values = rng.standard_normal(n).astype("<f2")
        values[:4] = [-0.0, 6e-8, -3e-5, 65504.0]  # signed zero, subnormals, the largest finite f16
        return values.view(np.uint8)
    if qtype == T.BF16:
        # Random finite bf16s: the top halves of random normal f32s.
        bits = rng.standard_normal(n).astype("<f4").view("<u4") >> 16
        return bits.astype("<u2").view(np.uint8)
    blocks = rng.integers(0, 256, size=(BLOCKS, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        # Magnitudes 1e-3 .. 1e-1 with random signs, like real scales (and negative ones, which ggml allows).
        mag = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), BLOCKS))
        val = (mag * rng.choice([-1.0, 1.0], BLOCKS)).astype("<f2")
        blocks[:, off:off + 2] = val.view(np.uint8).reshape(BLOCKS, 2)
    return blocks.reshape(-1)


def mxfp4_blocks(rng: np.random.Generator) -> np.ndarray:
    """Random MXFP4 blocks. The scale is an E8M0 exponent byte: the first four blocks take the edges of
    ggml's conversion (the subnormal halves 2^-128 and 2^-127 of e = 0 and 1, and e = 254 and 255, whose
    larger values overflow f32), the others sane scales 2^-10 .. 2^-4."""
    block_len, block_bytes = GGML_QUANT_SIZES[T.MXFP4]
    blocks = rng.integers(0, 256, size=(BLOCKS, block_bytes), dtype=np.uint8)
    blocks[:4, 0] = [0, 1, 254, 255]
    blocks[4:, 0] = rng.integers(118, 125, size=BLOCKS - 4)
    return blocks.reshape(-1)


def main() -> None:
    rng = np.random.default_rng(SEED)
    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    for qtype in [T.F32, T.F16, T.BF16, *F16_FIELDS]:
        raw = random_blocks(rng, qtype)
        values = dequantize(raw, qtype).astype("<f4").reshape(-1)
        (OUT / f"{qtype.name}.bin").write_bytes(raw.tobytes())
        (OUT / f"{qtype.name}.f32").write_bytes(values.tobytes())
        written.append(qtype.name)

    # Quantisation of activations: a fixed vector with a zero block, ties at .5 steps and outliers.
    x = rng.standard_normal(BLOCKS * 32).astype("<f4")
    x[32:64] = 0.0
    x[64:96] = (np.arange(32, dtype="<f4") - 16.0) * 0.5  # amax 8 -> d = 8/127, many near-ties
    x[100] = 40.0
    q = quantize(x, T.Q8_0)
    (OUT / "Q8_0.quantize.f32").write_bytes(x.tobytes())
    (OUT / "Q8_0.quantize.bin").write_bytes(np.asarray(q, dtype=np.uint8).tobytes())

    # MXFP4 last and from its own generator, so that adding it left every earlier file unchanged.
    raw = mxfp4_blocks(np.random.default_rng([SEED, int(T.MXFP4)]))
    with np.errstate(over="ignore"):  # 12 · 2^126 and 12 · 2^127 overflow to inf, as in ggml
        values = dequantize(raw, T.MXFP4).astype("<f4").reshape(-1)
    (OUT / "MXFP4.bin").write_bytes(raw.tobytes())
    (OUT / "MXFP4.f32").write_bytes(values.tobytes())
    written.append("MXFP4")

    print("wrote", ", ".join(written), "and Q8_0.quantize to", OUT)


if __name__ == "__main__":
    main()
