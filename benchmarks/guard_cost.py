"""What the guard costs a vLLM server's start, on the demo: time to ready with and without `--guard`.

Real vLLM (the tested release) serves the demo target with the story's draft fixed for vLLM, started
ROUNDS times each way, alternating (guarded, plain, guarded, ...) so that the machine's noise falls on
both; time to ready is from launch to vLLM's "Application startup complete." and a healthy /health.
Prints min / median / max of each and the paired ratio guarded / plain (the baseline is measured in
the same run). The guard's own work (sentinel fill, wrapped loaders, the verdict) is also read from
the log line it adds. The demo draft is 0.3 MB: on a real draft the recorder's share grows with its
size (one pass to fill, one to count), the engine's start-up does not.
Usage: .venv/bin/python benchmarks/guard_cost.py [ROUNDS]
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

from draftdoctor.fix import apply_fix, plan_fix
from draftdoctor.serving.launcher import ServeConfig, serve

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"


def start(draft, guard, log):
    config = ServeConfig(target=str(DEMO / "target"), draft=str(draft), num_steps=4, num_draft_tokens=5, guard=guard)
    started = time.perf_counter()
    server = serve("vllm", config, log)
    ready = time.perf_counter() - started
    try:
        return ready, [line for line in Path(log).read_text().splitlines() if line.startswith("draftdoctor guard")]
    finally:
        server.stop()


def summary(times):
    return f"min {min(times):6.2f} s  median {statistics.median(times):6.2f} s  max {max(times):6.2f} s"


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        draft = apply_fix(plan_fix(DEMO / "draft-story", "vllm", target=DEMO / "target"), work / "fixed").dst
        times = {True: [], False: []}
        said = None
        for i in range(rounds):
            for guard in (True, False):
                seconds, lines = start(draft, guard, work / f"serve-{i}-{guard}.log")
                times[guard].append(seconds)
                said = lines if guard else said
                assert bool(lines) == guard, lines
        ratios = [g / p for g, p in zip(times[True], times[False])]
        print(f"vLLM start-up to ready, demo target and draft, {rounds} rounds each, alternating")
        print(f"  plain:   {summary(times[False])}")
        print(f"  guarded: {summary(times[True])}")
        print(f"  guarded / plain, paired: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
        print(f"  the guard said: {said[0] if said else '-'}")


if __name__ == "__main__":
    main()
