"""What the real CPU engines' HTTP servers (vLLM, llama.cpp) share: a JSON POST that fails as a
ClientError naming the endpoint, a GET, and their speculative-decoding counters in Prometheus text."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

from .client import ClientError


def get_text(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def post_json(url: str, body: dict, timeout: float) -> tuple[dict, float]:
    """(the JSON answer, seconds it took); a refusal or a dead server is a ClientError naming `url`."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            answer = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise ClientError(f"{url} answered {e.code}: {e.read()[:300].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ClientError(f"{url}: {e}") from None
    return answer, time.perf_counter() - start


def counters_delta(before: dict, after: dict) -> dict:
    """What a run added to `spec_counters` readings taken before and after it."""
    counts = {key: after[key] - before[key] for key in after if key != "per_position"}
    counts["per_position"] = [a - (before["per_position"][i] if i < len(before["per_position"]) else 0.0)
                              for i, a in enumerate(after["per_position"])]
    return counts


def spec_counters(text: str, counters: dict[str, str], per_position: str) -> dict:
    """{key: float for each of `counters` (key -> metric name), "per_position": [accepted at position
    0, 1, ...]} from Prometheus text, each summed over its label sets (vLLM labels one per engine)."""
    out = {name: 0.0 for name in counters}
    positions: dict[int, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        metric, _, value = line.rpartition(" ")
        name = metric.split("{", 1)[0]
        for key, counter in counters.items():
            if name == counter:
                out[key] += float(value)
        if name == per_position:
            position = re.search(r'position="(\d+)"', metric)
            if position:
                positions[int(position.group(1))] = positions.get(int(position.group(1)), 0.0) + float(value)
    out["per_position"] = [positions[i] for i in sorted(positions)]
    return out
