#!/usr/bin/env bash
# llama.cpp's own way to pool machines, for comparison with bench/cluster.py: SERVERS `ggml-rpc-server`
# processes (one thread each) and `llama-bench --rpc … -ngl 99` (2 threads), every process in its own memory
# cgroup of LIMIT, page cache included, as bench/cluster.py --memory-limit does for TITAN. llama.cpp splits the
# layers over the servers and sends each its weights at start.
#
#   LLAMA_RPC=1 bash bench/build_llama_cpp.sh          # once
#   bench/cluster_llama_rpc.sh MODEL.gguf SERVERS LIMIT [PROMPT GEN REPS]    e.g. … 3 6G 32 32 2
#
# CPU_QUOTA=0.5 in the environment also gives every process its own CPU cgroup of that many cores' time (as
# bench/cluster.py --cpu-quota does for TITAN); THREADS sets llama-bench's threads (default 2).
#
# Needs root (cgroups). Loopback only.
set -euo pipefail
MODEL=$1 SERVERS=$2 LIMIT=$3 PROMPT=${4:-32} GEN=${5:-32} REPS=${6:-2}
BIN="$(cd "$(dirname "$0")/.." && pwd)/build/llama.cpp/bin"

THREADS=${THREADS:-2}
cgroup() {
    local cg=/sys/fs/cgroup/memory/$1
    mkdir -p "$cg" && echo "$LIMIT" > "$cg/memory.limit_in_bytes" && echo 0 > "$cg/memory.max_usage_in_bytes"
    if [ -n "${CPU_QUOTA:-}" ]; then
        local cpu=/sys/fs/cgroup/cpu/$1
        mkdir -p "$cpu" && echo 100000 > "$cpu/cpu.cfs_period_us"
        echo "$(awk "BEGIN { print int($CPU_QUOTA * 100000) }")" > "$cpu/cpu.cfs_quota_us"
    fi
    echo "$cg"
}
# Joins the memory cgroup $1 (and the CPU cgroup of the same name, when there is one) and runs the rest.
joins() { local name=${1##*/}; echo "echo \$\$ > $1/tasks${CPU_QUOTA:+ && echo \$\$ > /sys/fs/cgroup/cpu/$name/tasks}"; }
in_cgroup() { local cg=$1; shift; sh -c "$(joins "$cg") && exec \"\$@\"" sh "$@"; }

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
addrs=()
for i in $(seq 0 $((SERVERS - 1))); do
    port=$((50052 + i))
    cg=$(cgroup "llama-rpc$i")
    # exec all the way down, so that $! is the server itself and the trap below stops it.
    (exec sh -c "$(joins "$cg") && exec \"\$@\"" sh "$BIN/ggml-rpc-server" -H 127.0.0.1 -p "$port" -t 1) \
        > "/tmp/llama-rpc$i.log" 2>&1 &
    pids+=($!)
    addrs+=("127.0.0.1:$port")
done
sleep 2
rpc=$(IFS=,; echo "${addrs[*]}")
cg=$(cgroup llama-main)
sync; echo 3 > /proc/sys/vm/drop_caches
set +e
in_cgroup "$cg" "$BIN/llama-bench" -m "$MODEL" --rpc "$rpc" -ngl 99 -t "$THREADS" -p "$PROMPT" -n "$GEN" -r "$REPS" -o md
rc=$?
set -e
for i in $(seq 0 $((SERVERS - 1))); do
    oom=$(grep -o 'oom_kill [0-9]*' /sys/fs/cgroup/memory/llama-rpc$i/memory.oom_control || true)
    echo "rpc server $i: ${oom:-oom_kill ?}, max usage $(( $(cat /sys/fs/cgroup/memory/llama-rpc$i/memory.max_usage_in_bytes) >> 20 )) MiB"
done
echo "main: $(grep -o 'oom_kill [0-9]*' "$cg/memory.oom_control"), max usage $(( $(cat "$cg/memory.max_usage_in_bytes") >> 20 )) MiB; llama-bench exit $rc"
