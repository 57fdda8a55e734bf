"""The release sweep: every installed release of an engine runs its own loader over the differential
corpus (draftdoctor.proofs.differential: the synthetic cases and the public corpus of published drafts), and
one table says what each release does with each case and whether the replay's profile row says the same.

`python -m draftdoctor.proofs.sweep sglang --out docs/releases/sglang.md` (run by `make
sglang-loaders RELEASES=all`, likewise for vllm) writes the committed table; a release range in
`draftdoctor.engines` is split exactly where this table shows behaviour changing. Each release's warm
worker is stopped once its row is done (dozens of idle engines would not fit in memory).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# finding code -> its letter in the table (upper case an error, lower case a warning)
LETTERS = {"uninitialized-params": "U", "dropped-keys": "D", "loader-crash": "C", "shape-mismatch": "S",
           "config-unreadable": "X", "replay-not-modelled": "N"}


@dataclass
class ReleaseRow:
    release: str
    profile: str | None  # the replay's row for it (None: older than any profile row)
    seconds: float
    cells: dict = field(default_factory=dict)  # case -> letters
    disagreements: list[str] = field(default_factory=list)
    not_modelled: list[str] = field(default_factory=list)  # the replay does not model the case's class here
    error: str | None = None  # the real loader could not run at all


def letters(report) -> str:
    """A report's findings as letters (errors upper case, warnings lower case), "ok" for none."""
    found = sorted({(LETTERS.get(f.code, "?"), f.severity) for f in report.findings if f.severity != "info"})
    text = "".join(code if severity == "error" else code.lower() for code, severity in found)
    return text or "ok"


def sweep(engine_name: str, work: Path, progress=print, jobs: int = 1, releases=None) -> list[ReleaseRow]:
    """One row per installed release of `engine_name` (or of `releases`), oldest first; `jobs` releases at a time
    (each in its own child process: on 2 cores, two halve the sweep)."""
    from concurrent.futures import ThreadPoolExecutor

    from . import differential
    from ..realload.registry import installed_releases

    cases = differential.write_cases(work / "cases", engine_name)
    cases |= {f"public/{name}": folder for name, folder in differential.write_public(work / "public").items()}

    def run(release: str) -> ReleaseRow:
        row = sweep_release(engine_name, release, cases)
        progress(f"{engine_name} {release}: {row.seconds} s, {len(row.disagreements)} disagreement(s)"
                 + (f", failed: {row.error}" if row.error else ""))
        return row

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(run, releases or installed_releases(engine_name)))


def sweep_release(engine_name: str, release: str, cases: dict) -> ReleaseRow:
    """What `release`'s own loader does with each case, and where the replay's profile row disagrees."""
    from . import differential
    from ..checkpoint import open_checkpoint
    from ..replay import replay
    from ..engines import EngineRelease, EngineSpecError
    from ..realcheck import RealCheckError, coverage_from, real_checks
    from ..realload import run_real_loaders
    from ..realload.pool import stop_worker
    from ..realload.registry import RealLoaderError

    try:
        engine = EngineRelease.of(engine_name, release)
    except EngineSpecError:
        engine = None
    profile = engine.profile.spec if engine else None
    row = ReleaseRow(release, profile, 0.0)
    started = time.perf_counter()
    try:
        if profile:
            reals = real_checks(list(cases.values()), engine, timeout=1800)
        else:  # older than any profile row: the release's own reports, read with the oldest row's names
            raws = run_real_loaders(list(cases.values()), release, timeout=1800, engine_name=engine_name)
            reals = [coverage_from(raw, open_checkpoint(f), _oldest(engine_name)) for raw, f in zip(raws, cases.values())]
    except (RealLoaderError, RealCheckError, EngineSpecError, OSError) as e:
        row.error = str(e).splitlines()[0][:200]
        reals = []
    finally:
        stop_worker(engine_name, release)
    row.seconds = round(time.perf_counter() - started, 1)
    for (name, folder), real in zip(cases.items(), reals):
        row.cells[name] = letters(real)
        if profile:
            played = replay(open_checkpoint(folder), engine)
            if differential.not_modelled(played):
                row.not_modelled.append(name)
            elif differential.disagreements(name, played, real, engine, folder):
                row.disagreements.append(name)
    return row


def _oldest(engine_name: str):
    """The oldest release of `engine_name` a row models, as an EngineRelease."""
    from ..engines import EngineRelease, all_profiles

    return EngineRelease.of(engine_name, min((p for p in all_profiles() if p.engine_name == engine_name),
                                             key=lambda p: p.first).first)


