"""What mk/llamacpp-build.cmake saves: the CPU seconds of building llama-server with and without it.

Configures and builds llama-server from the llama.cpp that make's pinned llama-cpp-python sdist vendors (the
one `make llamacpp` downloaded under the build area), with mk/llamacpp.mk's flags, twice in one run: as
before (-O1 everywhere, one object per source) and with the tuning (unity builds, -O0 for the per-request
code). Both builds use two jobs, one after the other, in scratch folders that are removed; CPU seconds
(user + system of the whole build, from the children's rusage) measure the work whatever else the machine
runs, wall seconds do not. Prints each and the ratio tuned / plain. Each build then answers `--version`.
Usage: .venv/bin/python benchmarks/llamacpp_build.py
"""

import os
import re
import shlex
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MK = (ROOT / "mk" / "llamacpp.mk").read_text()


def flags(tuned: bool) -> list[str]:
    """mk/llamacpp.mk's LLAMACPP_CMAKE, with or without the tuning (its unity and project-include flags)."""
    text = re.search(r"^LLAMACPP_CMAKE := (.*?[^\\])\n", MK, re.S | re.M).group(1)
    words = shlex.split(text.replace("\\\n", " ").replace("$(CURDIR)", str(ROOT)))
    return words if tuned else [w for w in words if "UNITY" not in w and "PROJECT_INCLUDE" not in w]


def build(source: Path, tuned: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="llamacpp-build-") as scratch:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(["cmake", "-S", str(source), "-B", scratch, *flags(tuned)], check=True, capture_output=True)
        subprocess.run(["cmake", "--build", scratch, "--target", "llama-server", "-j", "2"], check=True,
                       capture_output=True)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([str(Path(scratch) / "bin" / "llama-server"), "--version"], check=True, capture_output=True)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> int:
    build_area = Path(os.environ.get("DRAFTDOCTOR_STATE") or ROOT / "build")
    sources = sorted((build_area / "llamacpp" / "src").glob("llama_cpp_python-*/vendor/llama.cpp"))
    if not sources or shutil.which("cmake") is None:
        print("no llama.cpp source under the build area (make llamacpp), or no cmake", file=sys.stderr)
        return 2
    plain_cpu, plain_wall = build(sources[-1], tuned=False)
    tuned_cpu, tuned_wall = build(sources[-1], tuned=True)
    print(f"plain  (-O1, one object per source): {plain_cpu:7.1f} CPU s  {plain_wall:7.1f} wall s")
    print(f"tuned  (mk/llamacpp-build.cmake)   : {tuned_cpu:7.1f} CPU s  {tuned_wall:7.1f} wall s")
    print(f"tuned / plain CPU seconds: {tuned_cpu / plain_cpu:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
