# The second Python environment of tools/make_fixtures.sh, sourced after tools/python_env.sh: .venv-tf5/ (gitignored)
# with transformers 5.x, for the fixture models whose transformers classes 4.57 lacks (Qwen3.5 MoE: the MODELS
# entries of tools/make_fixtures.py with "venv": ".venv-tf5", for which it runs itself there as a subprocess).
# Same pins as .venv/ for torch, tokenizers, sentencepiece, numpy and safetensors, and the same llama-cpp-python wheel
# (python_env.sh's llama_cpp_wheel, built once from the same source distribution). Re-running reuses it.
#
# TRANSFORMERS_TF5_VERSION is the newest 5.x whose requirements accept those pins (5.13 and later want
# safetensors >= 0.8, 5.16 and later tokenizers >= 0.23.1); the Qwen3_5Moe classes appeared in 5.2.
# Expects what python_env.sh sets. Sets VENV_TF5, PIP_TF5, VPY_TF5.

TRANSFORMERS_TF5_VERSION=5.12.1

VENV_TF5="$ROOT/.venv-tf5"
if [ ! -x "$VENV_TF5/bin/python" ]; then
    "$PY" -m venv "$VENV_TF5"
    "$VENV_TF5/bin/pip" install -q -U pip
fi
PIP_TF5="$VENV_TF5/bin/pip"
VPY_TF5="$VENV_TF5/bin/python"

if ! "$VPY_TF5" - <<PYEOF 2>/dev/null
import importlib.metadata as m
want = {"torch": "$TORCH_VERSION", "transformers": "$TRANSFORMERS_TF5_VERSION", "tokenizers": "$TOKENIZERS_VERSION",
        "sentencepiece": "$SENTENCEPIECE_VERSION", "numpy": "$NUMPY_VERSION", "safetensors": "$SAFETENSORS_VERSION",
        "llama_cpp_python": "$LLAMA_CPP_PYTHON_VERSION"}
bad = [k for k, v in want.items() if m.version(k) != v]
raise SystemExit(1 if bad else 0)
PYEOF
then
    $NICE "$PIP_TF5" install "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_TF5_VERSION" \
        "tokenizers==$TOKENIZERS_VERSION" "sentencepiece==$SENTENCEPIECE_VERSION" "numpy==$NUMPY_VERSION" \
        "safetensors==$SAFETENSORS_VERSION"
    "$PIP_TF5" install "$(llama_cpp_wheel)"
fi
