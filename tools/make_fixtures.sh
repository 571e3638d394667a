#!/usr/bin/env bash
# Regenerates tests/fixtures/ (the oracle fixtures: tiny random-weight MoE models, their GGUF files written by
# llama.cpp's converter and quantiser, and reference logits/tokens from llama.cpp and Hugging Face transformers).
#
#   bash tools/make_fixtures.sh                           # everything
#   bash tools/make_fixtures.sh --only qwen3next,qwen35moe  # only these models, merged into manifest.json
#
# Creates .venv/ (gitignored) if missing, installs pinned packages from PyPI, builds llama-cpp-python from its source
# distribution (5-10 minutes on 2 cores), unpacks that source distribution under build/ (gitignored) to use the
# llama.cpp converter (vendor/llama.cpp/convert_hf_to_gguf.py and gguf-py), creates .venv-tf5/ (gitignored: transformers
# 5.x and the same wheel, for the Qwen3.5 MoE models; tools/python_env_tf5.sh), then runs tools/make_fixtures.py.
# Needs only PyPI; no GPU. Re-running reuses the venvs, the built wheel and the unpacked sdist.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

source "$ROOT/tools/python_env.sh"
source "$ROOT/tools/python_env_tf5.sh"

export LLAMA_CPP_SRC="$SRC/vendor/llama.cpp"
exec "$VPY" "$ROOT/tools/make_fixtures.py" "$@"
