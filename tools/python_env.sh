# The Python environment of the developer tools (tools/make_fixtures.sh, tools/train_demo.sh), sourced by them:
# .venv/ (gitignored) with pinned torch, transformers, tokenizers, sentencepiece, numpy and safetensors from PyPI;
# llama-cpp-python built from its source distribution, which is also unpacked under build/sdist/ (gitignored) for
# llama.cpp's converter (vendor/llama.cpp/convert_hf_to_gguf.py) and gguf-py. Re-running reuses all of it.
# Expects ROOT; NICE (e.g. "nice -n 19") prefixes the heavy steps. Sets VENV, BUILD, PIP, VPY, SDIST_DIR, SRC and the
# version pins; defines llama_cpp_wheel (also used by tools/python_env_tf5.sh).

NICE="${NICE:-}"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
BUILD="$ROOT/build"

TORCH_VERSION=2.9.1
TRANSFORMERS_VERSION=4.57.6
TOKENIZERS_VERSION=0.22.1
SENTENCEPIECE_VERSION=0.2.1
NUMPY_VERSION=2.3.5
SAFETENSORS_VERSION=0.7.0
LLAMA_CPP_PYTHON_VERSION=0.3.36

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q -U pip
fi
PIP="$VENV/bin/pip"
VPY="$VENV/bin/python"

# torch from plain PyPI (the CUDA wheel; it runs on CPU) plus the Hugging Face stack.
if ! "$VPY" - <<EOF 2>/dev/null
import importlib.metadata as m
want = {"torch": "$TORCH_VERSION", "transformers": "$TRANSFORMERS_VERSION", "tokenizers": "$TOKENIZERS_VERSION",
        "sentencepiece": "$SENTENCEPIECE_VERSION", "numpy": "$NUMPY_VERSION", "safetensors": "$SAFETENSORS_VERSION"}
bad = [k for k, v in want.items() if m.version(k) != v]
raise SystemExit(1 if bad else 0)
EOF
then
    $NICE "$PIP" install "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" "tokenizers==$TOKENIZERS_VERSION" \
        "sentencepiece==$SENTENCEPIECE_VERSION" "numpy==$NUMPY_VERSION" "safetensors==$SAFETENSORS_VERSION"
fi

# llama-cpp-python's source distribution: its vendor/llama.cpp has the converter and gguf-py.
SDIST_DIR="$BUILD/sdist"
SRC="$SDIST_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
if [ ! -f "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
    mkdir -p "$SDIST_DIR"
    "$PIP" download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$SDIST_DIR"
    tar -xzf "$SDIST_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$SDIST_DIR"
fi

# llama-cpp-python built from that source distribution (llama.cpp's CPU backend), as a wheel kept under build/wheels/
# (tools/python_env_tf5.sh installs the same wheel into .venv-tf5/). llama_cpp_wheel builds it if missing and prints
# its path.
llama_cpp_wheel() {
    mkdir -p "$BUILD/wheels"
    local wheel
    wheel="$(ls "$BUILD"/wheels/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
    if [ -z "$wheel" ]; then
        # Not -DGGML_NATIVE=ON: on this project's machines -march=native enables AMX, whose kernels die with SIGILL
        # (illegal instruction) when llama.cpp runs Q4_0/Q8_0 tensors. AVX2 is portable and fast enough. The mtmd
        # (multimodal) library is not needed. The CMake build directory is kept for incremental rebuilds.
        CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF}" \
            $NICE "$PIP" wheel --no-deps -C build-dir="$BUILD/llama-cmake" "$SRC" -w "$BUILD/wheels" >&2
        wheel="$(ls "$BUILD"/wheels/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl | head -n 1)"
    fi
    echo "$wheel"
}

if ! "$VPY" -c "import importlib.metadata as m; assert m.version('llama_cpp_python') == '$LLAMA_CPP_PYTHON_VERSION'" 2>/dev/null; then
    WHEEL="$(llama_cpp_wheel)"
    "$PIP" install "$WHEEL"
fi
