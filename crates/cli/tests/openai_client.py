"""`titan serve` driven by the official `openai` client (and, for what the client cannot send, raw HTTP).

Usage: openai_client.py BASE_URL MODEL API_KEY api|slots|texts

`api`: chat and completions, streamed and not; 8 concurrent streamed greedy requests each equal to the same
request alone; stop strings; logprobs; usage; every error case with its status and OpenAI-shaped body.
`slots` (a server with --parallel 1 --queue 1 and a long context): a client that disconnects mid-stream
frees its slot, and a full queue answers 429 with Retry-After.
`texts`: prints, as one JSON line, the greedy texts of four concurrent streamed requests (for comparing
servers, e.g. one machine against a cluster).
Prints what it checked; any failed check raises (non-zero exit).
"""

import concurrent.futures
import json
import sys
import threading
import urllib.error
import urllib.request

import openai

BASE, MODEL, KEY, MODE = sys.argv[1:5]
client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
GREEDY = dict(temperature=0, max_tokens=24)


def raw(path, body, key=KEY, content_type="application/json"):
    """POST raw bytes; returns (status, headers, parsed JSON body)."""
    req = urllib.request.Request(BASE + path, data=body, method="POST", headers={"Content-Type": content_type, "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


def completion(prompt, **kw):
    r = client.completions.create(model=MODEL, prompt=prompt, **{**GREEDY, **kw})
    return r.choices[0].text, r


def completion_streamed(prompt, **kw):
    parts, finish, usage = [], None, None
    for chunk in client.completions.create(model=MODEL, prompt=prompt, stream=True, stream_options={"include_usage": True}, **{**GREEDY, **kw}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.text)
            finish = c.finish_reason or finish
    return "".join(parts), finish, usage


def api():
    models = client.models.list()
    check([m.id for m in models.data] == [MODEL], f"/v1/models lists {MODEL}")

    text, r = completion("The quick brown fox")
    check(len(text) > 0 and r.choices[0].finish_reason == "length", f"completion: {text!r} ({r.choices[0].finish_reason})")
    check(r.usage.completion_tokens == 24 and r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + 24, f"completion usage {r.usage}")
    streamed, finish, usage = completion_streamed("The quick brown fox")
    check(streamed == text and finish == "length", "streamed completion equals the whole one")
    check(usage is not None and usage.completion_tokens == 24, f"streamed usage {usage}")

    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    answer = chat.choices[0].message.content
    check(chat.choices[0].message.role == "assistant" and len(answer) > 0, f"chat: {answer!r}")
    parts = []
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True, **GREEDY)
    for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
    check("".join(parts) == answer, "streamed chat equals the whole one")

    # Stop strings: cut before the first occurrence, finish_reason "stop".
    stop = text[5:8]
    cut, r = completion("The quick brown fox", stop=[stop])
    check(cut == text[: text.index(stop)] and r.choices[0].finish_reason == "stop", f"stop {stop!r}: {cut!r}")
    cut_streamed, finish, _ = completion_streamed("The quick brown fox", stop=[stop])
    check(cut_streamed == cut and finish == "stop", "streamed stop equals the whole one")

    # Log-probabilities of the chosen tokens: greedy picks have the highest, all ≤ 0.
    lp = client.chat.completions.create(model=MODEL, messages=messages, logprobs=True, **GREEDY).choices[0].logprobs.content
    check(len(lp) == 24 and all(t.logprob <= 0 for t in lp), f"chat logprobs for 24 tokens, first {lp[0].token!r} {lp[0].logprob:.3f}")

    # 8 concurrent streamed greedy requests, each exactly its text alone.
    prompts = [f"Story {i}: once upon a time" for i in range(8)]
    alone = [completion(p, max_tokens=300)[0] for p in prompts]
    # The average batch depends on how closely the 8 requests arrive, which a loaded machine staggers;
    # the widest step shows whether the server batched them at all.
    steps, sequences = metric("titan_steps_total"), metric("titan_step_sequences_total")
    start = threading.Barrier(8)
    def streamed_when_all_are_ready(p):
        start.wait()
        return completion_streamed(p, max_tokens=300)[0]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(streamed_when_all_are_ready, prompts))
    per_step = (metric("titan_step_sequences_total") - sequences) / (metric("titan_steps_total") - steps)
    widest = metric("titan_step_sequences_max")
    check(together == alone, f"8 concurrent streamed requests each equal the same request alone ({per_step:.1f} sequences per step, {widest:.0f} at most)")
    check(widest >= 4, "the concurrent requests were batched together")
    check(len(set(alone)) > 1, "the 8 prompts gave different texts (the check compares something)")

    # Errors: status, the OpenAI shape, the client's exception type.
    def raises(exc, f, what):
        try:
            f()
        except exc as e:
            check(True, f"{what}: {type(e).__name__} {e.status_code}: {e.body.get('message') if isinstance(e.body, dict) else e.body}")
            return
        raise AssertionError(f"{what}: no {exc.__name__}")

    raises(openai.NotFoundError, lambda: client.completions.create(model="no-such-model", prompt="hi", max_tokens=2), "unknown model")
    raises(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=0), "max_tokens 0")
    raises(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=10**9), "max_tokens past the context")
    raises(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="word " * 5000, max_tokens=2), "prompt longer than the context")
    raises(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=2, top_p=2), "top_p 2")
    raises(openai.BadRequestError, lambda: client.chat.completions.create(model=MODEL, messages=[], max_tokens=2), "no messages")
    bad_key = openai.OpenAI(base_url=BASE + "/v1", api_key="wrong-key", max_retries=0)
    raises(openai.AuthenticationError, lambda: bad_key.models.list(), "wrong API key")
    status, _, body = raw("/v1/completions", b'{"prompt": "hi", "max_tokens": ', KEY)
    check(status == 400 and body["error"]["type"] == "invalid_request_error", f"malformed JSON: {status} {body['error']['message']}")
    status, _, body = raw("/v1/completions", json.dumps({"prompt": "x" * (2 << 20)}).encode(), KEY)
    check(status == 413 and "exceeds" in body["error"]["message"], f"oversized body: {status} {body['error']['message']}")
    status, _, body = raw("/v1/chat/completions", b'{"messages": "not a list"}', KEY)
    check(status == 400, f"messages of the wrong type: {status} {body['error']['message']}")
    # The server still answers after all of that.
    check(completion("The quick brown fox")[0] == text, "the server answers as before after the errors")


