#!/usr/bin/env python3
"""An agent-style conversation against an OpenAI-compatible server: each turn resends the whole history (a
long system prompt, every earlier tool output and answer) plus a new user message, and streams a greedy answer
of --tokens tokens. What a prompt cache saves shows in each turn's time to first token.

Against a server that is already running:

    python3 bench/agent_turns.py --url http://127.0.0.1:8080 [--turns 10] [--tokens 32]

Or starting each server in turn on the same GGUF, threads, slots and context per slot, one after the other:

    python3 bench/agent_turns.py -m /work/models/olmoe-1b-7b-q4_0.gguf --threads 2 \\
        --servers titan,titan-no-cache,llama,llama-no-cache

  titan            titan serve (prompt cache on, the default)
  titan-no-cache   titan serve --no-prompt-cache
  llama            llama-server, its defaults (prompt cache on)
  llama-reuse      llama-server --cache-reuse 256
  llama-no-cache   llama-server --no-cache-prompt

Both servers get the same ChatML template file (--chat-template; llama-server's --jinja --chat-template-file) so
that they render the same prompt text. Prints, per server and turn, the prompt tokens, the tokens the server
reports as cached, the time to the first text and the turn's total time; then a summary table and one JSON line.
Only the Python standard library; llama-server from `LLAMA_SERVER=1 bash bench/build_llama_cpp.sh`.
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SYSTEM = (
    "You are a coding agent working in a Rust repository. You can call these tools: read_file(path) returns "
    "a file's text; run(command) runs a shell command and returns its output and exit status; edit(path, old, "
    "new) replaces one exact string in a file. Look before you change anything, change one thing at a time, run "
    "the tests after each change, and say what you saw. Never guess a file's contents: read it. Keep answers "
    "short; quote the lines you mean. A change is done when cargo fmt, cargo clippy and the tests pass."
)


def tool_output(turn):
    """A made-up tool result for `turn`: distinct each turn, about 200 characters."""
    files = ["api.rs", "http.rs", "scheduler.rs"]
    lines = [f"crates/server/src/{f}: {120 + 37 * ((turn * 7 + i) % 11)} lines" for i, f in enumerate(files)]
    return f"run(\"wc -l crates/server/src/*.rs\") exited 0 after step {turn}:\n" + "\n".join(lines)


def turn_message(turn):
    return f"Step {turn + 1}. The tool answered:\n{tool_output(turn)}\nWhich file should we read next, and why?"


def chat_stream(url, messages, tokens):
    """One streamed greedy chat completion: (text, prompt tokens, cached tokens, seconds to first text, seconds in all).

    The cached count is OpenAI's usage.prompt_tokens_details.cached_tokens where the server gives it, else
    llama-server's timings.cache_n."""
    u = urllib.parse.urlparse(url)
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=1800)
    body = {
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:300]!r}")
    parts, prompt, cached, first = [], None, None, None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices", []):
            text = (ch.get("delta") or {}).get("content")
            if text:
                if first is None:
                    first = time.perf_counter() - t0
                parts.append(text)
        usage = ev.get("usage")
        if usage:
            prompt = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details") or {}
            if "cached_tokens" in details:
                cached = details["cached_tokens"]
        timings = ev.get("timings")
        if timings and cached is None and "cache_n" in timings:
            cached = timings["cache_n"]
    c.close()
    total = time.perf_counter() - t0
    return "".join(parts), prompt, cached, first if first is not None else total, total


def conversation(url, turns, tokens, log):
    """Runs the conversation; one row per turn: (prompt tokens, cached tokens, seconds to first text, seconds)."""
    messages = [{"role": "system", "content": SYSTEM}]
    rows = []
    for t in range(turns):
        messages.append({"role": "user", "content": turn_message(t)})
        text, prompt, cached, first, total = chat_stream(url, messages, tokens)
        messages.append({"role": "assistant", "content": text})
        rows.append((prompt, cached, first, total))
        log(f"  turn {t + 1:2}: prompt {prompt} tokens, cached {cached}, first text {first * 1000:.0f} ms, "
            f"turn {total * 1000:.0f} ms")
    return rows


def wait_healthy(p, url):
    u = urllib.parse.urlparse(url)
    for _ in range(1200):
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        if p.poll() is not None:
            raise RuntimeError(f"the server exited with {p.returncode}")
        time.sleep(0.5)
    raise RuntimeError("the server did not become healthy")


def server_command(name, a, port, template):
    titan = [a.titan, "serve", "-m", a.model, "--threads", str(a.threads), "--parallel", str(a.parallel),
             "-c", str(a.ctx), "--chat-template", template, "--listen", f"127.0.0.1:{port}"]
    # llama-server's -c is the total over its slots.
    llama = [a.llama_server, "-m", a.model, "-t", str(a.threads), "-tb", str(a.threads), "-np", str(a.parallel),
             "-c", str(a.ctx * a.parallel), "--jinja", "--chat-template-file", template, "--host", "127.0.0.1",
             "--port", str(port), "--no-webui"]
    return {
        "titan": titan,
        "titan-no-cache": titan + ["--no-prompt-cache"],
        "llama": llama,
        "llama-reuse": llama + ["--cache-reuse", "256"],
        "llama-no-cache": llama + ["--no-cache-prompt"],
    }[name]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a server already running; otherwise -m starts each of --servers")
    ap.add_argument("-m", "--model")
    ap.add_argument("--servers", default="titan,titan-no-cache,llama,llama-no-cache")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--parallel", type=int, default=1, help="slots of each server")
    ap.add_argument("--ctx", type=int, default=4096, help="context per slot")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=32, help="tokens each answer generates")
    ap.add_argument("--template", default=os.path.join(ROOT, "tests/fixtures/templates/qwen2.5-chatml.jinja"))
    ap.add_argument("--titan", default=os.path.join(ROOT, "target/release/titan"))
    ap.add_argument("--llama-server", default=os.path.join(ROOT, "build/llama.cpp/bin/llama-server"))
    a = ap.parse_args()
    log = lambda s: print(s, file=sys.stderr, flush=True)

    results = {}
    if a.url:
        log(a.url)
        results["server"] = conversation(a.url, a.turns, a.tokens, log)
    else:
        if not a.model:
            ap.error("give --url or -m")
        for i, name in enumerate(a.servers.split(",")):
            port = 18580 + i
            url = f"http://127.0.0.1:{port}"
            p = subprocess.Popen(server_command(name, a, port, a.template), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            try:
                wait_healthy(p, url)
                # Pages the weights in, in a conversation that shares nothing past the template's first tokens.
                chat_stream(url, [{"role": "user", "content": "Warm-up."}], 4)
                log(name)
                results[name] = conversation(url, a.turns, a.tokens, log)
            finally:
                p.terminate()
                p.wait()

    print("| server | prompt tokens, all turns | reported cached | first text, sum of turns | all turns | last turn's first text |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, rows in results.items():
        cached = sum(r[1] or 0 for r in rows)
        print(f"| {name} | {sum(r[0] or 0 for r in rows)} | {cached} | {sum(r[2] for r in rows):.2f} s | "
              f"{sum(r[3] for r in rows):.2f} s | {rows[-1][2] * 1000:.0f} ms |")
    print(json.dumps({name: [{"prompt_tokens": r[0], "cached_tokens": r[1], "first_s": r[2], "turn_s": r[3]}
                             for r in rows] for name, rows in results.items()}))


if __name__ == "__main__":
    main()
