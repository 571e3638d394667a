#!/usr/bin/env bash
# Build llama.cpp's `llama-bench` and `llama-completion` for side-by-side benchmarks.
#
# Source: the llama.cpp copy vendored in the `llama-cpp-python` source distribution on PyPI
# (no git clone needed; only package registries are required). Build tools: cmake and ninja
# from PyPI in a private venv when they are not on PATH.
#
# Result: build/llama.cpp/bin/llama-bench and build/llama.cpp/bin/llama-completion (build/ is
# gitignored). Idempotent: does nothing when both binaries exist (set FORCE=1 to rebuild).
#
# Environment overrides:
#   LLAMA_CPP_PYTHON_VERSION  sdist version to use (default 0.3.36)
#   LLAMA_CPP_SRC             an existing llama.cpp source tree to build instead
#   JOBS                      parallel build jobs (default: nproc)
#   FORCE=1                   reconfigure and rebuild even if the binaries exist
#   LLAMA_RPC=1               also build the RPC backend and ggml-rpc-server (for bench/cluster_llama_rpc.sh)
#   LLAMA_SERVER=1            also build llama-server (for bench/serve.py)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
BUILD="$ROOT/build"
OUT="$BUILD/llama.cpp"
BIN="$OUT/bin"
SDIST_DIR="$BUILD/sdist"
SRC_DEFAULT="$SDIST_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC="${LLAMA_CPP_SRC:-$SRC_DEFAULT}"
TOOLS_VENV="$BUILD/bench-tools-venv"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
TARGETS=(llama-bench llama-completion)
[[ "${LLAMA_RPC:-0}" == 1 ]] && TARGETS+=(ggml-rpc-server)
[[ "${LLAMA_SERVER:-0}" == 1 ]] && TARGETS+=(llama-server)

log() { echo "[build_llama_cpp] $*" >&2; }

have_all() {
    local t
    for t in "${TARGETS[@]}"; do [[ -x "$BIN/$t" ]] || return 1; done
}

if [[ "${FORCE:-0}" != 1 ]] && have_all && [[ -f "$OUT/bench-configure-args.txt" ]]; then
    log "already built"
    for t in "${TARGETS[@]}"; do echo "$BIN/$t"; done
    exit 0
fi

mkdir -p "$BUILD"

# --- 1. source ------------------------------------------------------------------------------
if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
    if [[ -n "${LLAMA_CPP_SRC:-}" ]]; then
        log "LLAMA_CPP_SRC=$LLAMA_CPP_SRC has no CMakeLists.txt"; exit 1
    fi
    mkdir -p "$SDIST_DIR"
    TARBALL="$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz"
    if [[ ! -f "$TARBALL" ]]; then
        log "downloading llama-cpp-python==$VERSION source distribution from PyPI"
        # Straight from PyPI's simple index (its JSON form): `pip download --no-binary :all:` would
        # first build the package's build dependencies (cmake among them) from source just to read
        # its metadata, a quarter of an hour on two cores.
        python3 - "$TARBALL" <<'PY'
import json, os, sys, urllib.request
dest = sys.argv[1]
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req))["files"]
url = next((f["url"] for f in files if f["filename"] == os.path.basename(dest)), None)
if url is None:
    sys.exit(f"no {os.path.basename(dest)} on PyPI")
urllib.request.urlretrieve(url, dest + ".part")
os.replace(dest + ".part", dest)
PY
    fi
    log "unpacking $TARBALL"
    tar -xzf "$TARBALL" -C "$SDIST_DIR"
    [[ -f "$SRC/CMakeLists.txt" ]] || { log "no llama.cpp at $SRC after unpacking"; exit 1; }
fi
log "llama.cpp source: $SRC"

# --- 2. build tools -------------------------------------------------------------------------
CMAKE="$(command -v cmake || true)"
NINJA="$(command -v ninja || true)"
if [[ -z "$CMAKE" || -z "$NINJA" ]]; then
    if [[ ! -x "$TOOLS_VENV/bin/cmake" || ! -x "$TOOLS_VENV/bin/ninja" ]]; then
        log "installing cmake and ninja from PyPI into $TOOLS_VENV"
        python3 -m venv "$TOOLS_VENV"
        "$TOOLS_VENV/bin/python" -m pip install --quiet --upgrade cmake ninja
    fi
    [[ -n "$CMAKE" ]] || CMAKE="$TOOLS_VENV/bin/cmake"
    [[ -n "$NINJA" ]] || NINJA="$TOOLS_VENV/bin/ninja"
fi
log "cmake: $CMAKE ($("$CMAKE" --version | head -n1))"
log "ninja: $NINJA"

# --- 3. configure and build -----------------------------------------------------------------
# Same build a user gets from a plain CPU build: native SIMD, Release, no network features.
# LLAMA_CURL is the old name of the download option, LLAMA_OPENSSL the new one; both off.
#
# AMX: on this project's VMs the CPU advertises AMX (amx_tile/amx_int8 in /proc/cpuinfo) but the first AMX
# instruction (tileloadd, in ggml's AMX Q8_0/Q4_0 kernels) dies with SIGILL, so -march=native is kept and AMX alone is
# switched off (-mno-amx-*). Set LLAMA_AMX=1 to keep AMX on a machine where it works.
CFLAGS_EXTRA=""
if [[ "${LLAMA_AMX:-0}" != 1 ]] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    CFLAGS_EXTRA="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    log "CPU advertises AMX: building without it ($CFLAGS_EXTRA); LLAMA_AMX=1 keeps it"
fi
CONFIG_ARGS=(-S "$SRC" -B "$OUT" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA"
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=ON
    "-DCMAKE_C_FLAGS=$CFLAGS_EXTRA" "-DCMAKE_CXX_FLAGS=$CFLAGS_EXTRA"
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER="$([[ "${LLAMA_SERVER:-0}" == 1 ]] && echo ON || echo OFF)" -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON)
[[ "${LLAMA_RPC:-0}" == 1 ]] && CONFIG_ARGS+=(-DGGML_RPC=ON)
STAMP="$OUT/bench-configure-args.txt"
if [[ "${FORCE:-0}" == 1 || ! -f "$OUT/CMakeCache.txt" || "$(cat "$STAMP" 2>/dev/null)" != "${CONFIG_ARGS[*]}" ]]; then
    log "configuring into $OUT"
    "$CMAKE" "${CONFIG_ARGS[@]}"
    echo "${CONFIG_ARGS[*]}" > "$STAMP"
fi
log "building ${TARGETS[*]} with $JOBS jobs (about 5 minutes on 2 cores)"
"$CMAKE" --build "$OUT" --config Release -j "$JOBS" --target "${TARGETS[@]}"

# Record where the source came from (llama-bench reports the commit, but the sdist's git is a
# shallow clone, so its build_number is not llama.cpp's real release number).
{
    echo "source=$SRC"
    echo "llama_cpp_python_sdist=$VERSION"
    if git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1 \
        && [[ "$(git -C "$SRC" rev-parse --show-toplevel)" == "$(cd "$SRC" && pwd -P)" ]]; then
        echo "commit=$(git -C "$SRC" rev-parse HEAD)"
        echo "commit_date=$(git -C "$SRC" log -1 --format=%cI)"
    fi
} > "$OUT/SOURCE.txt"

have_all || { log "build finished but binaries are missing in $BIN"; exit 1; }
log "done"
for t in "${TARGETS[@]}"; do echo "$BIN/$t"; done
