"""The diagnosis of a draft for an engine release: load coverage (replayed or real) plus the checks
beyond names. `check` is the one entry point every command and notebook asks for a verdict.

It sits above the replay (`coverage`), the real loader (`realcheck`) and the other checks (`checks`),
which know nothing of each other; the checkpoint is opened once.
"""

from __future__ import annotations

from .checkpoint import open_checkpoint
from .checks import draft_checks, read_target_config
from .coverage import CoverageReport, draft_dims, replay
from .engines import resolve_engine
from .realcheck import real_check

LOADERS = ("replay", "real")


def check(path, engine, loader: str = "replay", target=None) -> CoverageReport:
    """The coverage report of `engine` (an Engine, or a spec) loading the checkpoint at `path`, plus the checks beyond
    names (draftdoctor.checks), against the target's config when `target` (folder or config.json) is given.

    loader "replay": replay the engine profile over the headers (instant, no engine needed);
    "real": run the release's own loader on CPU (draftdoctor.realcheck; needs `make sglang-loaders`).
    """
    if loader not in LOADERS:
        raise ValueError(f"unknown loader {loader!r}: use one of {', '.join(LOADERS)}")
    engine = resolve_engine(engine)
    checkpoint = open_checkpoint(path)
    target_config = read_target_config(target) if target is not None else None
    if loader == "real":
        report = real_check(checkpoint, engine)
    else:
        report = replay(checkpoint, engine)
    report.findings += draft_checks(checkpoint, engine.profile, draft_dims(checkpoint), target_config)
    return report
