"""Every replay verdict and fix plan the engine rows give, as one JSON file: the proof that a change to how
the rows are written (not what they say) changes no verdict.

For each profile row's first and last release (every engine, every draft class), over the differential
corpus (`proofs.differential.write_cases` for SGLang and vLLM, `write_public`), it dumps each replay's
parameter fates, key fates and findings (code, severity, message) and each `fix` plan's tensors and
findings; beside it (`<out>.rows.json`), every row's every fact as callers read it (`row.<fact>`).
Run it on two checkouts over one corpus folder (messages name the drafts' paths) and compare:
  PYTHONPATH=<checkout A>/lib .venv/bin/python benchmarks/verdict_snapshot.py /tmp/corpus a.json
  PYTHONPATH=<checkout B>/lib .venv/bin/python benchmarks/verdict_snapshot.py /tmp/corpus b.json
  cmp a.json b.json && cmp a.rows.json b.rows.json
"""

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.engines import Profile, all_profiles
from draftdoctor.fix import plan_fix
from draftdoctor.proofs.differential import write_cases, write_public
from draftdoctor.replay import replay


def _facts() -> list[str]:
    """The names callers read a row's facts by: its stage records' fields (its own, before there were stages),
    less the renames, whose spelling changed (the replay's key fates show what they do)."""
    from draftdoctor.engines import profile as module

    records = getattr(module, "STAGES", {"": Profile}).values()
    names = {f.name for record in records for f in dataclasses.fields(record)} | {"ignored_keys"}
    return sorted(names - {"engine", "first", "last", "legacy_renames", "renames"})


def _write(path: Path, data) -> str:
    text = json.dumps(data, indent=1, sort_keys=True, default=str)
    path.write_text(text)
    return f"{path}: {len(data)} entries, {len(text)} bytes, sha256 {hashlib.sha256(text.encode()).hexdigest()}"


def main(corpus: Path, out: Path) -> None:
    cases = {}
    for engine in ("sglang", "vllm"):
        cases |= {f"{engine}/{k}": v for k, v in write_cases(corpus / engine, engine).items()}
    cases |= {f"public/{k}": v for k, v in write_public(corpus / "public").items()}
    releases = sorted({(p.engine, r) for p in all_profiles() for r in (p.first, p.last)})
    dump = {}
    for engine, release in releases:
        spec = f"{engine}=={release}"
        for name, folder in sorted(cases.items()):
            r = replay(open_checkpoint(folder), spec)
            plan = plan_fix(folder, spec, predict=False)
            dump[f"{spec} {name}"] = {
                "params": [[p.name, p.role, list(p.shape), p.status, p.keys, p.shards_written, p.shards_missing,
                            p.replaced_by_target] for p in r.params],
                "keys": [[k.key, k.status, k.param, k.shard, k.reason] for k in r.keys],
                "findings": [[f.code, f.severity, f.message] for f in r.findings],
                "fix": {"rule": plan.rule, "tensors": [[t.old, t.new, t.reason] for t in plan.tensors],
                        "findings": [[f.code, f.severity, f.message] for f in plan.findings]}}
    print(_write(out, dump))
    rows = {f"{p.engine} {p.first}-{p.last} {p.draft_class} {i}": {n: repr(getattr(p, n)) for n in _facts()}
            | {"spec": p.spec, "assumptions": p.assumptions()} for i, p in enumerate(all_profiles())}
    print(_write(out.with_suffix(".rows.json"), rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
