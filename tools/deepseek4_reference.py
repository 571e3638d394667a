#!/usr/bin/env python3
"""docs/deepseek4.md in plain numpy: the logits of a DeepSeek-V4 (`deepseek4`) GGUF with float weights, computed
step by step as that page describes (float64, one position at a time, no cache), compared with reference logits.

    python tools/deepseek4_reference.py F32.gguf TOKENS.json REF.npy [REF.npy ...]

TOKENS.json is a JSON list of token ids (or a fixture result.json, whose transformers sequence is used); each REF.npy
holds [tokens, vocab] logits (transformers' hf_logits.npy, llama.cpp's llama_f32.npy). It prints the largest
difference from each. It exists to check the page against both oracles and to give an engine something to compare
its intermediate values with; the oracles themselves stay transformers and llama.cpp.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LLAMA_CPP_SRC = Path(os.environ.get("LLAMA_CPP_SRC", ROOT / "build/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"))
sys.path.insert(0, str(LLAMA_CPP_SRC / "gguf-py"))

import gguf  # noqa: E402  (llama.cpp's gguf-py)


class Model:
    def __init__(self, path: Path):
        reader = gguf.GGUFReader(path)
        self.meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
        if self.meta["general.architecture"] != "deepseek4":
            sys.exit(f"{path}: architecture {self.meta['general.architecture']!r}, not deepseek4")
        self.w = {}
        for t in reader.tensors:
            if t.tensor_type.name not in ("F32", "I32"):
                sys.exit(f"{path}: tensor {t.name} is {t.tensor_type.name}; requantise the file to F32 first")
            self.w[t.name] = np.array(t.data, dtype=np.int64 if t.tensor_type.name == "I32" else np.float64)
        k = lambda name: self.meta["deepseek4." + name]  # noqa: E731
        self.n_layer, self.hidden, self.n_head = k("block_count"), k("embedding_length"), k("attention.head_count")
        self.head_dim, self.rope_dims = k("attention.key_length"), k("rope.dimension_count")
        self.eps = k("attention.layer_norm_rms_epsilon")
        self.hc, self.hc_eps = k("hyper_connection.count"), k("hyper_connection.epsilon")
        self.sinkhorn_iters = k("hyper_connection.sinkhorn_iterations")
        self.window, self.ratios = k("attention.sliding_window"), k("attention.compress_ratios")
        self.groups, self.o_rank = k("attention.output_group_count"), k("attention.output_lora_rank")
        self.idx_heads, self.idx_dim = k("attention.indexer.head_count"), k("attention.indexer.key_length")
        self.idx_top_k = k("attention.indexer.top_k")
        self.hash_layers, self.n_used = k("hash_layer_count"), k("expert_used_count")
        self.weights_norm, self.weights_scale = k("expert_weights_norm"), k("expert_weights_scale")
        self.clamp_exp, self.clamp_shexp = k("swiglu_clamp_exp"), k("swiglu_clamp_shexp")
        self.base_main, self.base_compress = k("rope.freq_base"), k("attention.compress_rope_freq_base")
        # YaRN, for the compressed layers only
        self.yarn = None
        if self.meta.get("deepseek4.rope.scaling.type") == "yarn":
            self.yarn = (k("rope.scaling.factor"), k("rope.scaling.original_context_length"),
                         k("rope.scaling.yarn_beta_fast"), k("rope.scaling.yarn_beta_slow"))

    # --- the steps, named as in docs/deepseek4.md

    def rms(self, x, weight=None):
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return y if weight is None else y * weight

    def angles(self, pos: int, compressed: bool) -> np.ndarray:
        r = self.rope_dims
        i = np.arange(r // 2)
        base = self.base_compress if compressed else self.base_main
        extrapolated = pos * base ** (-2.0 * i / r)
        if not compressed or self.yarn is None:
            return extrapolated
        factor, orig, beta_fast, beta_slow = self.yarn

        def corr_dim(n_rot):
            return r * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = max(0, math.floor(corr_dim(beta_fast))), min(r - 1, math.ceil(corr_dim(beta_slow)))
        ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
        # the attention factor cancels YaRN's magnitude scale: no mscale
        return extrapolated / factor * (1 - ramp) + extrapolated * ramp

    def rope(self, x, pos: int, compressed: bool, sign: float = 1.0):
        """Adjacent pairs of the last rope_dims values of each vector (the head is [nope | rope])."""
        theta = sign * self.angles(pos, compressed)
        cos, sin = np.cos(theta), np.sin(theta)
        r = self.rope_dims
        a, b = x[..., -r::2], x[..., -r + 1::2]
        y = x.copy()
        y[..., -r::2] = a * cos - b * sin
        y[..., -r + 1::2] = a * sin + b * cos
        return y

    def hc_pre(self, streams, site: str, il: int):
        """The hyper-connection's collapse weights, output placement and Sinkhorn-projected stream mixer."""
        hc, eps = self.hc, self.hc_eps
        fn, base, scale = (self.w[f"blk.{il}.hc_{site}_{n}.weight"] for n in ("fn", "base", "scale"))
        mix = self.rms(streams.reshape(-1)) @ fn.T
        pre = sigmoid(mix[:hc] * scale[0] + base[:hc]) + eps
        post = 2 * sigmoid(mix[hc:2 * hc] * scale[1] + base[hc:2 * hc])
        comb = (mix[2 * hc:] * scale[2] + base[2 * hc:]).reshape(hc, hc)  # [src, dst]
        comb = np.exp(comb - comb.max(axis=1, keepdims=True))
        comb = comb / comb.sum(axis=1, keepdims=True) + eps
        comb = comb / (comb.sum(axis=0, keepdims=True) + eps)
        for _ in range(self.sinkhorn_iters - 1):
            comb = comb / (comb.sum(axis=1, keepdims=True) + eps)
            comb = comb / (comb.sum(axis=0, keepdims=True) + eps)
        return pre @ streams, post, comb

    @staticmethod
    def hc_post(y, streams, post, comb):
        return post[:, None] * y[None, :] + comb.T @ streams

    def compress(self, u, prefix: str, ratio: int, width: int):
        """Entries of the complete windows: a per-channel softmax-weighted sum of the window's projections (at ratio
        4 also the previous window's first halves), normalised, RoPE at the window's first position."""
        kv = u @ self.w[prefix + "_kv.weight"].T
        score = u @ self.w[prefix + "_gate.weight"].T + self.w[prefix + "_ape.weight"][np.arange(len(u)) % ratio]
        entries = []
        for w in range(len(u) // ratio):
            cur = slice(w * ratio, (w + 1) * ratio)
            if ratio == 4:
                values, scores = kv[cur, width:], score[cur, width:]
                if w > 0:
                    prev = slice((w - 1) * ratio, w * ratio)
                    values = np.concatenate([kv[prev, :width], values])
                    scores = np.concatenate([score[prev, :width], scores])
            else:
                values, scores = kv[cur], score[cur]
            p = np.exp(scores - scores.max(axis=0))
            p /= p.sum(axis=0)
            entry = self.rms((p * values).sum(axis=0), self.w[prefix + "_norm.weight"])
            entries.append(self.rope(entry, w * ratio, True))
        return np.array(entries).reshape(-1, width)

    def attention(self, u, il: int):
        b, n, d = f"blk.{il}.", len(u), self.head_dim
        ratio = self.ratios[il]
        compressed = ratio != 0
        qr = self.rms(u @ self.w[b + "attn_q_a.weight"].T, self.w[b + "attn_q_a_norm.weight"])
        q = self.rms((qr @ self.w[b + "attn_q_b.weight"].T).reshape(n, self.n_head, d))
        kv = self.rms(u @ self.w[b + "attn_kv.weight"].T, self.w[b + "attn_kv_a_norm.weight"])
        q = np.array([self.rope(q[t], t, compressed) for t in range(n)])
        kv = np.array([self.rope(kv[t], t, compressed) for t in range(n)])
        entries, chosen = np.zeros((0, d)), [np.arange(0)] * n
        if compressed:
            entries = self.compress(u, b + "attn_compressor", ratio, d)
            chosen = [np.arange((t + 1) // ratio) for t in range(n)]
        if ratio == 4:
            keys = self.compress(u, b + "indexer_compressor", 4, self.idx_dim)
            q_idx = (qr @ self.w[b + "indexer.attn_q_b.weight"].T).reshape(n, self.idx_heads, self.idx_dim)
            weights = u @ self.w[b + "indexer.proj.weight"].T / math.sqrt(self.idx_dim * self.idx_heads)
            for t in range(n):
                visible = (t + 1) // 4
                scores = (weights[t][:, None] * np.maximum(self.rope(q_idx[t], t, True) @ keys[:visible].T, 0))
                chosen[t] = np.sort(np.argsort(-scores.sum(axis=0), kind="stable")[:self.idx_top_k])
        sinks = self.w[b + "attn_sinks.weight"]
        out = np.zeros((n, self.n_head, d))
        for t in range(n):
            keys_t = np.concatenate([kv[max(0, t - self.window + 1):t + 1], entries[chosen[t]]])
            logits = q[t] @ keys_t.T / math.sqrt(d)
            top = np.maximum(logits.max(axis=1), sinks)
            e = np.exp(logits - top[:, None])
            p = e / (e.sum(axis=1) + np.exp(sinks - top))[:, None]
            out[t] = self.rope(p @ keys_t, t, compressed, sign=-1.0)  # undo the values' rotation
        group = self.n_head * d // self.groups
        wo_a = self.w[b + "attn_output_a.weight"].reshape(self.groups, self.o_rank, group)
        grouped = np.einsum("tgi,gri->tgr", out.reshape(n, self.groups, group), wo_a).reshape(n, -1)
        return grouped @ self.w[b + "attn_output_b.weight"].T

    def feed_forward(self, x, il: int, token: int):
        b = f"blk.{il}."
        scores = np.sqrt(np.logaddexp(0, x @ self.w[b + "ffn_gate_inp.weight"].T))
        if il < self.hash_layers:
            chosen = self.w[b + "ffn_gate_tid2eid.weight"][token]
        else:
            chosen = np.argsort(-(scores + self.w[b + "exp_probs_b.bias"]), kind="stable")[:self.n_used]
        weights = scores[chosen]
        if self.weights_norm:
            weights = weights / max(weights.sum(), 6.103515625e-5)
        weights = weights * self.weights_scale

        def swiglu(gate, up, down, limit):
            g, u = np.minimum(x @ gate.T, limit), np.clip(x @ up.T, -limit, limit)
            return (g * sigmoid(g) * u) @ down.T

        w = self.w
        routed = sum(wt * swiglu(w[b + "ffn_gate_exps.weight"][e], w[b + "ffn_up_exps.weight"][e],
                                 w[b + "ffn_down_exps.weight"][e], self.clamp_exp[il])
                     for e, wt in zip(chosen, weights))
        shared = swiglu(w[b + "ffn_gate_shexp.weight"], w[b + "ffn_up_shexp.weight"], w[b + "ffn_down_shexp.weight"],
                        self.clamp_shexp[il])
        return routed + shared

    def logits(self, tokens: list[int]) -> np.ndarray:
        n = len(tokens)
        streams = np.repeat(self.w["token_embd.weight"][tokens][:, None, :], self.hc, axis=1)
        for il in range(self.n_layer):
            b = f"blk.{il}."
            pres = [self.hc_pre(streams[t], "attn", il) for t in range(n)]
            y = self.attention(np.array([self.rms(p[0], self.w[b + "attn_norm.weight"]) for p in pres]), il)
            streams = np.array([self.hc_post(y[t], streams[t], p[1], p[2]) for t, p in enumerate(pres)])
            pres = [self.hc_pre(streams[t], "ffn", il) for t in range(n)]
            streams = np.array([
                self.hc_post(self.feed_forward(self.rms(p[0], self.w[b + "ffn_norm.weight"]), il, tokens[t]),
                             streams[t], p[1], p[2])
                for t, p in enumerate(pres)])
        out = []
        for t in range(n):
            mix = self.rms(streams[t].reshape(-1)) @ self.w["output_hc_fn.weight"].T
            pre = sigmoid(mix * self.w["output_hc_scale.weight"][0] + self.w["output_hc_base.weight"]) + self.hc_eps
            out.append(self.rms(pre @ streams[t], self.w["output_norm.weight"]) @ self.w["output.weight"].T)
        return np.array(out)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    model = Model(Path(sys.argv[1]))
    tokens = json.loads(Path(sys.argv[2]).read_text())
    if isinstance(tokens, dict):  # a fixture generator's result.json
        tokens = tokens["entry"]["hf"]["tokens"]
    logits = model.logits([int(t) for t in tokens])
    for ref in sys.argv[3:]:
        other = np.load(ref)
        if other.shape != logits.shape:
            sys.exit(f"{ref}: shape {other.shape}, expected {logits.shape}")
        print(f"{ref}: max |Δ| {np.abs(logits - other).max():.3g}")


if __name__ == "__main__":
    main()
