#!/usr/bin/env bash
# Runs the titan-kernels tests for aarch64 on an x86-64 (or any) Linux machine: cross-built with the
# aarch64 GNU linker and run under qemu-user, on an emulated CPU with NEON and the ARMv8.2 dot product,
# so the Neon kernels are checked bit for bit against their scalar twins (crates/kernels/src/simd/tests.rs).
# Then the whole model, across machines: `titan trace` built for aarch64 and run under qemu must write a
# trace IDENTICAL to this machine's native one, for fixtures of several architectures and formats — the
# bit-identity a cluster of x86 and ARM nodes relies on (portable exp/sin/cos/pow included).
#
#   tools/test_aarch64.sh [cargo test arguments, e.g. a test-name filter or -- --nocapture]
#
# The run fails if the emulated CPU lacks NEON + dotprod (AARCH64_REQUIRE_ISA, default neon, becomes the tests'
# TITAN_TEST_REQUIRE_ISA), rather than passing with only the scalar path tested. To test the scalar fallback of an
# older core instead:
#
#   QEMU_CPU=cortex-a72 AARCH64_REQUIRE_ISA= tools/test_aarch64.sh
#
# Needs the Rust target (rustup target add aarch64-unknown-linux-gnu) and the Debian/Ubuntu packages
# qemu-user, gcc-aarch64-linux-gnu and libc6-dev-arm64-cross; installs nothing itself. Honours
# CARGO_TARGET_DIR. Takes about a minute to build on 2 cores; the tests take seconds under qemu.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu

missing=()
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
[ -e "$SYSROOT/lib/libc.so" ] || missing+=(libc6-dev-arm64-cross)
if [ ${#missing[@]} -gt 0 ]; then
    echo "test_aarch64.sh: missing ${missing[*]}; install with:" >&2
    echo "    sudo apt-get install ${missing[*]}" >&2
    exit 1
fi
if ! compgen -G "$(rustc --print target-libdir --target "$TARGET")/libcore-*.rlib" >/dev/null; then
    echo "test_aarch64.sh: the Rust standard library for $TARGET is missing; install it with:" >&2
    echo "    rustup target add $TARGET" >&2
    exit 1
fi

# qemu-user reads QEMU_CPU itself; `max` has every extension qemu implements, dotprod included.
export QEMU_CPU="${QEMU_CPU:-max}"
# Its own knob: a TITAN_TEST_REQUIRE_ISA in the environment names the host's ISAs (.ci/run sets it), not qemu's.
export TITAN_TEST_REQUIRE_ISA="${AARCH64_REQUIRE_ISA-neon}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT"

echo "test_aarch64.sh: qemu CPU ${QEMU_CPU}, required ISA: ${TITAN_TEST_REQUIRE_ISA:-none}" >&2
cargo test --release -p titan-kernels --target "$TARGET" "$@"

cargo build --release -p titan-cli --target "$TARGET"
cargo build --release -p titan-cli
ARM_TITAN="${CARGO_TARGET_DIR:-target}/$TARGET/release/titan"
NATIVE_TITAN="${CARGO_TARGET_DIR:-target}/release/titan"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for model in qwen3moe/q8_0 olmoe/q4_0 qwen3moe-k/q4_k_m qwen3moe-k/q6_k mixtral/q8_0 qwen2moe/q5_0 \
    qwen35moe/q4_0 qwen3next/q8_0 qwen35/q8_0 qwen35moe-k/mxfp4_moe deepseek3/q8_0 gpt-oss/mxfp4_moe \
    glm4moe/q8_0 minimax-m2/q4_0 llama4/q8_0 deepseek4/mxfp4_moe; do
    args=(trace -m "tests/fixtures/$model.gguf" -p "The quick brown fox" -n 6 --temp 0 --threads 2)
    qemu-aarch64 -L "$SYSROOT" "$ARM_TITAN" "${args[@]}" -o "$work/arm.trace" 2>/dev/null
    "$NATIVE_TITAN" "${args[@]}" -o "$work/native.trace" 2>/dev/null
    verdict="$("$NATIVE_TITAN" trace-diff "$work/native.trace" "$work/arm.trace")" || {
        echo "aarch64 trace of $model differs from the native one:" >&2
        echo "$verdict" >&2
        exit 1
    }
    echo "aarch64 (qemu ${QEMU_CPU}) vs native trace, $model: $verdict"
done
