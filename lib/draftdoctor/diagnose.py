"""The diagnosis of a draft for an engine release: load coverage (replayed or real) plus the checks
beyond names. `diagnose` is the one verdict every command and notebook asks for: `check`, `fix`
(its plan and its verification), `bench`'s and `investigate`'s pre-flight.

It sits above the replay (`coverage`), the real loader (`realcheck`), the other checks (`checks`) and
the values (`values`: tensors still at initial values, judged by what this engine serves with), which
know nothing of each other; the checkpoint is opened once. Given a target with weights, it also runs
the loaded draft on the target (`predict`), and the prediction outranks the value rules: a tensor that
looks untrained (or a t2d, which no engine reads, at odds with d2t) is an error only while the prediction
does not say the draft works.
"""

from __future__ import annotations

from . import findings as F
from .checkpoint import Checkpoint, open_checkpoint
from .checks import T2D_DISAGREES, draft_checks, read_target_config
from .coverage import CoverageReport, read_dims
from .replay import replay
from .engines import EngineRelease, expect_release, resolve_engine
from .predict import PredictionSpec
from .realcheck import RealCheckError, real_check

LOADERS = ("auto", "replay", "real")
# findings after which a server starts and then fails at the first draft step, or serves a draft
# built for another target: `bench` and `investigate` stop before launching on them
MISFIT_CODES = ("target-mismatch", "aux-layer-uncapturable")
# what the value rules infer about training (draftdoctor.values): evidence the prediction outranks. Not a
# non-finite value (nan-weights) or a mislabelled dtype: those are facts about the bytes, whose cost depends on
# the prompts (one inf in the demo draft's lm_head: 1.92 against 3.24, predicted to work on 16 prompts)
VALUE_CODES = ("weights-at-init",)


def diagnose(checkpoint: Checkpoint, engine: EngineRelease, loader: str = "replay", target_config: dict | None = None,
             prediction: PredictionSpec | None = None, values: list | None = None,
             chosen: str | None = None) -> CoverageReport:
    """The coverage report of `engine` (an EngineRelease) loading the open `checkpoint`, plus the
    checks beyond names (draftdoctor.checks), against the target's config when one is given, plus the
    predicted acceptance when `prediction` says with which target and prompts. `values`: the value
    scan's hits (`values.scan`) when they are known already (`fix`'s verification: the plan's, of the
    same names over bytes compared equal); otherwise the values are scanned. `chosen`: what
    `chosen_loader(engine, loader)` said, when the caller asked it already (`fix` asks while its copy
    is written, not after it); otherwise it is asked here."""
    from .values import scan, value_findings  # here: numpy's import (60-90 ms) waits until values are read

    if loader not in LOADERS:
        raise ValueError(f"unknown loader {loader!r}: use one of {', '.join(LOADERS)}")
    expect_release(engine)
    # a config value no engine could read is the user's error, whichever loader runs; a field the kit cannot read
    # (missing, null) is said in the report, with what was taken from the tensors instead
    dims, unread = read_dims(checkpoint)
    if (chosen or chosen_loader(engine, loader)) == "real":
        try:
            report = real_check(checkpoint, engine, target_config=target_config, dims=dims)
        except RealCheckError as e:
            if loader != "auto":
                raise
            report = replay(checkpoint, engine, dims)  # auto: the replay answers when the real loader cannot
            report.findings.append(F.finding("not-checked", f"the {engine} real loader could not run ({str(e)[:300]}); "
                                                            "the replay ran instead", severity=F.INFO))
    else:
        report = replay(checkpoint, engine, dims)
    report.findings += [unread] if unread is not None else []
    # the draft-class row the report was made with: computed once per verdict, as its dims were
    report.findings += draft_checks(checkpoint, report.profile, dims, target_config)
    if values is None:
        values = scan(checkpoint, dims.vocab_size, dims.draft_vocab_size)
    report.findings += value_findings(values, report)
    if prediction is not None:
        _predict(report, prediction, checkpoint)
    return report


