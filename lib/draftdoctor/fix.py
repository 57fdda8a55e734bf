"""`draftdoctor fix`: rewrite a draft checkpoint so that an engine loads every tensor, and prove it.

`plan_fix` decides, from headers alone: new tensor names (the rules in `renames`), the config the
engine reads (`configs.rewrite_config`), the other files to copy, and `check`'s verdict on the result
(`diagnose` over the renamed headers, with the target's config when one is given). A plan whose
result would carry an error finding is refused (`FixBlocked`), unless the only errors are losses
the user accepts (`--allow-lossy`). `apply_fix` carries the plan
out without loading a tensor, through `rewriter` (which knows nothing of engines): each shard gets a
new header and its data bytes are copied by the kernel (`copy_file_range`, else `sendfile`, else a
bounded buffer) into a temporary folder beside DST, 4 MB at a time, while a second thread reads
each copied chunk back from SRC and DST and compares the two, close behind the copy so both are
usually still in the CPU cache. Then DST's
headers are re-read and checked against the plan and diagnosed again as `check` would;
only a verified result is renamed into place. SRC is only ever opened for reading, and on any
failure or interrupt everything written is removed.

Why compare chunks in the cache rather than hash: copying 1.9 GB from the page cache is bound by
memory bandwidth (`cp` 0.5 s here). Hashing SRC and DST afterwards reads 3.8 GB more from memory
and took 2-3x `cp`; CRC-32 alone costs 1.3 CPU-seconds and SHA-256 about 4. Reading a chunk back
while it is cache-hot costs a cache-speed copy, on the other core, and the check is exact.
Why one writer: threads writing one file contend for its inode lock (the kernel spins on it), and
`pwrite` from a user buffer measured far slower than the kernel's own page-to-page copy.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import findings as F
from .checkpoint import (CONFIG_NAME, INDEX_NAME, PICKLE_SUFFIXES, Checkpoint, CheckpointError, ShardHeader,
                         TensorInfo, in_hf_cache_blobs, open_checkpoint)
from .configs import (ABSENT, FLAT, MISSING, UNKNOWN, ConfigChange, ConfigRewrite, config_format, draft_options,
                      layer_options, rewrite_config, unsupported_options)
from .checks import OPTION_CODES, TENSOR_OPTIONS, WITHOUT, option_keys, read_target_config
from .coverage import CoverageReport, draft_dims
from .replay import unmodelled_class
from .provenance import recognise
from .predict import PredictionSpec
from .engines import EngineRelease, parameters, resolve_engine
from .layouts import Layout, detect_layout
from .renames import choose
from .errors import UserError
from .frames import frame
from . import rewriter
from .rewriter import RewriteError, WrittenTensor

MARKER = ".draftdoctor-fix.json"  # in every folder fix writes: the files it wrote, so --force replaces only those


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


def _renamed_checkpoint(ckpt: Checkpoint, names: dict[str, str | None], config: dict) -> Checkpoint:
    """The checkpoint as the engine would see it after the renames (same files and offsets)."""
    shards = []
    for s in ckpt.shards:
        tensors = [TensorInfo(names[t.name], t.dtype, t.shape, t.file, t.begin, t.end)
                   for t in s.tensors if names[t.name] is not None]
        shards.append(ShardHeader(s.path, s.header_len, tensors, s.metadata))
    return Checkpoint(ckpt.path, shards, {t.name: t for s in shards for t in s.tensors}, config, None)


def _other_files(ckpt: Checkpoint) -> list[FileCopy]:
    """Files next to the weights: tokenizer, generation config, README... copied; weights in other
    formats and sub-folders are not (they would carry the old names or be ambiguous to loaders)."""
    if not ckpt.path.is_dir():
        return []
    own = {s.path.name for s in ckpt.shards} | {INDEX_NAME, CONFIG_NAME}
    out = []
    for entry in sorted(ckpt.folder.iterdir()):
        if entry.name in own:
            continue
        if entry.is_symlink() and not in_hf_cache_blobs(ckpt.folder, entry):
            out.append(FileCopy(entry.name, False, "a symbolic link; not copied (fix copies only files inside the "
                                                   "checkpoint folder, or a Hugging Face cache's blobs)"))
        elif entry.is_dir():
            out.append(FileCopy(entry.name, False, "sub-folder; not copied"))
        elif entry.name.endswith((".safetensors", ".safetensors.index.json")):
            out.append(FileCopy(entry.name, False, "weights outside this checkpoint; not copied"))
        elif entry.suffix in PICKLE_SUFFIXES:
            out.append(FileCopy(entry.name, False, "pickled weights under the old names; not copied"))
        elif entry.is_file():
            out.append(FileCopy(entry.name, True, "copied unchanged"))
        else:
            out.append(FileCopy(entry.name, False, "not a regular file; not copied"))
    return out



def plan_fix(src, engine: "str | EngineRelease", target=None, loader: str = "replay", head_from_target: bool = False,
             predict: bool | PredictionSpec = True, judge: bool = True) -> FixPlan:
    """Plan the rewrite of the draft at `src` for `engine` (an EngineRelease, or a spec such as
    'sglang==0.5.10': an edge, which a notebook calls with one), from headers alone; `target` (folder or config.json): the target it serves with,
    for the checks that need it, and with weights, for the prediction of acceptance (`predict` as for
    `diagnose.check`). `head_from_target`: the config remedy for a draft without lm_head
    (`head_from_target_change`), applied only where it is safe, else FixError. `judge=False` leaves
    `check` on the result (`predicted`, `findings`: the value scan, a prediction) to `FixPlan.judge`,
    which `apply_fix` then runs while the copy is written."""
    engine = resolve_engine(engine)
    target_config = read_target_config(target) if target is not None else None
    if predict and not isinstance(predict, PredictionSpec):
        from .diagnose import prediction_spec

        predict = prediction_spec(target)
    prediction = predict or None
    ckpt = open_checkpoint(src)
    provenance = recognise(ckpt.keys(), ckpt.config if isinstance(ckpt.config, dict) else None)
    draft_class = provenance.draft_class
    # the release's row for the draft's own class: its names, config, parameters (the Llama row's facts
    # stand in, and a class-unregistered finding refuses, when the release has no such class)
    profile = engine.class_row(draft_class) or engine.profile
    fmt = config_format(ckpt.config)
    if fmt == MISSING:
        raise FixError(f"{ckpt.config_path}: no such file; fix needs the draft's config to write the one "
                       f"{profile.engine} reads (hidden sizes, rope, norms cannot be read off the tensors)")
    if fmt == UNKNOWN:
        raise FixError(f"{ckpt.config_path}: neither a flat Llama config (model_type/architectures) nor "
                       "speculators' nested config (speculators_model_type)")
    stated, switched = _norm_switches(ckpt)
    try:
        rewrite = rewrite_config(stated, profile)
    except (TypeError, ValueError, AttributeError) as e:
        raise FixError(f"{ckpt.config_path}: cannot rewrite it for {profile.engine} ({e})") from None
    rewrite.changes[:0] = switched
    if head_from_target:
        change = head_from_target_change(ckpt, rewrite.config, profile, target_config)
        rewrite.config["draft_vocab_size"] = None
        rewrite.changes.append(change)
    layout = detect_layout(ckpt.tensors, ckpt.config)
    # a draft class the replay does not model (MLA, Qwen3): no rewrite of it could be verified
    unmodelled = unmodelled_class(profile, engine.release, ckpt.config)
    try:
        dims = draft_dims(Checkpoint(ckpt.path, ckpt.shards, ckpt.tensors, rewrite.config))
    except CheckpointError as e:
        raise FixError(str(e)) from None
    params = {p.name: p for p in parameters(profile, dims)}
    expendable = _identity_vocab_maps(ckpt, profile, params) | _uncomputed_norms(ckpt, profile, rewrite.config)
    renaming = choose(layout.name, ckpt.keys(), profile, params, expendable)
    moves = [TensorMove(t.name, renaming.names[t.name], t.file.name, t.dtype, t.shape, t.nbytes,
                        renaming.reasons[t.name])
             for s in ckpt.shards for t in sorted(s.tensors, key=lambda t: t.begin)]

    def judging():  # imports here: numpy, the real loaders' client and the like load while the copy runs
        from .diagnose import diagnose
        from .values import scan

        renamed = _renamed_checkpoint(ckpt, renaming.names, rewrite.config)
        dims = draft_dims(renamed)
        hits = scan(renamed, dims.vocab_size, dims.draft_vocab_size)
        predicted = diagnose(renamed, engine, target_config=target_config, prediction=prediction, values=hits)
        if unmodelled is not None:  # the rewritten config names a modelled class: the rest is guesswork
            predicted.findings.insert(0, unmodelled)
        if engine.class_row(draft_class) is None:
            predicted.findings.insert(0, F.finding("class-unregistered", (
                f"{ckpt.folder} is a draft of the {provenance.architecture} kind ({provenance.evidence[0]}); "
                f"{engine} registers no such draft class, so no rewrite makes it load as trained: "
                f"{_releases_with(draft_class)}")))
        found = list(predicted.findings)
        found += [F.finding("lossy-config", f"{ckpt.config_path}: {m}") for m in rewrite.lossy]
        found += [F.finding("config-defaulted", f"{ckpt.config_path}: {m}") for m in rewrite.defaulted]
        found += _collisions(moves)
        return predicted, found, hits

    plan = FixPlan(ckpt.path, engine, ckpt, layout, renaming.mapper.description, moves,
                   rewrite, _other_files(ckpt), None, None, target_config, loader, prediction, judging)
    return plan.judge() if judge else plan


def head_from_target_change(ckpt: Checkpoint, config: dict, profile, target_config: dict | None) -> ConfigChange:
    """The change `--head-from-target` makes: `draft_vocab_size` -> null, so the engine builds the draft's
    head from the target's. It assumes the draft was trained with the target's own head (frozen, so its
    trainer did not save it). Applied only when that can be right and the engine does it; otherwise
    FixError naming why: the draft has its own head; its vocabulary is not the target's (the target's
    head has other rows: with a reduced vocabulary the draft predicts over its own ids); the release
    fails to build a null draft vocabulary; the config is not a flat one the release reads."""
    why = f"{ckpt.config_path}: --head-from-target cannot apply"
    if ckpt.find("lm_head.weight") is not None:
        raise FixError(f"{why}: the draft has its own lm_head.weight")
    if "lm_head" in profile.from_target_when_absent:
        raise FixError(f"{why}: {profile.engine} takes the target's head for a draft without one already; "
                       "nothing to change")
    if config_format(config) != FLAT or "draft_vocab_size" not in config:
        raise FixError(f"{why}: it writes draft_vocab_size: null in a flat config that declares draft_vocab_size; "
                       f"the config {profile.engine} reads has none")
    declared = config["draft_vocab_size"]
    vocab = (target_config or {}).get("vocab_size") or config.get("vocab_size")
    if declared is not None and declared != vocab:
        raise FixError(f"{why}: draft_vocab_size {declared} is not the {'target' if target_config else 'draft'}'s "
                       f"vocabulary ({vocab}): the target's head predicts over other ids than the draft was trained on")
    if profile.null_draft_vocab_error:
        raise FixError(f"{why}: {profile.engine} fails to build a draft whose draft_vocab_size is null "
                       f"({profile.null_draft_vocab_error})")
    return ConfigChange("draft_vocab_size", declared, None,
                        "--head-from-target: no lm_head in the checkpoint, and the draft's vocabulary is the target's; "
                        "assumed trained with the target's head (frozen, not saved), so the engine takes the target's")


def _releases_with(draft_class: str) -> str:
    """Where a draft class is registered, from the profile rows."""
    from .engines import releases_where

    rows = releases_where(lambda row: True, draft_class)
    return f"serve it with {' or '.join(rows)}" if rows else "no supported engine release registers it"


def _identity_vocab_maps(ckpt: Checkpoint, profile, params: dict) -> dict[str, str]:
    """The d2t tensors whose offsets are all 0, which map each draft id to the same target id, when
    the engine builds no vocab-map parameter for this draft (vLLM >= 0.30 with the target's own
    vocabulary) and so fails on the key: leaving them out changes nothing. Any other d2t stays, and
    the plan shows the failure."""
    if not profile.vocab_map_param or profile.vocab_map_param in params:
        return {}
    return {t.name: "the identity vocabulary map (every offset 0), for which the engine has no parameter when "
                    "the draft's vocabulary is the target's"
            for t in ckpt.named("d2t") if _all_zero(t)}


def _norm_switches(ckpt: Checkpoint) -> tuple[dict, list[ConfigChange]]:
    """The config with the switch on for every norm whose tensors the checkpoint holds but whose switch it
    does not set (docs/engine-facts.md: "EAGLE 3.1"): the draft was trained with that norm, and an engine
    builds it only with the switch. At the top level, where every engine reading it looks (a norm_before_fc
    in eagle_config, which it overrides, is taken out)."""
    config = json.loads(json.dumps(ckpt.config))
    changes = []
    for option in TENSOR_OPTIONS:
        keys = option_keys(ckpt.tensors, option)
        if not keys or draft_options(config).get(option):
            continue
        before = config.get(option, ABSENT)
        if isinstance(config.get("eagle_config"), dict):
            config["eagle_config"].pop(option, None)
        config[option] = True
        changes.append(ConfigChange(option, before, True, f"the checkpoint holds its tensors ({keys[0]}, ...): the "
                                    "draft was trained with it, and engines build the norm only with this switch"))
    return config, changes


def _uncomputed_norms(ckpt: Checkpoint, profile, config: dict) -> dict[str, str]:
    """The tensors of a norm the release does not compute with the rewritten `config` (it skips or refuses
    them): left out, the draft loads and computes without that norm, a loss the plan's check says
    (`--allow-lossy`), while the config keeps the switch that says it was trained with it."""
    options = {o: True for o in TENSOR_OPTIONS if option_keys(ckpt.tensors, o)}
    out = {}
    for option in unsupported_options(options, profile, config_format(config), layer_options(config)):
        out |= {k: f"{option}'s tensor, which {profile.spec} does not compute: "
                   f"without it the draft computes without {WITHOUT[option]}" for k in option_keys(ckpt.tensors, option)}
    return out


def _all_zero(t: TensorInfo) -> bool:
    try:
        data = t.read()
    except OSError:
        return False
    return len(data) == t.nbytes and data == bytes(len(data))


def _collisions(moves: list[TensorMove]) -> list[F.Finding]:
    """Two tensors the renaming would give one name (two keys loading into one parameter is the
    predicted check's `written-twice`, as `check` says it)."""
    out, seen = [], {}
    for m in moves:
        if m.new is not None and m.new in seen:
            out.append(F.finding("rename-collision", f"{seen[m.new]} and {m.old} would both be named {m.new}"))
        seen.setdefault(m.new, m.old)
    return out


# --- applying a plan ------------------------------------------------------------------------------


@dataclass
class Verification:
    """What was checked on DST before it was put in place."""

    tensors_checked: int
    bytes_checked: int
    mismatched: list[str]  # tensors whose bytes in DST differ from SRC
    header_problems: list[str]  # DST's re-read headers, config and index against the plan
    coverage: CoverageReport | None = field(repr=False, default=None)  # `check` on DST, with the plan's target
    accepted_losses: tuple[str, ...] = ()  # LOSS_CODES the user accepted (--allow-lossy)

    @property
    def problems(self) -> list[str]:
        out = self.header_problems + [f"{name}: bytes in DST differ from SRC" for name in self.mismatched]
        if self.coverage is None:
            out.append("DST could not be re-read")
        else:
            out += [f.brief() for f in self.coverage.errors if f.code not in self.accepted_losses]
        return out

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class FixResult:
    """What `apply_fix` did and how it was verified."""

    plan: FixPlan = field(repr=False)
    dst: Path
    written: bool  # DST is in place (only after verification passed)
    tensors_renamed: int
    tensors_copied: int
    tensors_omitted: int
    bytes_copied: int
    files_copied: int
    seconds: float
    copy_method: str
    verification: Verification

    @property
    def ok(self) -> bool:
        return self.written and self.verification.ok

    def to_dict(self) -> dict:
        cov = self.verification.coverage
        return {
            "src": str(self.plan.src), "dst": str(self.dst), "engine": self.plan.engine.spec, "ok": self.ok,
            "changes_nothing": self.plan.changes_nothing,
            "written": self.written, "tensors_renamed": self.tensors_renamed, "tensors_copied": self.tensors_copied,
            "tensors_omitted": self.tensors_omitted, "bytes_copied": self.bytes_copied,
            "files_copied": self.files_copied, "seconds": round(self.seconds, 3), "copy_method": self.copy_method,
            "config_changes": [asdict(c) for c in self.plan.config.changes],
            "verification": {
                "ok": self.verification.ok, "tensors_checked": self.verification.tensors_checked,
                "bytes_checked": self.verification.bytes_checked, "method": "byte comparison with SRC",
                "problems": self.verification.problems,
                "coverage_verdict": cov.verdict if cov else None,
            },
        }


def check_destination(plan: FixPlan, dst: Path, force: bool) -> None:
    """Refuse destinations that are unsafe: existing (without force), inside SRC, holding SRC."""
    src_folder = plan.checkpoint.folder.resolve()
    target = dst.resolve()
    if target == src_folder or target.is_relative_to(src_folder):
        raise FixError(f"{dst}: inside the source checkpoint folder {plan.checkpoint.folder}; choose another --out")
    if src_folder.is_relative_to(target):
        raise FixError(f"{dst}: contains the source checkpoint {plan.checkpoint.folder}; choose another --out")
    if not target.parent.is_dir():
        raise FixError(f"{dst}: parent {dst.parent} is not an existing folder")
    for path in [s.path for s in plan.checkpoint.shards] + [plan.checkpoint.folder / f.name for f in plan.files if f.copy]:
        if path.resolve().is_relative_to(target):
            raise FixError(f"{path}: resolves to a file inside {dst}, which fix would replace; choose another --out")
    if os.path.lexists(dst):
        if not force:
            raise FixError(f"{dst}: already exists; pass --force to replace it (after the new one is verified)")
        _check_replaceable(dst)


def _check_replaceable(dst: Path) -> None:
    """--force replaces an empty folder, or one `fix` wrote (its MARKER lists every file) holding
    nothing else; anything else stands in the way and is named."""
    if not dst.is_dir() or dst.is_symlink():
        raise FixError(f"{dst}: --force replaces only an empty folder or one draftdoctor fix wrote; this is not a folder")
    entries = sorted(os.listdir(dst))
    if not entries:
        return
    try:
        written = set(json.loads((dst / MARKER).read_text())["files"]) if not (dst / MARKER).is_symlink() else set()
    except (OSError, ValueError, KeyError, TypeError):
        written = set()
    foreign = [e for e in entries if e != MARKER and (e not in written or not (dst / e).is_file() or (dst / e).is_symlink())]
    if foreign or not written:
        named = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise FixError(f"{dst}: --force replaces only an empty folder or one draftdoctor fix wrote; "
                       + (f"{named} {'was' if len(foreign) == 1 else 'were'} not written by it" if written
                          else f"it holds {named}, and no {MARKER} says fix wrote them"))


def apply_fix(plan: FixPlan, dst, force: bool = False, allow_lossy: bool = False, progress=None) -> FixResult:
    """Write the planned checkpoint to `dst`, verify it, and only then put it in place.

    `progress(nbytes)` is called as tensor bytes are copied. Raises FixError before writing
    anything if the plan is blocked (or lossy without `allow_lossy`) or DST is unsafe; a result
    whose verification failed has `written` False and leaves DST as it was (absent, or the old
    folder under `force`). A plan not judged yet (`plan_fix(judge=False)`) is judged while its
    shards are written in a thread of their own, in the hidden folder beside DST: refused, the
    copy stops and that folder is removed, so nothing is written either.
    """
    dst = Path(dst)
    if plan.judging is None:
        refused = plan.refusal(allow_lossy)
        if refused:
            raise refused
    try:
        check_destination(plan, dst, force)
        rewriter.sweep_killed_runs(dst)
        try:
            tmp = rewriter.new_folder(dst.parent, rewriter.temp_prefix(dst, os.getpid()))
        except OSError as e:
            raise FixError(f"{dst.parent}: cannot create a folder there ({e.strerror})") from None
    except FixError as e:
        refused = plan.judge().refusal(allow_lossy)  # a refusal is what to say, when there is one
        raise (refused or e) from None
    start = time.perf_counter()
    try:
        names = {m.old: m.new for m in plan.tensors}
        copier = rewriter.Copier()

        def write(stop=None):
            return [rewriter.write_shard(shard, names, tmp, copier, progress, stop) for shard in plan.checkpoint.shards]

        if plan.judging is None:
            written = write()
        else:  # the plan's value scan, replay and prediction take their time beside the copy, not before it
            with rewriter.Background(write) as writing:
                refused = plan.judge().refusal(allow_lossy)
                if refused:
                    raise refused
                written = writing.result()
        planned = [tensors for tensors, _ in written]
        mismatched = {name for _, names in written for name in names}
        _write_index(plan, tmp, planned)
        (tmp / CONFIG_NAME).write_text(json.dumps(plan.config.config, indent=2) + "\n", encoding="utf-8")
        copied = [f for f in plan.files if f.copy]
        for f in copied:
            source = plan.checkpoint.folder / f.name
            if source.is_symlink() and in_hf_cache_blobs(plan.checkpoint.folder, source):
                source = source.resolve()
            rewriter.copy_regular_file(source, tmp / f.name)
        files = sorted(os.listdir(tmp))
        (tmp / MARKER).write_text(json.dumps({"written_by": "draftdoctor fix", "engine": plan.engine.spec,
                                              "files": files}, indent=1) + "\n", encoding="utf-8")
        verification = _verify(plan, tmp, planned, mismatched, allow_lossy)
        result = FixResult(plan, dst, False, len(plan.renamed), sum(len(p) for p in planned), len(plan.omitted),
                           sum(t.nbytes for p in planned for t in p), len(copied), 0.0, copier.method, verification)
        if verification.ok:
            if force and os.path.lexists(dst):
                _check_replaceable(dst)  # again: it may have changed while this run wrote
            rewriter.put_in_place(tmp, dst, replace=force)
            result.written = True
            verification.coverage.path = str(dst)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        result.seconds = time.perf_counter() - start
        return result
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, RewriteError):
            raise FixError(str(e)) from None
        if isinstance(e, OSError):
            raise FixError(f"{e.filename or dst}: {e.strerror or e}") from None
        raise


