"""A real-loader check cold, warm and replayed, side by side, for every installed release of CI's set.

Writes (once, in build/bench/real-loader) a tiny speculators-layout draft with a flat config. Per
release: cold = a fresh child process (Python, torch and the engine imported, set-up, config, build,
load: `DRAFTDOCTOR_REALLOAD_WORKER=0`); first = the same through a warm worker that does not exist yet
(it starts); warm = the next call to that worker (config, build and load only); replay = the header-only
`diagnose.check`. Targets: warm < 2 s, cold < 15 s on 2 cores. Each figure is the median of
`--runs` runs, measured in the same process, so the machine's noise hits all columns alike.
Usage: .venv/bin/python benchmarks/real_loader.py [--runs 3] [--engine sglang|vllm]
"""

import argparse
import os
import statistics
import time
from pathlib import Path

from draftdoctor import diagnose
from draftdoctor.realload import REAL_LOADERS, installed_releases, run_real_loader, stop_worker
from draftdoctor.synth import write_draft

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "build" / "bench" / "real-loader"


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engine", choices=list(REAL_LOADERS), action="append")
    args = ap.parse_args()
    if not (FOLDER / "model.safetensors").exists():
        write_draft(FOLDER, layout="speculators", config="flat")
    print(f"draft: {FOLDER}; medians of {args.runs} runs; seconds")
    print(f"{'engine':<7} {'release':<12} {'cold':>7} {'first':>7} {'warm':>7} {'replay':>7} {'cold/warm':>10}")
    for engine in args.engine or list(REAL_LOADERS):
        for release in [r for r in REAL_LOADERS[engine].ci_releases if r in installed_releases(engine)]:
            spec = f"{engine}=={release}"
            os.environ["DRAFTDOCTOR_REALLOAD_WORKER"] = "0"
            cold = [timed(lambda: run_real_loader(FOLDER, release, engine_name=engine)) for _ in range(args.runs)]
            os.environ["DRAFTDOCTOR_REALLOAD_WORKER"] = "1"
            first, warm = [], []
            for _ in range(args.runs):
                stop_worker(engine, release)
                first.append(timed(lambda: run_real_loader(FOLDER, release, engine_name=engine)))
                warm.append(timed(lambda: run_real_loader(FOLDER, release, engine_name=engine)))
            stop_worker(engine, release)
            replay = [timed(lambda: diagnose.check(FOLDER, spec, loader="replay")) for _ in range(args.runs)]
            c, f, w, r = (statistics.median(x) for x in (cold, first, warm, replay))
            print(f"{engine:<7} {release:<12} {c:7.2f} {f:7.2f} {w:7.2f} {r:7.3f} {c / w:9.1f}x")


if __name__ == "__main__":
    main()