def metric(name):
    with urllib.request.urlopen(BASE + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"/metrics has no {name}")


def slots():
    # A client that reads two chunks of a long streamed answer and disconnects: the slot is freed, so a new
    # request is served, and the abandoned one stops generating (far fewer tokens than it asked for).
    long = 6000
    before = metric("titan_generated_tokens_total")
    stream = client.completions.create(model=MODEL, prompt="Once", max_tokens=long, temperature=0, stream=True)
    it = iter(stream)
    next(it), next(it)
    stream.close()
    text, _ = completion("The quick brown fox", max_tokens=8)
    generated = metric("titan_generated_tokens_total") - before
    check(len(text) > 0 and generated < long / 2, f"after a disconnect the next request was served; {generated:.0f} tokens generated in all, not {long}")

    # With one slot busy and one request queued, the next is refused with 429 and Retry-After.
    busy = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
    first = busy.completions.create(model=MODEL, prompt="Once", max_tokens=long, temperature=0, stream=True)
    next(iter(first))  # in the slot now
    streams = [first, busy.completions.create(model=MODEL, prompt="Once", max_tokens=long, temperature=0, stream=True)]
    status, headers, body = raw("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}).encode())
    check(status == 429 and headers.get("Retry-After") == "1" and body["error"]["type"] == "rate_limit_error", f"full queue: {status}, Retry-After {headers.get('Retry-After')}: {body['error']['message']}")
    for s in streams:
        s.close()
    check(metric("titan_requests_rejected_total") >= 1, "the refusal is counted in /metrics")


def texts():
    prompts = [f"Request {i}: the quick brown fox" for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        out = list(pool.map(lambda p: completion_streamed(p, max_tokens=48)[0], prompts))
    print(json.dumps(out))


{"api": api, "slots": slots, "texts": texts}[MODE]()
print("all checks passed")
