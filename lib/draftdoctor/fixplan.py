"""What `fix` will do, as a value: the plan (`FixPlan`: each tensor's move, the config rewrite, the
files copied), its verdict (`check` on the result, worked out by `judge`), and why it is refused
(`FixBlocked`: an error finding the rewrite cannot remove, or a loss not accepted with
`--allow-lossy`). `fix.plan_fix` makes one; `fixwrite.apply_fix` carries it out.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import findings as F
from .checkpoint import Checkpoint
from .checks import OPTION_CODES
from .configrewrite import ABSENT, ConfigRewrite
from .coverage import CoverageReport
from .engines import EngineRelease
from .errors import UserError
from .frames import frame
from .layouts import Layout
from .predict import PredictionSpec

# errors that are a loss the user may accept (`--allow-lossy`): an option or norm the engine does not
# compute; every other error blocks the fix
LOSS_CODES = ("lossy-config", "qk-norm-unsupported", *OPTION_CODES.values())


class FixError(UserError):
    """Why `fix` cannot proceed: unusable input or an unsafe destination (exit 2)."""


# What a plan that changes nothing means, said by `fix` (and read by investigate's report)
NOTHING_TO_CHANGE = ("nothing to change: every tensor already has the name {engine} reads and the config is one it "
                     "reads, so the copy is, to the engine, the draft itself. If the draft gets no acceptance, the "
                     "cause is not in names or config: see the values (`draftdoctor check --target TARGET` runs "
                     "the draft on the target; `draftdoctor compare TRAINED THIS` says how its tensors differ "
                     "from the training output)")


class FixBlocked(FixError):
    """The fixed checkpoint would still carry error findings: nothing is written (exit 1)."""

    def __init__(self, plan: "FixPlan", findings: list[F.Finding], lossy: bool):
        self.plan, self.findings = plan, findings
        what = ("the engine cannot compute what the draft was trained with" if lossy
                else "no rewrite of names or config makes it serve correctly")
        lines = [f"{f.brief()} (what you can do: {F.CODES[f.code].remedy})" for f in findings]
        super().__init__(f"refused, nothing written: the fixed checkpoint would still carry {len(findings)} error "
                         f"finding(s) for {plan.engine} ({what}): " + "; ".join(lines)
                         + ("; pass --allow-lossy to write it anyway" if lossy else ""))


@dataclass(frozen=True)
class TensorMove:
    """One tensor of the source and what the fix does with it."""

    old: str
    new: str | None  # None: left out
    file: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    reason: str

    @property
    def action(self) -> str:
        return "omit" if self.new is None else "rename" if self.new != self.old else "keep"


@dataclass(frozen=True)
class FileCopy:
    """A file of the source folder besides the weights and config, and whether it is copied."""

    name: str
    copy: bool
    reason: str


@dataclass
class FixPlan:
    """Everything `apply_fix` will do, decided from headers, and the coverage it predicts."""

    src: Path
    engine: EngineRelease  # what the plan is for (its `.spec` for display)
    checkpoint: Checkpoint = field(repr=False)
    layout: Layout
    rule: str
    tensors: list[TensorMove]
    config: ConfigRewrite
    files: list[FileCopy]
    predicted: CoverageReport | None = field(repr=False)  # `check`'s report on the result (None until judged)
    findings: list[F.Finding] | None  # its findings and the plan's own (None until judged)
    target_config: dict | None = field(repr=False, default=None)  # the target's config (fix --target)
    # which loader verifies the written draft (diagnose.LOADERS); the plan itself is always replayed:
    # a renamed checkpoint that exists only as headers is nothing an engine's own loader can read
    loader: str = "replay"
    # what the prediction of acceptance runs (a target with weights), for the plan and the verification alike
    prediction: PredictionSpec | None = field(repr=False, default=None)
    # how `predicted` and `findings` are worked out, until they are (`judge`); the value scan's hits on the way
    judging: object = field(repr=False, default=None)
    value_hits: list | None = field(repr=False, default=None)

    def judge(self) -> "FixPlan":
        """Work out `predicted` and `findings` (`check` on the result) if `plan_fix(judge=False)` left them."""
        if self.judging is not None:
            self.predicted, self.findings, self.value_hits = self.judging()
            self.judging = None
        return self

    @property
    def renamed(self) -> list[TensorMove]:
        return [t for t in self.tensors if t.action == "rename"]

    @property
    def omitted(self) -> list[TensorMove]:
        return [t for t in self.tensors if t.action == "omit"]

    @property
    def bytes_to_copy(self) -> int:
        return sum(t.nbytes for t in self.tensors if t.new is not None)

    @property
    def lossy(self) -> list[F.Finding]:
        """Errors that are losses `--allow-lossy` accepts (LOSS_CODES)."""
        return [f for f in self.findings if f.severity == F.ERROR and f.code in LOSS_CODES]

    @property
    def blocking(self) -> list[F.Finding]:
        """Errors that stop `apply_fix` whatever the flags, and a draft class fix cannot verify."""
        return [f for f in self.findings if f.severity == F.ERROR and f.code not in LOSS_CODES
                or f.code == "replay-not-modelled"]

    def can_apply(self, allow_lossy: bool = False) -> bool:
        return not self.blocking and (allow_lossy or not self.lossy)

    def refusal(self, allow_lossy: bool = False) -> FixBlocked | None:
        """Why `apply_fix` would refuse this plan (None: it would not)."""
        if self.blocking:  # for a class the replay does not model, the rest of its findings are guesses
            unmodelled = [f for f in self.blocking if f.code == "replay-not-modelled"]
            return FixBlocked(self, unmodelled or self.blocking, lossy=False)
        if self.lossy and not allow_lossy:
            return FixBlocked(self, self.lossy, lossy=True)
        return None

    def rows(self) -> list[dict]:
        """Plan rows (kind, old, new, reason): tensors, then config changes, then files."""
        rows = [{"kind": "tensor", "old": t.old, "new": t.new, "reason": t.reason} for t in self.tensors]
        rows += [{"kind": "config", "old": f"{c.field} = {_show(c.before)}",
                  "new": None if c.after == ABSENT else f"{c.moved_to or c.field} = {_show(c.after)}", "reason": c.reason}
                 for c in self.config.changes]
        rows += [{"kind": "file", "old": f.name, "new": f.name if f.copy else None, "reason": f.reason} for f in self.files]
        return rows

    def frame(self):
        """The plan as a DataFrame: old name -> new name per tensor, config change, and file."""
        return frame(self.rows(), columns=["kind", "old", "new", "reason"])

    @property
    def changes_nothing(self) -> bool:
        """Whether the rewrite leaves everything the engine reads as it is: no tensor renamed or left out,
        no config change (the copy is the draft itself, to the engine)."""
        return not (self.renamed or self.omitted or self.config.changes)

    def to_dict(self) -> dict:
        return {
            "src": str(self.src), "engine": self.engine.spec, "changes_nothing": self.changes_nothing,
            "layout": {"name": self.layout.name, "evidence": list(self.layout.evidence)}, "rule": self.rule,
            "tensors": [asdict(t) | {"action": t.action} for t in self.tensors],
            "config": {"format": self.config.format, "changes": [asdict(c) for c in self.config.changes],
                       "written": self.config.config},
            "files": [asdict(f) for f in self.files],
            "bytes_to_copy": self.bytes_to_copy,
            "predicted": {"verdict": self.predicted.verdict, "errors": [f.code for f in self.predicted.errors]},
            "findings": [asdict(f) for f in self.findings],
        }


def _show(value) -> str:
    return value if value == ABSENT else json.dumps(value)
