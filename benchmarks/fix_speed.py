"""How fast and lean `draftdoctor fix` is on a Llama-3.1-8B-sized draft, against `cp` and the story's script.

Generates a 1.9 GB Llama-3.1-8B-shaped speculators draft (synth.LLAMA_8B, random data) in a temporary
folder under build/, then in this one run times, as subprocesses:
  - cp:     `cp` of the same safetensors file (the floor: bytes moved, nothing checked);
  - fix:    `draftdoctor fix SRC --engine sglang==0.5.10 --out DST`, as a user runs it: rename, config
            rewrite, copy, comparison of every tensor's bytes in DST with SRC, header re-read, the value
            checks, and `check` on DST with the default loader (auto: SGLang 0.5.10's own loader through
            a warm worker where that release is installed, else the replay). No --target, so no
            prediction of acceptance: a prediction runs the draft on a target's weights;
  - bare:   fix's copy-and-compare method alone (BARE below: the same bytes copied and compared the way
            rewriter does, in a process with no kit): the floor under fix's ratio to cp;
  - script: the story's script, safetensors load_file -> rename layers.0. -> midlayer. -> save_file
            (torch; run with this venv's python).
After one uncounted run each of cp and fix (a VM hands memory back lazily, so first runs pay more; fix's
first run also starts the real-loader worker when none is running: its time is printed apart),
cp and fix run in adjacent pairs, alternating which goes first; the script's runs come after them,
because its 2 GB of tensors disturb whatever runs next. The package's bytecode is compiled first,
as `pip install` does (with PYTHONDONTWRITEBYTECODE set, every run would otherwise recompile it).
Before each run every earlier output is deleted and the disk synced, so each run starts from the
same state: SRC in the page cache, nothing waiting to be written. (Keeping the other command's
output made the sync before a run write 1.9 GB, 0.5 s here, and the run after it, still competing
with the host's write-back, took 2-6x as long.) Each run is measured by a wrapper process (wall time around the child; CPU time and peak RSS from getrusage(RUSAGE_CHILDREN),
whose RSS includes the few MB the child inherits from the wrapper before exec).
Prints medians and the ratios to cp, bare / cp and fix / bare (wall time, and CPU time: on a busy machine the wall-time ratio
drifts toward the CPU-time one); targets: fix <= 1.2x cp wall time, fix peak RSS <= 80 MB.
--against LIB adds `before`: the same fix command run with PYTHONPATH=LIB (another checkout's lib/,
say the code before a change), in the rotation with cp and fix (each round in turn forwards and
backwards), and prints fix / before of adjacent runs, wall and CPU time: a change measured against
the code before it in the same run.
--stages then runs fix N more times in-process, with its steps timed (STAGES below), and prints
where its time goes beside cp's, in ms: what runs before the copy, the copy and its comparison, what
runs beside them, and what runs after (with --against, before's steps too, alternating).
Usage: .venv/bin/python benchmarks/fix_speed.py [--repeat N] [--keep] [--draft DIR] [--against LIB] [--stages]
"""

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from draftdoctor import rewriter
from draftdoctor.synth import LLAMA_8B, write_draft

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# Runs one command and reports its wall time and peak RSS (the wrapper's own start-up is not counted).
WRAPPER = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_kb": usage.ru_maxrss}))
"""

STORY_SCRIPT = """
import sys
from safetensors.torch import load_file, save_file
src, dst = sys.argv[1], sys.argv[2]
tensors = load_file(src)
tensors = {k.replace("layers.0.", "midlayer."): v for k, v in tensors.items()}
save_file(tensors, dst, metadata={"format": "pt"})
"""

# fix's copy-and-compare method alone, as a whole process and with no kit: the shard's bytes copied by
# copy_file_range in CHUNK steps while a second thread reads each copied chunk back from SRC and DST in
# COMPARE_PIECE pieces and compares them, at most VERIFY_LAG chunks behind (rewriter's constants, passed
# in). The floor of what `fix` does: the same bytes moved and verified the same way, with no plan, no
# imports, no value checks and no `check` on DST.
BARE = """
import os, queue, sys, threading
src, dst, chunk, piece, lag = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
sfd = os.open(src, os.O_RDONLY)
dfd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
size = os.fstat(sfd).st_size
copied = queue.Queue(lag)
bad = []

