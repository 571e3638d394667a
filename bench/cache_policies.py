#!/usr/bin/env python3
"""Replay a run's routing through expert-cache policies and print each one's hit rate.

    titan trace -m MODEL.gguf -p "The history of the city" -n 400 --temp 1 --top-k 0 --top-p 1 --min-p 0 \
        -o run.safetensors
    python3 bench/cache_policies.py run.safetensors --capacity 1646 --capacity 3264

The trace holds the experts the router chose at every step and layer (`sSSSS.lLLL.topk_ids`). Each decode step
is replayed in order, a layer's distinct experts requested together, through a cache of CAPACITY records (a
budget over the record size: all records of a Q4_0 or Q8_0 model have one size). The prompt step is left out, as
`titan bench -p 0` has none. Policies:

  lru        least recently used (TITAN's default)
  lfu        TITAN's `--cache-policy lfu`: fewest requests since loaded, least recently used among equals
  lfu-decay  requests counted with a half-life of H tokens (--half-life, several), evict the lowest
  lru-2      LRU-K with K = 2: evict the record whose second-last request is oldest
  arc        Adaptive Replacement Cache (Megiddo and Modha, 2003)
  layer-lru  recency measured at each record's next chance of use: layers come round in order, so a record of
             the layer just computed waits a whole token, one of the next layer a single step
  lookahead  (--lookahead N) LRU that knows the routes of the rest of the token and the next N - 1 tokens:
             the bound of an ideal predictor of those routes
  opt        Belady's optimum, which knows the future: the bound no policy can pass

Python standard library only. A replay ignores what the engine adds (records held while a layer computes, reads
in flight counted in the budget), so its LRU hit rate is compared with a real run's in docs/benchmarks.md.
"""

import argparse
import collections
import heapq
import json
import math
import struct
import sys


def load_routing(path):
    """The decode steps' requests: one list of (layer, expert) per step and layer, in execution order."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    formats = {"I32": "i", "U32": "I", "I64": "q", "U64": "Q"}
    steps = collections.defaultdict(dict)
    for name, t in header.items():
        if not name.endswith(".topk_ids"):
            continue
        step, layer, _ = name.split(".")
        a, b = t["data_offsets"]
        fmt = formats[t["dtype"]]
        ids = struct.unpack("<%d%s" % ((b - a) // struct.calcsize(fmt), fmt), data[a:b])
        steps[int(step[1:])][int(layer[1:])] = sorted(set(ids))
    if not steps:
        sys.exit(f"{path}: no topk_ids in this trace (is it a `titan trace` of an MoE model?)")
    # Keys name a layer by its place among the MoE layers (a model's dense layers route nothing).
    moe_layers = sorted({l for layers in steps.values() for l in layers})
    place = {l: i for i, l in enumerate(moe_layers)}
    groups = [[(place[l], e) for e in steps[s][l]] for s in sorted(steps) if s > 0 for l in sorted(steps[s])]
    return groups, len(moe_layers)


def replay(groups, capacity, on_hit, on_miss):
    """Count hits; `on_miss(key, t, group)` makes room and inserts, `on_hit(key, t)` updates."""
    hits = misses = 0
    for t, group in enumerate(groups):
        for key in group:
            if on_hit(key, t):
                hits += 1
            else:
                misses += 1
                on_miss(key, t, group)
    return hits / (hits + misses)


def lru(groups, capacity, _n_layer):
    cache = collections.OrderedDict()

    def hit(key, _t):
        if key in cache:
            cache.move_to_end(key)
            return True
        return False

    def miss(key, _t, _group):
        cache[key] = True
        if len(cache) > capacity:
            cache.popitem(last=False)

    return replay(groups, capacity, hit, miss)


def by_priority(groups, capacity, priority):
    """Evict the lowest `priority(state, key, t)`; a key's priority changes only when it is requested."""
    cache, heap, state = {}, [], {}

    def touch(key, t):
        p = priority(state, key, t)
        cache[key] = p
        heapq.heappush(heap, (p, key))

    def hit(key, t):
        if key in cache:
            touch(key, t)
            return True
        return False

    def miss(key, t, _group):
        if len(cache) >= capacity:
            while True:
                p, victim = heapq.heappop(heap)
                if cache.get(victim) == p:
                    del cache[victim]
                    state.pop(("uses", victim), None)
                    break
        touch(key, t)

    return replay(groups, capacity, hit, miss)