def _predict(report: CoverageReport, spec: PredictionSpec, checkpoint: Checkpoint) -> None:
    """Run the loaded draft on the target (`predict`) and let what it does outrank what the value rules
    say: a draft predicted to work (sure of it within the prediction's error) has its value errors said as
    warnings; one predicted to accept nothing gets the prediction's error beside them; in between (too few
    prompts to tell) the rules stand."""
    from .predict import PredictionUnavailable, findings, predict

    misfit = [f for f in report.errors if f.code in MISFIT_CODES]
    if misfit:  # its ids or sizes are not the target's: nothing to run it on
        report.findings.append(F.finding("not-checked", f"no prediction of acceptance: the draft does not fit the "
                                                        f"target ({misfit[0].code})", severity=F.INFO))
        return
    try:
        report.prediction = predict(report, spec, checkpoint)
    except PredictionUnavailable as e:
        report.findings.append(F.finding("not-checked", f"no prediction of acceptance: {e}", severity=F.INFO))
        return
    if report.prediction.works:
        report.findings = [F.Finding(f.code, F.WARNING, f"{f.message} (yet the draft as loaded is predicted to work: "
                                                          f"{report.prediction.text().split(' (')[0]})")
                           if _outranked(f) else f for f in report.findings]
    report.findings += findings(report.prediction, report)


def _outranked(f: F.Finding) -> bool:
    """An error a prediction that the draft works outranks: what the value rules say, and a t2d (which no engine
    reads) that disagrees with the d2t the prediction ran."""
    return f.severity == F.ERROR and (f.code in VALUE_CODES or f.code == "vocab-map-invalid"
                                      and f.message.startswith(T2D_DISAGREES))


def chosen_loader(engine: EngineRelease, loader: str) -> str:
    """"real" or "replay": `auto` is the release's own loader where it is installed here, else the replay."""
    if loader != "auto":
        return loader
    from .realload.registry import REAL_LOADERS as REAL, installed_releases

    return "real" if engine.name in REAL and engine.release in installed_releases(engine.name) else "replay"


def check(path, engine: "str | EngineRelease", loader: str = "replay", target=None,
          predict: bool | PredictionSpec = True) -> CoverageReport:
    """`diagnose` of the checkpoint at `path`, against the target at `target` (folder or config.json), for
    `engine`: an EngineRelease, or a spec such as 'sglang==0.5.10' (an edge: a notebook calls it with one).

    loader "replay": replay the engine profile over the headers (instant, no engine needed);
    "real": run the release's own loader on CPU (draftdoctor.realcheck; needs `make sglang-loaders`
    or `make vllm-loaders`); "auto": real where that release is installed, else replay (the CLI's default).
    `predict`: run the loaded draft on a target folder with weights (the demo's prompts), or with the
    given `PredictionSpec`; False: names, configs and values only.
    """
    target_config = read_target_config(target) if target is not None else None
    spec = predict if isinstance(predict, PredictionSpec) else prediction_spec(target) if predict else None
    report = diagnose(open_checkpoint(path), resolve_engine(engine), loader, target_config, spec)
    if predict and spec is None and target is not None:
        report.findings.append(F.finding("not-checked", f"no prediction of acceptance: {target} holds no weights to run "
                                                        "the target on (give the target's folder)", severity=F.INFO))
    return report


def prediction_spec(target, **given) -> PredictionSpec | None:
    """What a prediction with `target` runs (`given`: PredictionSpec's fields), or None when `target` is not
    a folder holding weights (a config.json alone)."""
    from pathlib import Path

    folder = Path(target) if target is not None else None
    if folder is None or not folder.is_dir() or not (any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))):
        return None
    return PredictionSpec(folder, **{k: v for k, v in given.items() if v is not None})


def misfits(path, engine, target) -> list[F.Finding]:
    """The findings that make `path` unfit to serve with the target at `target` on `engine`
    (MISFIT_CODES), from the same diagnosis as `check`."""
    return [f for f in check(path, engine, target=target).errors if f.code in MISFIT_CODES]
