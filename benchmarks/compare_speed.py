"""How long `draftdoctor compare` takes on a Llama-3.1-8B-sized draft, against `sha256sum` of both files.

Generates, under build/, a 1.9 GB Llama-3.1-8B-shaped speculators draft (synth.LLAMA_8B, as
benchmarks/fix_speed.py builds it), a byte-for-byte copy of it, and a second draft of the same shapes
and config whose every tensor holds other random values. Then in this one run times, as whole
processes, each pair's order alternating between rounds:
  - sha256sum:    `sha256sum DRAFT/model.safetensors OTHER/model.safetensors` (the baseline: both files
                  read and hashed once);
  - compare-same: `draftdoctor compare DRAFT COPY` (every pair's bytes compared as read; the configs by
                  meaning on every release);
  - compare-diff: `draftdoctor compare DRAFT OTHER` (every pair's bytes differ: each is read again by
                  value, sampled and judged: how it differs, here "unrelated").
The files are in the page cache for every run (just written and read): the ratios compare work, not
disk speed. Prints each figure's median and minimum, and each compare's ratio to sha256sum.
Usage: .venv/bin/python benchmarks/compare_speed.py [--repeat N] [--keep]   # N default 5
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftdoctor.synth import LLAMA_8B, draft_tensors, write_draft
from draftdoctor.synthwrite import write_safetensors

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def timed(argv) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv[0]} failed: {proc.stderr.decode()[-500:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the generated drafts")
    args = parser.parse_args()
    (ROOT / "build").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="compare-speed-", dir=ROOT / "build"))
    try:
        draft = write_draft(work / "draft", LLAMA_8B, layout="speculators")
        copy = Path(shutil.copytree(draft, work / "copy"))
        other = work / "other"
        other.mkdir()
        write_safetensors(other / "model.safetensors", draft_tensors(LLAMA_8B, "speculators"), seed=1)
        shutil.copy(draft / "config.json", other / "config.json")
        file = draft / "model.safetensors"
        print(f"draft: {file.stat().st_size / 1e9:.2f} GB, {LLAMA_8B}")
        commands = {
            "sha256sum": ["sha256sum", str(file), str(other / "model.safetensors")],
            "compare-same": [str(BIN / "draftdoctor"), "compare", str(draft), str(copy)],
            "compare-diff": [str(BIN / "draftdoctor"), "compare", str(draft), str(other)],
        }
        for argv in commands.values():  # warm the page cache and the bytecode
            timed(argv)
        times = {name: [] for name in commands}
        for i in range(args.repeat):
            for name in (list(commands) if i % 2 == 0 else list(commands)[::-1]):
                times[name].append(timed(commands[name]))
        median = {name: statistics.median(t) for name, t in times.items()}
        for name in commands:
            ratio = "" if name == "sha256sum" else f"  {median[name] / median['sha256sum']:.2f}x sha256sum"
            print(f"{name:13s} median {median[name]:.3f} s  min {min(times[name]):.3f} s{ratio}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
