"""The diagnosis of a draft for an engine release: load coverage (replayed or real) plus the checks
beyond names. `diagnose` is the one verdict every command and notebook asks for: `check`, `fix`
(its plan and its verification), `bench`'s and `investigate`'s pre-flight.

It sits above the replay (`coverage`), the real loader (`realcheck`), the other checks (`checks`) and
the values (`values`: tensors still at initial values, judged by what this engine serves with), which
know nothing of each other; the checkpoint is opened once.
"""

from __future__ import annotations

from . import findings as F
from .checkpoint import Checkpoint, open_checkpoint
from .checks import draft_checks, read_target_config
from .coverage import CoverageReport, draft_dims
from .replay import replay
from .engines import resolve_engine
from .realcheck import RealCheckError, real_check
from .values import scan, value_findings

LOADERS = ("auto", "replay", "real")
# findings after which a server starts and then fails at the first draft step, or serves a draft
# built for another target: `bench` and `investigate` stop before launching on them
MISFIT_CODES = ("target-mismatch", "aux-layer-uncapturable")


def diagnose(checkpoint: Checkpoint, engine, loader: str = "replay", target_config: dict | None = None) -> CoverageReport:
    """The coverage report of `engine` (an Engine, or a spec) loading the open `checkpoint`, plus the
    checks beyond names (draftdoctor.checks), against the target's config when one is given."""
    if loader not in LOADERS:
        raise ValueError(f"unknown loader {loader!r}: use one of {', '.join(LOADERS)}")
    engine = resolve_engine(engine)
    dims = draft_dims(checkpoint)  # a config value no engine could read is the user's error, whichever loader runs
    if chosen_loader(engine, loader) == "real":
        try:
            report = real_check(checkpoint, engine, target_config=target_config)
        except RealCheckError as e:
            if loader != "auto":
                raise
            report = replay(checkpoint, engine)  # auto: the replay answers when the real loader cannot
            report.findings.append(F.finding("not-checked", f"the {engine} real loader could not run ({str(e)[:300]}); "
                                                            "the replay ran instead", severity=F.INFO))
    else:
        report = replay(checkpoint, engine)
    report.findings += draft_checks(checkpoint, engine.profile_for(checkpoint.config), dims, target_config)
    report.findings += value_findings(scan(checkpoint, dims.vocab_size, dims.draft_vocab_size), report)
    return report


def chosen_loader(engine, loader: str) -> str:
    """"real" or "replay": `auto` is the release's own loader where it is installed here, else the replay."""
    if loader != "auto":
        return loader
    from .realload import LOADERS as REAL, installed_releases

    engine = resolve_engine(engine)
    return "real" if engine.name in REAL and engine.release in installed_releases(engine.name) else "replay"


def check(path, engine, loader: str = "replay", target=None) -> CoverageReport:
    """`diagnose` of the checkpoint at `path`, against the target at `target` (folder or config.json).

    loader "replay": replay the engine profile over the headers (instant, no engine needed);
    "real": run the release's own loader on CPU (draftdoctor.realcheck; needs `make sglang-loaders`
    or `make vllm-loaders`); "auto": real where that release is installed, else replay (the CLI's default).
    """
    target_config = read_target_config(target) if target is not None else None
    return diagnose(open_checkpoint(path), engine, loader, target_config)


def misfits(path, engine, target) -> list[F.Finding]:
    """The findings that make `path` unfit to serve with the target at `target` on `engine`
    (MISFIT_CODES), from the same diagnosis as `check`."""
    return [f for f in check(path, engine, target=target).errors if f.code in MISFIT_CODES]
