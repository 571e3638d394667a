#!/usr/bin/env bash
# The chat page in headless Chromium against a real `titan serve` on loopback, on the trained demo model:
# loads /, sends a line of a play and waits for the streamed answer, then checks the Markdown renderer, Copy,
# Regenerate and Stop (see test_chat_page.py). Needs Debian's chromium and
# chromium-driver (apt-get install chromium chromium-driver); installs selenium into target/browser-venv.
# SCREENSHOT=docs/chat-page.png also saves what the page looked like.
set -euo pipefail
cd "$(dirname "$0")/.."
for b in chromium chromedriver; do
    command -v "$b" >/dev/null || { echo "$b is not installed (apt-get install chromium chromium-driver)"; exit 1; }
done
[ -x target/browser-venv/bin/python ] || python3 -m venv target/browser-venv
target/browser-venv/bin/pip install -q selenium==4.51.0
cargo build --release -q -p titan-cli
out=$(mktemp)
target/release/titan serve -m models/demo/demo-q8_0.gguf --chat-template models/demo/chat.jinja --listen 127.0.0.1:0 >"$out" &
server=$!
trap 'kill $server 2>/dev/null; rm -f "$out"' EXIT
for _ in $(seq 100); do grep -q "listening on" "$out" && break; sleep 0.1; done
url="http://$(sed -n 's/^listening on //p' "$out")"
target/browser-venv/bin/python tools/test_chat_page.py "$url/" 'KING HENRY.\nNow, lords,' ${SCREENSHOT:-}
