#!/usr/bin/env bash
# Regenerates tests/fixtures/ (the oracle fixtures: tiny random-weight MoE models, their GGUF files written by
# llama.cpp's converter and quantiser, and reference logits/tokens from llama.cpp and Hugging Face transformers).
#
#   bash tools/make_fixtures.sh
#
# Creates .venv/ (gitignored) if missing, installs pinned packages from PyPI, builds llama-cpp-python from its source
# distribution (5-10 minutes on 2 cores), unpacks that source distribution under build/ (gitignored) to use the
# llama.cpp converter (vendor/llama.cpp/convert_hf_to_gguf.py and gguf-py), then runs tools/make_fixtures.py.
# Needs only PyPI; no GPU. Re-running reuses the venv, the built wheel and the unpacked sdist.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

source "$ROOT/tools/python_env.sh"

export LLAMA_CPP_SRC="$SRC/vendor/llama.cpp"
exec "$VPY" "$ROOT/tools/make_fixtures.py" "$@"