def compare():
    a, b = bytearray(piece), bytearray(piece)
    while (item := copied.get()) is not None:
        off, n = item
        for start in range(off, off + n, piece):
            k = min(piece, off + n - start)
            got = os.preadv(dfd, [memoryview(b)[:k]], start)
            want = os.preadv(sfd, [memoryview(a)[:k]], start)
            if got != k or want != k or (b if k == piece else b[:k]) != (a if k == piece else a[:k]):
                bad.append(start)

checker = threading.Thread(target=compare)
checker.start()
off = 0
while off < size:
    n = min(chunk - off % chunk, size - off)
    done = 0
    while done < n:
        done += os.copy_file_range(sfd, dfd, n - done, off + done, off + done)
    copied.put((off, n))
    off += n
copied.put(None)
checker.join()
sys.exit(1 if bad else 0)
"""

# `draftdoctor fix` as the console script runs it, with its steps timed from inside: perf_counter and
# the thread's CPU time around the library's own steps (fixwrite, rewriter, fixplan), printed as JSON.
STAGES = """
import json, sys, threading, time
top = time.perf_counter()
from draftdoctor import fixplan, fixwrite, rewriter
import draftdoctor.cli.fix
from draftdoctor.cli import main
imported = time.perf_counter()
marks = {}

def timed(owner, name, label):
    inner = getattr(owner, name)

    def run(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            marks.setdefault(label, (wall - top, time.perf_counter() - wall, time.thread_time() - cpu))
    setattr(owner, name, run)

timed(draftdoctor.cli.fix, "plan_fix", "plan")
timed(rewriter, "write_shard", "copy")
timed(fixplan.FixPlan, "judge", "judge")
timed(fixwrite, "_verify", "verify")
timed(rewriter, "put_in_place", "in_place")
sys.argv = ["draftdoctor", *sys.argv[1:]]
status = main()
marks["exit"] = (time.perf_counter() - top, 0.0, time.process_time())
marks["imports"] = (0.0, imported - top, 0.0)
print(json.dumps(marks))
sys.exit(status)
"""


def stage_report(runs: dict, staged: list[dict], floor: float, name: str = "fix") -> None:
    """Where `name`'s time goes (medians over the --stages runs, in ms), beside cp's median wall time."""
    med = lambda f: statistics.median(f(m) for m in staged) * 1000
    copy_end = lambda m: m["copy"][0] + m["copy"][1]
    rows = [
        ("interpreter start (python -c pass)", floor * 1000, ""),
        ("imports (cli, fix, rewriter)", med(lambda m: m["imports"][1]), ""),
        ("imports to the plan (arguments, build-area check)", med(lambda m: m["plan"][0] - m["imports"][1]), ""),
        ("plan (headers, renames, config rewrite)", med(lambda m: m["plan"][1]), ""),
        ("plan to the copy's start", med(lambda m: m["copy"][0] - m["plan"][0] - m["plan"][1]), ""),
        ("copy, compared as it is written (copying thread)", med(lambda m: m["copy"][1]),
         f"{med(lambda m: m['copy'][2]):.0f} ms CPU"),
        ("  beside it: judging the plan (values, replay)", med(lambda m: m["judge"][1]),
         f"{med(lambda m: m['judge'][2]):.0f} ms CPU, overlapped"),
        ("copy's end to the verification", med(lambda m: m["verify"][0] - copy_end(m)), ""),
        ("verification (headers re-read, check on DST)", med(lambda m: m["verify"][1]), ""),
        ("verification to in place", med(lambda m: m["in_place"][0] - m["verify"][0] - m["verify"][1]), ""),
        ("put in place (rename)", med(lambda m: m["in_place"][1]), ""),
        ("output and exit", med(lambda m: m["exit"][0] - m["in_place"][0] - m["in_place"][1]), ""),
    ]
    cp = statistics.median(r["wall"] for r in runs["cp"]) * 1000
    print(f"\nwhere {name}'s time goes (median of {len(staged)} in-process runs, ms; cp's median {cp:.0f} ms):")
    for name, ms, note in rows:
        print(f"  {name:52} {ms:7.0f}  {note}")
    print(f"  {'total (process CPU ' + format(med(lambda m: m['exit'][2]), '.0f') + ' ms)':52} "
          f"{floor * 1000 + med(lambda m: m['exit'][0]):7.0f}")


def fresh_output(work: Path, name: str) -> Path:
    """Where `name` writes next, after deleting every earlier output (of any command)."""
    for out in work.glob("out-*"):
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    return work / f"out-{name}"


def measure(cmd: list[str], env: dict | None = None) -> dict:
    os.sync()
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, check=True, env=env)
    result = json.loads(proc.stdout)
    if result["rc"] != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit status {result['rc']}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--keep", action="store_true", help="keep the generated draft and outputs")
    parser.add_argument("--draft", type=Path, help="a draft written by an earlier --keep run, used instead of a new one")
    parser.add_argument("--against", type=Path, metavar="LIB",
                        help="also run fix with PYTHONPATH=LIB (another checkout's lib/), alternating, and compare")
    parser.add_argument("--stages", action="store_true", help="then time fix's steps from inside, --repeat more runs")
    args = parser.parse_args()
    (ROOT / "build").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fix-speed-", dir=ROOT / "build"))
    try:
        src = args.draft.resolve() if args.draft else work / "src"
        if not args.draft:
            print(f"generating a Llama-3.1-8B-shaped speculators draft in {src} ...", flush=True)
            write_draft(src, LLAMA_8B, layout="speculators")
        size = (src / "model.safetensors").stat().st_size
        print(f"draft: {size / 1e9:.2f} GB, {args.repeat} runs each, alternating\n")
        commands = {
            "cp": lambda out: ["cp", str(src / "model.safetensors"), str(out)],
            "fix": lambda out: [str(BIN / "draftdoctor"), "fix", str(src), "--engine", "sglang==0.5.10", "--out", str(out)],
            "script": lambda out: [sys.executable, "-c", STORY_SCRIPT, str(src / "model.safetensors"), str(out)],
            "bare": lambda out: [sys.executable, "-c", BARE, str(src / "model.safetensors"), str(out),
                                 str(rewriter.CHUNK), str(rewriter.COMPARE_PIECE), str(rewriter.VERIFY_LAG)],
        }
        envs = {name: None for name in commands}
        if args.against:
            commands["before"] = commands["fix"]
            envs["before"] = dict(os.environ, PYTHONPATH=str(args.against.resolve()))
            compileall.compile_dir(args.against / "draftdoctor", quiet=1)
        compileall.compile_dir(ROOT / "lib" / "draftdoctor", quiet=1)
        from draftdoctor.diagnose import chosen_loader
        from draftdoctor.engines import resolve_engine

        print(f"fix verifies with the {chosen_loader(resolve_engine('sglang==0.5.10'), 'auto')} loader (auto)")
        runs = {name: [] for name in commands}
        paired = ["cp", "bare", "fix"] + (["before"] if args.against else [])
        order = [name for i in range(args.repeat) for name in (paired, paired[::-1])[i % 2]]
        for name in paired:  # warm-up, not counted: the first runs pay for memory the VM hands back lazily
            first = measure(commands[name](fresh_output(work, name)), envs[name])
            if name in ("fix", "before"):  # a release's worker is its code's: another lib starts its own
                print(f"first {name} (starts the real-loader worker if none runs): {first['wall']:.2f} s")
        print()
        for name in order + ["script"] * args.repeat:
            runs[name].append(measure(commands[name](fresh_output(work, name)), envs[name]))
        report(runs)
        if args.stages:
            floor = statistics.median(measure([sys.executable, "-c", "pass"])["wall"] for _ in range(args.repeat))
            kit = [name for name in paired if name in ("fix", "before")]
            staged = {name: [] for name in kit}
            for i in range(args.repeat):
                for name in (kit, kit[::-1])[i % 2]:
                    out = fresh_output(work, name)
                    os.sync()
                    proc = subprocess.run([sys.executable, "-c", STAGES, *commands[name](out)[1:]],
                                          capture_output=True, text=True, check=True, env=envs[name])
                    staged[name].append(json.loads(proc.stdout.splitlines()[-1]))
            for name, marks in staged.items():
                stage_report(runs, marks, floor, name)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def report(runs: dict) -> None:
    wall = {name: statistics.median(r["wall"] for r in rs) for name, rs in runs.items()}
    rss = {name: max(r["rss_kb"] for r in rs) / 1024 for name, rs in runs.items()}
    cpu = {name: statistics.median(r["cpu"] for r in rs) for name, rs in runs.items()}
    print(f"{'':8} {'median wall':>12} {'min..max':>14} {'x cp':>6} {'CPU (user+sys)':>15} {'peak RSS':>10}")
    for name, rs in runs.items():
        walls = [r["wall"] for r in rs]
        print(f"{name:8} {wall[name]:10.2f} s {min(walls):6.2f}..{max(walls):5.2f} s {wall[name] / wall['cp']:6.2f} "
              f"{cpu[name]:13.2f} s {rss[name]:7.0f} MB")
    ratio = wall["fix"] / wall["cp"]
    print(f"\nfix / cp wall time: {ratio:.2f}x (target <= 1.2x: {'met' if ratio <= 1.2 else 'MISSED'}); "
          f"fix peak RSS {rss['fix']:.0f} MB (target <= 80 MB: {'met' if rss['fix'] <= 80 else 'MISSED'}); "
          f"story script {wall['script'] / wall['cp']:.2f}x cp, {rss['script']:.0f} MB")
    paired = statistics.median(f["wall"] / c["wall"] for f, c in zip(runs["fix"], runs["cp"]))
    print(f"fix / cp of adjacent runs (median of {len(runs['fix'])} pairs; cancels the machine's drift): {paired:.2f}x")
    cpu_ratio = statistics.median(f["cpu"] / c["cpu"] for f, c in zip(runs["fix"], runs["cp"]))
    print(f"fix / cp CPU time (user+sys) of adjacent runs: {cpu_ratio:.2f}x (what a busy machine's wall time tends to)")
    fastest = min(r["wall"] for r in runs["fix"]) / min(r["wall"] for r in runs["cp"])
    print(f"fastest fix / fastest cp (the VM's slow spells only ever add time): {fastest:.2f}x")
    bare = statistics.median(b["wall"] / c["wall"] for b, c in zip(runs["bare"], runs["cp"]))
    over = statistics.median(f["wall"] / b["wall"] for f, b in zip(runs["fix"], runs["bare"]))
    print(f"bare copy-and-compare / cp of adjacent runs: {bare:.2f}x (fix's method alone: the floor under its "
          f"ratio); fix / bare: {over:.2f}x (what the kit adds to it)")
    if "before" in runs:
        walls = statistics.median(f["wall"] / b["wall"] for f, b in zip(runs["fix"], runs["before"]))
        cpus = statistics.median(f["cpu"] / b["cpu"] for f, b in zip(runs["fix"], runs["before"]))
        before = statistics.median(b["wall"] / c["wall"] for b, c in zip(runs["before"], runs["cp"]))
        print(f"fix / before of adjacent runs (median of {len(runs['fix'])} rounds): wall {walls:.3f}x, CPU time "
              f"{cpus:.3f}x; before / cp {before:.2f}x")


if __name__ == "__main__":
    main()