def lfu(groups, capacity, _n_layer):
    def priority(state, key, t):
        uses = state.get(("uses", key), 0) + 1
        state[("uses", key)] = uses
        return (uses, t)

    return by_priority(groups, capacity, priority)


def lfu_decay(half_life_steps):
    def run(groups, capacity, _n_layer):
        # log2 of the decayed count, referred to a fixed origin, so that priorities need no update as time passes
        def priority(state, key, t):
            now = t / half_life_steps
            old = state.get(key)
            state[key] = now if old is None else now + math.log2(2.0 ** (old - now) + 1.0)
            return state[key]

        return by_priority(groups, capacity, priority)

    return run


def lru_2(groups, capacity, _n_layer):
    def priority(state, key, t):
        before = state.get(key)
        state[key] = t
        return (before if before is not None else -1, t)

    return by_priority(groups, capacity, priority)


def arc(groups, capacity, _n_layer):
    t1, t2, b1, b2 = (collections.OrderedDict() for _ in range(4))
    target = 0

    def replace(key):
        if t1 and (len(t1) > target or (key in b2 and len(t1) == target)):
            b1[t1.popitem(last=False)[0]] = True
        else:
            b2[t2.popitem(last=False)[0]] = True

    def hit(key, _t):
        if key in t1:
            del t1[key]
            t2[key] = True
            return True
        if key in t2:
            t2.move_to_end(key)
            return True
        return False

    def miss(key, _t, _group):
        nonlocal target
        if key in b1:
            target = min(capacity, target + max(len(b2) // max(len(b1), 1), 1))
            replace(key)
            del b1[key]
            t2[key] = True
            return
        if key in b2:
            target = max(0, target - max(len(b1) // max(len(b2), 1), 1))
            replace(key)
            del b2[key]
            t2[key] = True
            return
        if len(t1) + len(b1) == capacity:
            if len(t1) < capacity:
                b1.popitem(last=False)
                replace(key)
            else:
                t1.popitem(last=False)
        elif len(t1) + len(t2) + len(b1) + len(b2) >= capacity:
            if len(t1) + len(t2) + len(b1) + len(b2) == 2 * capacity:
                b2.popitem(last=False)
            replace(key)
        t1[key] = True

    return replay(groups, capacity, hit, miss)


def layer_lru(groups, capacity, n_layer):
    """Per layer an LRU list; evict, among the layers' oldest records, the one whose next chance of use is
    furthest away: its age at that chance in tokens, then the steps until its layer comes round."""
    per_layer = [collections.OrderedDict() for _ in range(n_layer)]
    held = 0

    def hit(key, t):
        od = per_layer[key[0]]
        if key in od:
            od.move_to_end(key)
            od[key] = t // n_layer
            return True
        return False

    def miss(key, t, group):
        nonlocal held
        token, layer = divmod(t, n_layer)
        if held >= capacity:
            worst = None
            for l, od in enumerate(per_layer):
                if not od:
                    continue
                victim, last = next(iter(od.items()))
                if l == layer and victim in group:
                    continue
                chance = token if l > layer else token + 1
                score = ((chance - last) * n_layer + ((l - layer) % n_layer or n_layer), l, victim)
                worst = max(worst, score) if worst else score
            del per_layer[worst[1]][worst[2]]
            held -= 1
        per_layer[key[0]][key] = token
        held += 1

    return replay(groups, capacity, hit, miss)


def opt(groups, capacity, _n_layer):
    flat = [key for group in groups for key in group]
    next_use, seen = [0] * len(flat), {}
    for i in range(len(flat) - 1, -1, -1):
        next_use[i] = seen.get(flat[i], len(flat))
        seen[flat[i]] = i
    cache, heap, hits = {}, [], 0
    for i, key in enumerate(flat):
        if key in cache:
            hits += 1
        elif len(cache) >= capacity:
            while True:
                far, victim = heapq.heappop(heap)
                if cache.get(victim) == -far:
                    del cache[victim]
                    break
        cache[key] = next_use[i]
        heapq.heappush(heap, (-next_use[i], key))
    return hits / len(flat)


def lookahead(tokens_ahead):
    """LRU that knows the routes of the rest of this token and of the next `tokens_ahead` - 1 tokens (what an
    ideal predictor of those routes would know): it evicts a record not needed within that horizon, the least
    recently used first, and only when every record is needed, the one needed last."""

    def run(groups, capacity, n_layer):
        flat = [(t // n_layer, key) for t, group in enumerate(groups) for key in group]
        next_use, seen = [0] * len(flat), {}
        for i in range(len(flat) - 1, -1, -1):
            next_use[i] = seen.get(flat[i][1], len(flat))
            seen[flat[i][1]] = i
        token_of = [tok for tok, _ in flat] + [len(groups)]
        cache, hits = collections.OrderedDict(), 0
        for i, (token, key) in enumerate(flat):
            if key in cache:
                hits += 1
                cache.move_to_end(key)
            elif len(cache) >= capacity:
                horizon = token + tokens_ahead - 1
                victim = next((k for k, n in cache.items() if token_of[n] > horizon), None)
                if victim is None:
                    victim = max(cache, key=cache.get)
                del cache[victim]
            cache[key] = next_use[i]
        return hits / len(flat)

    return run


def reuse_by_age(groups, n_layer, ages=(1, 2, 4, 8, 16, 32)):
    """For each age a: of the experts idle for a - 1 tokens since a use, the share the a-th token uses."""
    last, gaps = {}, collections.Counter()
    for t, group in enumerate(groups):
        token = t // n_layer
        for key in group:
            if key in last:
                gaps[token - last[key]] += 1
            last[key] = token
    out, still_idle = [], sum(gaps.values())
    for a in range(1, max(ages) + 1):
        if a in ages:
            out.append((a, gaps[a] / still_idle if still_idle else 0.0))
        still_idle -= gaps[a]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a `titan trace` file (safetensors)")
    ap.add_argument("--capacity", type=int, action="append", required=True, help="records the cache holds; repeat")
    ap.add_argument("--half-life", type=float, action="append", help="lfu-decay half-lives in tokens (default 2, 8, 32)")
    ap.add_argument("--lookahead", type=int, action="append", help="also LRU knowing the routes of N tokens ahead")
    a = ap.parse_args()
    groups, n_layer = load_routing(a.trace)
    policies = [("lru", lru), ("lfu", lfu)]
    policies += [(f"lfu-decay {h:g}", lfu_decay(h * n_layer)) for h in a.half_life or [2, 8, 32]]
    policies += [("lru-2", lru_2), ("arc", arc), ("layer-lru", layer_lru)]
    policies += [(f"lookahead {h}", lookahead(h)) for h in a.lookahead or []]
    policies += [("opt", opt)]
    tokens = len(groups) // n_layer
    requests = sum(map(len, groups))
    print(f"{a.trace}: {tokens} decode steps, {n_layer} MoE layers, {requests} requests")
    ages = ", ".join(f"{age}: {p:.3f}" for age, p in reuse_by_age(groups, n_layer))
    print(f"chance that an expert idle for a - 1 tokens is used by the a-th: {ages}")
    print("| policy | " + " | ".join(f"{c} records" for c in a.capacity) + " |")
    print("| --- |" + " ---: |" * len(a.capacity))
    for name, run in policies:
        rates = [run(groups, c, n_layer) for c in a.capacity]
        print(f"| {name} | " + " | ".join(f"{r:.3f}" for r in rates) + " |", flush=True)


if __name__ == "__main__":
    main()