def read_table(text: str) -> tuple[str, list[ReleaseRow]]:
    """The machine line and the rows of a table `markdown` wrote (cells with their marks read back)."""
    import re

    machine = re.search(r"\) on (.+?)\. One row per release run", text).group(1)
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    names = [cell.strip() for cell in lines[0].strip("|").split("|")][3:]
    rows = []
    for line in lines[1:]:
        release, profile, seconds, *cells = (cell.strip() for cell in line.strip().strip("|").split("|"))
        row = ReleaseRow(release, None if profile in ("none (older)", "–") else profile, float(seconds))
        if len(cells) == 1 and cells[0].startswith("could not run: "):
            row.error = cells[0].removeprefix("could not run: ")
        for name, cell in zip(names, cells if row.error is None else ()):
            letters, _, mark = cell.partition(" ")
            if letters != "–":
                row.cells[name] = letters
            {"≠": row.disagreements, "∅": row.not_modelled}.get(mark, []).append(name)
        rows.append(row)
    return machine, rows


def merged(old: list[ReleaseRow], new: list[ReleaseRow]) -> list[ReleaseRow]:
    """`old`'s rows with `new`'s in place of the same releases' and beside them, oldest first."""
    from ..engines import parse_version

    ran = {row.release: row for row in new}
    return sorted([row for row in old if row.release not in ran] + new, key=lambda row: parse_version(row.release))


def markdown(engine_name: str, rows: list[ReleaseRow], machine: str) -> str:
    """The committed table: releases as rows, cases as columns (in the order of the fullest row's cases)."""
    names = list(dict.fromkeys(name for row in sorted(rows, key=lambda r: -len(r.cells)) for name in row.cells))
    lines = [f"# {engine_name}: what each release's own loader does with the differential corpus", "",
             f"Written by `python -m draftdoctor.proofs.sweep {engine_name}` (`make {engine_name}-loaders RELEASES=all`) on "
             f"{machine}. One row per release run; one column per case of `draftdoctor.proofs.differential` (a layout, "
             "a missing or extra tensor, a config option, a draft class's quirk; `public/`: a published draft of "
             "tests/corpus/public, rebuilt header-only). Cells: the real loader's findings "
             + ", ".join(f"{letter} {code}" for code, letter in LETTERS.items())
             + " (upper case an error, lower case a warning; ok: none); `≠` marks a case where the replay's profile "
             "row says otherwise (none should), `∅` one whose draft class the replay does not model for that "
             "release (its verdict is 'not checked': nothing to compare), `–` one not in the corpus when that "
             "release last ran. Profile rows are split where this table shows behaviour changing.", "",
             "| release | profile row | s | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for row in rows:
        if row.error:
            lines.append(f"| {row.release} | {row.profile or '–'} | {row.seconds} | could not run: {row.error} |")
            continue
        cells = [row.cells.get(n, "–") + (" ≠" if n in row.disagreements else " ∅" if n in row.not_modelled else "")
                 for n in names]
        lines.append(f"| {row.release} | {row.profile or 'none (older)'} | {row.seconds} | " + " | ".join(cells) + " |")
    total = sum(len(r.disagreements) for r in rows)
    lines += ["", f"{len(rows)} releases; {total} case(s) where the replay disagrees with the release's own loader.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    import platform

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", choices=("sglang", "vllm"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=2, help="releases run at once (default 2: the machines' cores)")
    ap.add_argument("--releases", nargs="+", metavar="RELEASE",
                    help="run these installed releases only, and put their rows into the table --out already holds "
                         "(the others' rows kept as they last ran)")
    args = ap.parse_args(argv)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    machine = f"{time.strftime('%Y-%m-%d')}, {cpu}"
    with tempfile.TemporaryDirectory(prefix="draftdoctor-sweep-") as work:
        rows = sweep(args.engine, Path(work), progress=lambda m: print(m, file=sys.stderr), jobs=args.jobs,
                     releases=args.releases)
    failed = any(r.disagreements or r.error for r in rows)
    if args.releases and args.out.is_file():
        first, old = read_table(args.out.read_text())
        machine = f"{first} ({', '.join(r.release for r in rows)} run again {machine})"
        rows = merged(old, rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(args.engine, rows, machine))
    print(f"wrote {args.out}: {len(rows)} releases", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
