"""Cold time of one real-loader check per SGLang release, beside the replay check of the same draft.

Writes (once, in build/bench/real-loader) a tiny speculators-layout draft with a flat config, then per
supported release times `run_real_loader` (a fresh child process: Python and torch start-up, importing
SGLang, the gloo group, config, build, load) and the header-only replay `diagnose.check`.
Target: a real check under 15 s on 2 cores. Usage: .venv/bin/python benchmarks/real_loader.py
"""

import time
from pathlib import Path

from draftdoctor import diagnose
from draftdoctor.realload import SUPPORTED_RELEASES, ReleaseNotInstalled, run_real_loader
from draftdoctor.synth import write_draft

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "build" / "bench" / "real-loader"
TARGET_S = 15.0


def main():
    if not (FOLDER / "model.safetensors").exists():
        write_draft(FOLDER, layout="speculators", config="flat")
    print(f"draft: {FOLDER}")
    print(f"{'release':<8} {'real (cold)':>12} {'setup':>7} {'load':>7} {'replay':>8} {'parameters written':>19}")
    for release in SUPPORTED_RELEASES:
        started = time.perf_counter()
        try:
            report = run_real_loader(FOLDER, release)
        except ReleaseNotInstalled as exc:
            print(f"{release:<8} {exc}")
            continue
        real_s = time.perf_counter() - started
        started = time.perf_counter()
        diagnose.check(FOLDER, f"sglang=={release}")
        replay_s = time.perf_counter() - started
        written = sum(p["status"] == "written" for p in report["parameters"])
        timings = report["timings"]
        flag = "" if real_s < TARGET_S else f"  (over the {TARGET_S:g} s target)"
        print(f"{release:<8} {real_s:>10.2f} s {timings['setup']:>5.2f} s {timings.get('load', 0):>5.3f} s "
              f"{replay_s * 1000:>6.1f} ms {written:>10}/{len(report['parameters'])}{flag}")


if __name__ == "__main__":
    main()
