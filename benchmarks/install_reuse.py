"""What linking the wheels other release folders hold saves a release's install (realload.reuse), and
proof that the folder is the one pip alone makes.

Installs one release's pin list (default vLLM 0.31.0) into scratch folders under the build area, in
paired rounds that alternate which goes first: plain (`pip install --no-deps --only-binary=:all:
--no-compile --target` of every pin, as before) and reusing (each pin a finished release folder of the
build area holds linked from it, pip for the rest). Each install runs in a child process; CPU seconds
(user + system of it and its pip, from the children's rusage) measure the work whatever else the machine
runs, wall seconds do not. Then each folder is linked to a copy of the release store (hard links, as
make's `.linked` step does) and self-checked (`python -m draftdoctor.realload`), each timed the same way.
The first round's two folders are compared before anything else runs in them: every path, its type,
mode and content; any difference is printed and the exit code is 1. The scratch folders are removed.
Reads the wheels from pip's index (the build area's pip cache keeps what it downloaded).
Usage: .venv/bin/python benchmarks/install_reuse.py [--engine vllm] [--release 0.31.0] [--rounds 2]
       .venv/bin/python benchmarks/install_reuse.py --compare BUILD_A BUILD_B   # every release folder of two
"""

import argparse
import hashlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from draftdoctor.toolstate import BUILD  # noqa: E402

INSTALL = """
import sys
from pathlib import Path
from draftdoctor.realload.install import install_pins
pins, folder, reuse = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "reuse"
linked = install_pins(pins, folder, folder.with_name(folder.name + ".log"), "pip failed",
                      sources=None if reuse else [])
print(linked)
"""


def timed(command: list[str]) -> tuple[float, float, str]:
    """CPU seconds (the child's and its children's), wall seconds and stdout of `command`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "lib")})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{done.stderr[-3000:]}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall, done.stdout


def tree(folder: Path, seen: dict | None = None) -> dict[str, tuple]:
    """Every path under `folder`: its type, mode and content (sha256, once an inode in `seen`; a link's
    target)."""
    found, seen = {}, {} if seen is None else seen
    for where, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(where) / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                what = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                what = ("dir",)
            else:
                key = (info.st_dev, info.st_ino)
                if key not in seen:
                    with open(path, "rb") as f:
                        seen[key] = hashlib.file_digest(f, "sha256").hexdigest()
                what = ("file", seen[key])
            found[str(path.relative_to(folder))] = (*what, oct(stat.S_IMODE(info.st_mode)))
    return found


def differences(a: dict, b: dict) -> list[str]:
    return ([f"only plain: {p}" for p in sorted(a.keys() - b.keys())]
            + [f"only reusing: {p}" for p in sorted(b.keys() - a.keys())]
            + [f"differs: {p}: {a[p]} / {b[p]}" for p in sorted(a.keys() & b.keys()) if a[p] != b[p]])


def compare(a: Path, b: Path) -> int:
    """Every release folder of two build areas (`sglang/*`, `vllm/*`) compared, as the rounds' folders are."""
    seen, different = {}, []
    names = sorted({p.relative_to(root) for root in (a, b) for engine in ("sglang", "vllm")
                    for p in (root / engine).glob("*") if p.is_dir()})
    for name in names:
        found = differences(tree(a / name, seen), tree(b / name, seen))
        print(f"{name}: {'the same' if not found else f'{len(found)} differences'}")
        different += [f"{name}: {d}" for d in found]
    print(*different[:50], sep="\n")
    return 1 if different or not names else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--release", default="0.31.0")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BUILD_A", "BUILD_B"),
                        help="instead, compare every release folder of two build areas (the same releases "
                             "installed with and without linking: `make sglang-loaders vllm-loaders` into each)")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    from draftdoctor.realload.install import pin_list

    pins = pin_list(args.engine, args.release)
    scratch = BUILD / f"tmp-install-reuse-{os.getpid()}"
    scratch.mkdir(parents=True)
    results = {"plain": [], "reusing": []}
    different = []
    try:
        if (BUILD / "release-store").is_dir():  # a copy of the store to link to: links, not bytes
            subprocess.run(["cp", "-al", str(BUILD / "release-store"), str(scratch / "store")], check=True)
        for n in range(args.rounds):
            folders = {}
            for way in (("plain", "reusing") if n % 2 == 0 else ("reusing", "plain")):
                folder = scratch / f"{way}-{n}"
                cpu, wall, out = timed([sys.executable, "-c", INSTALL, str(pins), str(folder),
                                        "reuse" if way == "reusing" else "plain"])
                folders[way] = folder
                results[way].append({"pins_cpu": cpu, "pins_wall": wall, "linked_pins": int(out.strip())})
            if n == 0:
                different = differences(tree(folders["plain"]), tree(folders["reusing"]))
            for way, folder in folders.items():
                link_cpu, link_wall, _ = timed([sys.executable, "-m", "draftdoctor.realload.linkstore",
                                                str(scratch / "store"), str(folder)])
                check_cpu, check_wall, _ = timed([sys.executable, "-m", "draftdoctor.realload", args.engine,
                                                  args.release, str(folder)])
                results[way][-1] |= {"link_cpu": link_cpu, "link_wall": link_wall, "check_cpu": check_cpu,
                                     "check_wall": check_wall}
                shutil.rmtree(folder)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    pins_count = sum(1 for line in pins.read_text().splitlines() if line.split("#", 1)[0].strip())
    print(f"{args.engine} {args.release}: {pins_count} pins; {args.rounds} paired rounds (CPU s = user + system)")
    for way, rows in results.items():
        for n, r in enumerate(rows):
            total = r["pins_cpu"] + r["link_cpu"] + r["check_cpu"]
            print(f"  {way:8} round {n}: pins {r['pins_cpu']:5.1f} CPU s ({r['pins_wall']:5.1f} wall, "
                  f"{r['linked_pins']:3} linked)  store link {r['link_cpu']:4.1f}  self-check {r['check_cpu']:4.1f}"
                  f"  = {total:5.1f} CPU s")
    mean = {way: sum(r["pins_cpu"] + r["link_cpu"] + r["check_cpu"] for r in rows) / len(rows)
            for way, rows in results.items()}
    print(f"  mean per install: plain {mean['plain']:.1f} CPU s, reusing {mean['reusing']:.1f} CPU s "
          f"({mean['reusing'] / mean['plain']:.2f}x)")
    print(json.dumps(results))
    if different:
        print(f"the folders differ ({len(different)}):", *different[:50], sep="\n  ")
        return 1
    print("the folders are the same: every path, type, mode and content")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