def _write_index(plan: FixPlan, folder: Path, planned: list[list[WrittenTensor]]) -> None:
    index = plan.checkpoint.index
    if index is None:
        return
    weight_map = {p.name: p.dst.name for shard in planned for p in shard}
    total = sum(p.nbytes for shard in planned for p in shard)
    new = {**index, "metadata": {**(index.get("metadata") or {}), "total_size": total}, "weight_map": weight_map}
    (folder / INDEX_NAME).write_text(json.dumps(new, indent=2) + "\n", encoding="utf-8")


def _verify(plan: FixPlan, folder: Path, planned: list[list[WrittenTensor]], mismatched: set[str],
            allow_lossy: bool) -> Verification:
    """Re-read DST's headers and check them against the plan and the byte comparison; diagnose DST as
    `check` does (with the plan's target)."""
    flat = [p for shard in planned for p in shard]
    mismatched = sorted(mismatched)
    problems = []
    try:
        written = open_checkpoint(folder)
    except CheckpointError as e:
        return Verification(len(flat), 0, mismatched, [f"re-reading DST: {e}"], None)
    for p in flat:
        t = written.tensors.get(p.name)
        if t is None:
            problems.append(f"{p.name}: missing from DST's headers")
        elif (t.dtype, t.shape, t.file.name, t.begin, t.nbytes) != (p.dtype, p.shape, p.dst.name, p.dst_begin, p.nbytes):
            problems.append(f"{p.name}: DST header says {t.dtype} {list(t.shape)} at {t.file.name}:{t.begin}, "
                            f"planned {p.dtype} {list(p.shape)} at {p.dst.name}:{p.dst_begin}")
    extra = set(written.tensors) - {p.name for p in flat}
    problems += [f"{name}: in DST's headers but not planned" for name in sorted(extra)]
    if written.config != plan.config.config:
        problems.append(f"{CONFIG_NAME}: re-read config differs from the planned one")
    from .diagnose import diagnose

    # the same names, dtypes, shapes and config over bytes compared equal: the plan's value scan is DST's
    same = not (problems or mismatched)
    coverage = diagnose(written, plan.engine, plan.loader, target_config=plan.target_config,
                        prediction=plan.prediction, values=plan.value_hits if same else None)
    return Verification(len(flat), sum(p.nbytes for p in flat), mismatched, problems, coverage,
                        LOSS_CODES if allow_lossy else ())
