"""How much the value checks and `compare` cost on a Llama-3.1-8B-sized draft, against reading the file.

Generates a 1.9 GB Llama-3.1-8B-shaped speculators draft (synth.LLAMA_8B) and a copy of it under
build/, then in this one run times, as whole processes, alternating each pair's order:
  - read:     `cat DRAFT/model.safetensors > /dev/null` (the baseline: every byte of the file read once);
  - values:   `python -c "draftdoctor.values.scan(...)"`: the value scan alone (bounded samples per tensor);
  - check:    `draftdoctor check DRAFT --engine sglang==0.5.10 --loader replay` (headers, replay, value scan);
  - sha256sum: `sha256sum DRAFT/model.safetensors COPY/model.safetensors` (the baseline for compare);
  - compare:  `draftdoctor compare DRAFT COPY` (every pair's bytes compared as read).
The file is in the page cache for every run (it was just written and read): the ratios compare work,
not disk speed. Prints each figure's median and min with ratios to its baseline.
Usage: .venv/bin/python benchmarks/values_speed.py [--repeat N] [--keep]
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftdoctor.synth import LLAMA_8B, write_draft

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
    work = Path(tempfile.mkdtemp(prefix="values-speed-", dir=ROOT / "build"))
    try:
        draft = write_draft(work / "draft", LLAMA_8B, layout="speculators")
        copy = Path(shutil.copytree(draft, work / "copy"))
        file = draft / "model.safetensors"
        print(f"draft: {file.stat().st_size / 1e9:.2f} GB, {LLAMA_8B}")
        scan = (f"from draftdoctor.checkpoint import open_checkpoint; from draftdoctor.values import scan; "
                f"scan(open_checkpoint({str(draft)!r}), {LLAMA_8B.vocab}, {LLAMA_8B.draft_vocab})")
        commands = {
            "read": ["sh", "-c", f"cat {file} > /dev/null"],
            "values": [sys.executable, "-c", scan],
            "check": [str(BIN / "draftdoctor"), "check", str(draft), "--engine", "sglang==0.5.10", "--loader", "replay"],
            "sha256sum": ["sha256sum", str(file), str(copy / "model.safetensors")],
            "compare": [str(BIN / "draftdoctor"), "compare", str(draft), str(copy)],
        }
        for argv in commands.values():  # warm the page cache and the bytecode
            timed(argv)
        times = {name: [] for name in commands}
        for i in range(args.repeat):
            for pair in (("read", "values", "check"), ("sha256sum", "compare")):
                for name in (pair if i % 2 == 0 else pair[::-1]):
                    times[name].append(timed(commands[name]))
        median = {name: statistics.median(t) for name, t in times.items()}
        for name, baseline in (("read", None), ("values", "read"), ("check", "read"), ("sha256sum", None),
                               ("compare", "sha256sum")):
            ratio = f"  {median[name] / median[baseline]:.2f}x {baseline}" if baseline else ""
            print(f"{name:10s} median {median[name]:.3f} s  min {min(times[name]):.3f} s{ratio}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
