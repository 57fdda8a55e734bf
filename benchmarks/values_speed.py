"""How much the value checks and `compare` cost on a Llama-3.1-8B-sized draft, against reading the file.

Generates a 1.9 GB Llama-3.1-8B-shaped speculators draft (synth.LLAMA_8B) and a copy of it under
build/, then in this one run times, alternating each group's order from round to round:

In this process, the file in the page cache (the work itself, no start-up):
  - read:       every byte of the draft's file read once (os.readv into one 8 MB buffer);
  - statistics: `draftdoctor.values.scan` (one bounded block per tensor, and its statistics).
As whole processes, the file in the page cache:
  - cat:        `cat DRAFT/model.safetensors > /dev/null`;
  - values:     `python -c "draftdoctor.values.scan(...)"` (interpreter and numpy start-up included);
  - check:      `draftdoctor check DRAFT --engine sglang==0.5.10 --loader replay`;
  - sha256sum:  `sha256sum DRAFT/model.safetensors COPY/model.safetensors` (the baseline for compare);
  - compare:    `draftdoctor compare DRAFT COPY` (every pair's bytes compared as read).
As whole processes, the draft's file evicted from the page cache before each run (posix_fadvise
DONTNEED on that file only: the disk is read as a user's first look at a draft reads it):
  - cold cat, cold values.
Prints each figure's median and min with its ratio to its baseline.
Usage: .venv/bin/python benchmarks/values_speed.py [--repeat N] [--keep]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.synth import LLAMA_8B, write_draft
from draftdoctor import values

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def timed(argv) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv[0]} failed: {proc.stderr.decode()[-500:]}")
    return time.perf_counter() - start


def read_all(path: Path) -> float:
    buffer = bytearray(8 << 20)
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.readv(fd, [buffer]):
            pass
    finally:
        os.close(fd)
    return time.perf_counter() - start


def statistics_of(folder: Path) -> float:
    values._SEEN.clear()  # what a scan found is kept per file for the next engine's diagnosis: start afresh
    start = time.perf_counter()
    found = values.scan(open_checkpoint(folder), LLAMA_8B.vocab, LLAMA_8B.draft_vocab)
    elapsed = time.perf_counter() - start
    if found:
        raise SystemExit(f"the synthetic draft's values were flagged: {found}")
    return elapsed


def evicted(path: Path, argv) -> float:
    """`argv`'s wall time with `path` (a file this benchmark wrote) out of the page cache first."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return timed(argv)


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
        os.sync()  # nothing left to write back: eviction drops the pages
        print(f"draft: {file.stat().st_size / 1e9:.2f} GB, {LLAMA_8B}")
        scan_code = (f"from draftdoctor.checkpoint import open_checkpoint; from draftdoctor.values import scan; "
                     f"scan(open_checkpoint({str(draft)!r}), {LLAMA_8B.vocab}, {LLAMA_8B.draft_vocab})")
        commands = {
            "cat": ["sh", "-c", f"cat {file} > /dev/null"],
            "values": [sys.executable, "-c", scan_code],
            "check": [str(BIN / "draftdoctor"), "check", str(draft), "--engine", "sglang==0.5.10", "--loader", "replay"],
            "sha256sum": ["sha256sum", str(file), str(copy / "model.safetensors")],
            "compare": [str(BIN / "draftdoctor"), "compare", str(draft), str(copy)],
        }
        for argv in commands.values():  # warm the page cache and the bytecode
            timed(argv)
        read_all(file), statistics_of(draft)
        runs = {"read": lambda: read_all(file), "statistics": lambda: statistics_of(draft),
                **{name: (lambda argv=argv: timed(argv)) for name, argv in commands.items()},
                "cold cat": lambda: evicted(file, commands["cat"]), "cold values": lambda: evicted(file, commands["values"])}
        times = {name: [] for name in runs}
        groups = (("read", "statistics"), ("cat", "values", "check"), ("sha256sum", "compare"), ("cold cat", "cold values"))
        for i in range(args.repeat):
            for group in groups:
                for name in (group if i % 2 == 0 else group[::-1]):
                    times[name].append(runs[name]())
        median = {name: statistics.median(t) for name, t in times.items()}
        for name, baseline in (("read", None), ("statistics", "read"), ("cat", None), ("values", "cat"),
                               ("check", "cat"), ("sha256sum", None), ("compare", "sha256sum"), ("cold cat", None),
                               ("cold values", "cold cat")):
            ratio = f"  {median[name] / median[baseline]:.2f}x {baseline}" if baseline else ""
            print(f"{name:12s} median {median[name]:.3f} s  min {min(times[name]):.3f} s{ratio}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
