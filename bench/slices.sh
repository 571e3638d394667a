#!/usr/bin/env bash
# Time to a serving cluster whose workers fetch their shards from the backbone (--serve-slices), from empty
# caches and then from full ones, and the bytes each worker downloaded against the model's size.
#
#   bench/slices.sh MODEL.gguf WORKERS CACHE_ROOT [backbone options, e.g. --expert-budget 1GiB --direct-io]
#
# Everything on loopback; each worker keeps its shards in CACHE_ROOT/cacheN (emptied first).
set -euo pipefail
MODEL=$1 WORKERS=$2 ROOT=$3
shift 3
TITAN="$(cd "$(dirname "$0")/.." && pwd)/target/release/titan"
TOKEN="$ROOT/node.token"
mkdir -p "$ROOT" && head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$TOKEN"
for i in $(seq 0 $((WORKERS - 1))); do rm -rf "$ROOT/cache$i"; done
SLICES=127.0.0.1:7470
NODES=$(for i in $(seq 0 $((WORKERS - 1))); do printf '127.0.0.1:%d,' $((7481 + i)); done | sed 's/,$//')

round() {
    local label=$1 pids=() start end
    shift
    start=$(date +%s.%N)
    for i in $(seq 0 $((WORKERS - 1))); do
        "$TITAN" worker --backbone "http://$SLICES" --cache-dir "$ROOT/cache$i" --listen "127.0.0.1:$((7481 + i))" \
            --token-file "$TOKEN" --threads 1 > /dev/null 2> "$ROOT/worker$i.log" &
        pids+=($!)
    done
    "$TITAN" run -m "$MODEL" -p "Hello" -n 1 --temp 0 --nodes "$NODES" --token-file "$TOKEN" --serve-slices "$SLICES" "$@" \
        > /dev/null 2> "$ROOT/backbone.log"
    end=$(date +%s.%N)
    kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null || true
    echo "$label: $(echo "$end - $start" | bc) s from start to the first token (model load, join, downloads, verification)"
    for i in $(seq 0 $((WORKERS - 1))); do
        echo "  worker $i: $(grep -o 'downloaded [0-9]* bytes' "$ROOT/worker$i.log"), cache $(du -sb "$ROOT/cache$i" | cut -f1) bytes"
    done
}
echo "model: $(stat -c %s "$MODEL") bytes"
round "empty caches" "$@"
round "full caches" "$@"
