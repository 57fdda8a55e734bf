"""Every verdict the kit gives on the differential corpus, as one JSON file: the proof that a refactoring
changed no behaviour is two runs of this script (before and after) writing identical files.

    python tests/verdict_snapshot.py OUT.json            # the replay, every release row of every engine
    python tests/verdict_snapshot.py OUT.json --real     # and each installed release's own loader (the sweep)

Only the public entry points are used (`resolve_engine`, `diagnose.check`, the corpus writers), so the same
script runs against the code before and after a change (`PYTHONPATH=<that checkout>/lib`). Each case's report
is `check --json`'s dictionary, with the temporary folder's path replaced by `<root>`.
"""

from __future__ import annotations

import argparse
import json
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--real", action="store_true", help="also each installed release's own loader")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="verdict-snapshot-") as tmp:
        got = reports(Path(tmp), args.real)
        text = json.dumps(got, indent=1, sort_keys=True, default=str).replace(tmp, "<root>")
    args.out.write_text(text + "\n")
    print(f"{len(got)} reports -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
