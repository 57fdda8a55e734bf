"""Every verdict the kit gives on the differential corpus, as one JSON file: the proof that a refactoring
changed no behaviour is two runs of this script (before and after) that `--same` finds alike.

    python tests/verdict_snapshot.py OUT.json            # the replay, every release row of every engine
    python tests/verdict_snapshot.py OUT.json --real     # and each installed release's own loader (the sweep)
    python tests/verdict_snapshot.py --same A.json B.json   # exit 0 when the two say the same

Only the public entry points are used (`resolve_engine`, `diagnose.check`, the corpus writers), so the same
script runs against the code before and after a change (`PYTHONPATH=<that checkout>/lib`). Each case's report
is `check --json`'s dictionary, with the temporary folder's path replaced by `<root>`. What an engine's own
message owes to the machine rather than to the code is set or left out: the children's string hashing
(PYTHONHASHSEED, set here: vLLM prints Python sets), the memory budget (set here unless given: above it a draft
is built on the meta device, and says so) and, for files written before both were set, `--same` reads object
addresses, a printed set's order and the meta-device note as the same.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path


def reports(root: Path, real: bool) -> dict:
    from draftdoctor.diagnose import check
    from draftdoctor.engines import all_profiles, resolve_engine
    from draftdoctor.proofs import differential

    public = differential.write_public(root / "public")
    out = {}
    for name in ("sglang", "vllm", "llamacpp"):
        cases = differential.write_cases(root / name, name) | {f"public/{k}": v for k, v in public.items()}
        rows = [p for p in all_profiles() if p.engine == name]
        releases = sorted({r for p in rows for r in (p.first, p.last)})
        runs = [(release, "replay") for release in releases]
        if real and name != "llamacpp":
            from draftdoctor.realload.registry import installed_releases

            runs += [(release, "real") for release in installed_releases(name)
                     if any(p.contains(release) for p in rows)]
        for release, loader in runs:
            engine = resolve_engine(f"{name}=={release}")
            for case, folder in cases.items():
                try:
                    got = check(folder, engine, loader=loader, predict=False).to_dict()
                except Exception as e:  # a refusal is an outcome too: its type and first line
                    got = {"raised": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else ""}
                out[f"{name}=={release} {loader} {case}"] = got
            if loader == "real":
                from draftdoctor.realload.pool import stop_worker

                stop_worker(name, release)
    return out


PRINTED_SET = re.compile(r"\{('[^'{}]*'(?:, '[^'{}]*')*)\}")


def _machine_free(text: str) -> dict:
    """A snapshot with what the machine decided left out: object addresses, the order of a printed set, the
    note that a draft was built on the meta device."""
    def sets_in_order(said: str) -> str:  # a printed set of strings, its elements sorted
        return PRINTED_SET.sub(lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", said)

    got = json.loads(re.sub(r"0x[0-9a-f]{6,}", "0x?", text))
    for report in got.values():
        if "findings" in report:
            report["findings"] = [f for f in report["findings"]
                                  if not (f["code"] == "not-checked" and "meta device" in f["message"])]
            for f in report["findings"]:
                f["message"] = sets_in_order(f["message"])
            report["verdict"] = sets_in_order(report["verdict"])
    return got


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--real", action="store_true", help="also each installed release's own loader")
    parser.add_argument("--same", nargs=2, type=Path, metavar=("A", "B"), help="compare two snapshots")
    args = parser.parse_args(argv)
    if args.same:
        a, b = (_machine_free(p.read_text()) for p in args.same)
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        print(f"{len(a)} and {len(b)} reports; {len(differ)} differ" + "".join(f"\n  {k}" for k in differ[:20]))
        return 1 if differ else 0
    if args.out is None:
        parser.error("OUT is required")
    os.environ["PYTHONHASHSEED"] = "0"  # the children's: an engine's printed set in one order
    os.environ.setdefault("DRAFTDOCTOR_MEMORY_BUDGET", "4G")
    with tempfile.TemporaryDirectory(prefix="verdict-snapshot-") as tmp:
        got = reports(Path(tmp), args.real)
        text = json.dumps(got, indent=1, sort_keys=True, default=str).replace(tmp, "<root>")
    args.out.write_text(text + "\n")
    print(f"{len(got)} reports -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
