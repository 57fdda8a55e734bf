"""The load coverage report (`CoverageReport`, its findings and verdict): what a loader did with every
key and parameter, whichever loader made it (the replay: draftdoctor.replay; the engine's own:
draftdoctor.realcheck), and what both share to make one: the draft's dimensions, a parameter never
written settled by what the engine does with it, a silently resized tensor's finding.

For every checkpoint key its fate (loaded, derived, ignored, dropped, ...), for every parameter the
engine creates whether it was written (`statuses.py`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from . import findings as F
from .checkpoint import DTYPE_BITS, Checkpoint, CheckpointError
from .configs import ConfigFieldUnread, ConfigValueError, DraftDims, config_format
from .frames import frame
from .engines import EngineRelease, ParamSpec, Profile, from_target, identity_by_default
from .layouts import Layout, detect_layout
from .statuses import KeyFate, ParamFate

# why a key is loaded together with another into one parameter (SGLang's MLA pair): two keys, one write
PAIR_REASON = "concatenated with its partner"
# the statuses by their short names, in the order statuses.py defines them
LOADED, DERIVED, IGNORED, DROPPED, TRAINING_ONLY, MISMATCH, NOT_REACHED, CRASHED = KeyFate
WRITTEN, PARTIAL, UNINITIALIZED, FROM_TARGET, IDENTITY, PARAM_MISMATCH = ParamFate


@dataclass
class KeyStatus:
    """One checkpoint key: its `status` (a `KeyFate`: loaded, derived, ignored, dropped, training-only,
    shape-mismatch, not-reached, crash), the parameter and shard it writes, and why."""

    key: str
    status: KeyFate
    param: str | None = None
    shard: str | None = None
    reason: str = ""
    shape: tuple[int, ...] = ()
    nbytes: int = 0


@dataclass
class ParamStatus:
    """One parameter the engine creates: its `status` (a `ParamFate`: written, partial, uninitialized,
    from-target, identity), the keys that wrote it and the shards still missing."""

    name: str
    role: str  # embed | fc | layer | norm | lm_head | vocab-map
    shape: tuple[int, ...]
    nbytes: int
    status: ParamFate = UNINITIALIZED
    keys: list[str] = field(default_factory=list)
    shards_written: list[str] = field(default_factory=list)
    shards_missing: list[str] = field(default_factory=list)
    replaced_by_target: bool = False  # the engine swaps in the target's tensor at serve time


@dataclass
class CoverageReport:
    """What an engine's loader would do with a checkpoint, and what that means."""

    engine: EngineRelease  # the release whose loader it is (its `.spec` in JSON and text)
    loader: str  # replay | real
    path: str
    layout: Layout
    config_format: str
    params: list[ParamStatus]
    keys: list[KeyStatus]
    findings: list[F.Finding]
    prediction: object = None  # a `predict.Prediction` when `check` had a target to run the draft on
    # how a real loader ran when not as the release's own CPU build (realcheck.overlay_detail), else ""
    loader_detail: str = ""
    # the row of the draft class the report was made with (`engine.profile_for(config)`), computed once
    # per verdict: what `diagnose` checks the rest with
    profile: Profile | None = field(default=None, repr=False, compare=False)

    @property
    def errors(self) -> list[F.Finding]:
        return [f for f in self.findings if f.severity == F.ERROR]

    @property
    def uninitialized(self) -> list[ParamStatus]:
        return [p for p in self.params if p.status in (UNINITIALIZED, PARTIAL)]

    @property
    def dropped(self) -> list[KeyStatus]:
        return [k for k in self.keys if k.status == DROPPED]

    @property
    def bytes_needed(self) -> int:
        """Bytes of the parameters the draft itself must supply (not replaced by the target's)."""
        return sum(p.nbytes for p in self.params if not p.replaced_by_target)

    @property
    def bytes_uninitialized(self) -> int:
        return sum(p.nbytes for p in self.uninitialized)

    @property
    def verdict(self) -> str:
        return verdict(self)

    def to_dict(self) -> dict:
        return {
            "engine": self.engine.spec,
            "loader": self.loader,
            "loader_detail": self.loader_detail,
            "path": self.path,
            "format": self.config_format,
            "layout": {"name": self.layout.name, "evidence": list(self.layout.evidence)},
            "verdict": self.verdict,
            "coverage": {
                "params_total": len(self.params),
                "params_uninitialized": len(self.uninitialized),
                "bytes_total": self.bytes_needed,
                "bytes_uninitialized": self.bytes_uninitialized,
                "keys_total": len(self.keys),
                "keys_dropped": len(self.dropped),
                "params": [asdict(p) for p in self.params],
                "keys": [asdict(k) for k in self.keys],
            },
            "findings": [asdict(f) for f in self.findings],
            "prediction": self.prediction.to_dict() if self.prediction is not None else None,
        }

    def loading_report(self) -> list[dict]:
        """transformers-style rows: MISSING (a parameter no key writes, or only partly), UNEXPECTED (a
        key the loader discards), MISMATCH (a key whose shape does not fit); rows that differ only in
        a layer index are folded into one, as transformers does (`layers.{0, 1, 2}.mlp...`)."""
        rows = []
        for p in self.params:
            if p.status in (UNINITIALIZED, PARTIAL):
                detail = "never written" if p.status == UNINITIALIZED else f"shards {', '.join(p.shards_missing)} missing"
                rows.append(("MISSING", "", p.name, detail))
        for k in self.keys:
            if k.status == DROPPED:
                rows.append(("UNEXPECTED", k.key, "", k.reason or ""))
            elif k.status == MISMATCH:  # a real loader's error names the key, not always its parameter
                rows.append(("MISMATCH", k.key, k.param or "", k.reason or ""))
        return [dict(zip(LOADING_REPORT_COLUMNS, row)) for row in _fold_layer_indices(rows)]

    def params_frame(self):
        return frame([asdict(p) for p in self.params])

    def keys_frame(self):
        return frame([asdict(k) for k in self.keys])


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} kB"


LOADING_REPORT_COLUMNS = ("status", "checkpoint key", "engine parameter", "detail")
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


def _fold_layer_indices(rows: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Rows equal but for the first layer index in each text, merged (`.{0, 1}.`; `.{0...31}.` for a run)."""
    groups: dict[tuple, list[int]] = {}
    for row in rows:
        indices = {m.group(1) for text in row for m in [_LAYER_INDEX.search(text)] if m}
        if len(indices) != 1:
            groups.setdefault(row, [])
            continue
        shape = tuple(_LAYER_INDEX.sub(".{}.", text, count=1) for text in row)
        groups.setdefault(shape, []).append(int(indices.pop()))
    out = []
    for shape, indices in groups.items():
        if not indices:
            out.append(shape)
            continue
        indices = sorted(set(indices))
        run = len(indices) > 2 and indices == list(range(indices[0], indices[-1] + 1))
        label = (f"{{{indices[0]}...{indices[-1]}}}" if run else "{" + ", ".join(map(str, indices)) + "}"
                 if len(indices) > 1 else str(indices[0]))
        out.append(tuple(text.replace(".{}.", f".{label}.") for text in shape))
    return out


def coverage_findings(report: CoverageReport) -> list[F.Finding]:
    """Findings that follow from a coverage report's per-key and per-parameter statuses."""
    out = []
    dropped = report.dropped
    training = [k for k in report.keys if k.status == TRAINING_ONLY]
    if dropped:
        names = ", ".join(k.key for k in dropped[:6]) + (f" and {len(dropped) - 6} more" if len(dropped) > 6 else "")
        out.append(F.finding(
            "dropped-keys",
            f"{len(dropped)} of {len(report.keys)} checkpoint tensors ({_mb(sum(k.nbytes for k in dropped))}) "
            f"match no {report.engine} parameter and are discarded: {names}",
        ))
    if training:
        out.append(F.finding(
            "dropped-keys",
            f"{len(training)} training-only tensor(s) are ignored, as they should be: "
            + ", ".join(k.key for k in training),
            severity=F.INFO,
        ))
    out += written_twice(report)
    missing = report.uninitialized
    if missing:
        parts = []
        for p in missing:
            part = p.name + (f" (shards {', '.join(p.shards_missing)} missing)" if p.status == PARTIAL else "")
            parts.append(part)
        out.append(F.finding(
            "uninitialized-params",
            f"{len(missing)} of {len(report.params)} parameters ({_mb(report.bytes_uninitialized)} of "
            f"{_mb(report.bytes_needed)}) are never written and keep their initial values: " + ", ".join(parts),
        ))
    return out


def written_twice(report: CoverageReport) -> list[F.Finding]:
    """A parameter (or one shard of a fused one) that more than one key writes: the engine keeps
    whichever it reads last, so what is served depends on the order of the files, and `fix` would refuse
    it. Two keys loaded together into one write (a concatenated pair) count as one writer."""
    writers: dict[tuple, list[KeyStatus]] = {}
    for k in report.keys:
        if k.status == LOADED and k.param:
            writers.setdefault((k.param, k.shard), []).append(k)
    out = []
    for (param, shard), keys in writers.items():
        alone = [k for k in keys if not k.reason.startswith(PAIR_REASON)]
        if len(alone) + (len(alone) < len(keys)) > 1:
            where = f"{param} (shard {shard})" if shard is not None else param
            out.append(F.finding("written-twice", f"{', '.join(k.key for k in keys)} all load into {where}: the "
                                 "engine serves whichever it reads last"))
    return out


def verdict(report: CoverageReport) -> str:
    """One line a user can act on."""
    unmodelled = [f for f in report.findings if f.code == "replay-not-modelled"]
    if unmodelled:
        return f"not checked: {unmodelled[0].message}"
    crash = [f for f in report.findings if f.code in ("loader-crash", "shape-mismatch")]
    if crash:
        return f"the server will not start: {crash[0].message}"
    missing = report.uninitialized
    config = [f for f in report.findings if f.code == "config-unreadable"]
    if missing:
        layer = [p for p in missing if p.role == "layer"]
        layer_total = [p for p in report.params if p.role == "layer"]
        what = "decoder layer" if layer and len(layer) == len(layer_total) == len(missing) else "draft parameters"
        line = (
            f"{what} left at initial values ({len(missing)} of {len(report.params)} parameters, "
            f"{_mb(report.bytes_uninitialized)} of {_mb(report.bytes_needed)})"
        )
        if report.prediction is not None:
            line += f": {report.prediction.text().split(' (')[0]}"
        elif layer:
            line += ": expect accept length near 1.00 (no draft token accepted)"
        return line + ("; and the config is unreadable" if config else "")
    if config:
        written = "every parameter is written, but " if report.params else ""
        return f"{written}the server will not start: {config[0].message}"
    predicted = report.prediction.text().split(" (")[0] if report.prediction is not None else None
    untrained = [f for f in report.findings if f.code == "weights-at-init" and f.severity == F.ERROR]
    if untrained:  # the names load; the values do not carry the training (draftdoctor.values)
        return (f"names load, but {untrained[0].message.split(': ', 1)[0]}: "
                + (predicted or "expect a low accept length (the draft runs but predicts little: 1.0-2.0 measured on "
                                "the demo draft with such values, 3.08 trained)"))
    if any(f.code == "no-acceptance-predicted" for f in report.findings):
        # another error says why (a vocabulary map, a mislabelled dtype, a NaN); else its values carry nothing
        why = next((f for f in report.findings if f.severity == F.ERROR and f.code != "no-acceptance-predicted"), None)
        because = f"{why.code}: {why.message}" if why else "its values carry no training the engine can use"
        return f"names load, but the draft as loaded predicts nothing: {predicted} ({because})"
    errors = [f for f in report.findings if f.severity == F.ERROR]
    if errors:
        more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
        return f"every parameter is written, but {errors[0].code}: {errors[0].message}{more}"
    shared = sum(p.status == FROM_TARGET for p in report.params)
    identity = sum(p.status == IDENTITY for p in report.params)
    notes = [f"{shared} taken from the target at serve time"] * bool(shared)
    notes += [f"{identity} keeps its initial identity vocabulary map"] * bool(identity)
    warnings = sum(f.severity == F.WARNING for f in report.findings)
    return (
        f"loads cleanly: {len(report.params) - shared - identity} of {len(report.params)} parameters written"
        + (f" ({'; '.join(notes)})" if notes else "")
        + ", every tensor placed"
        + (f"; {report.prediction.text().split(' (')[0]}" if report.prediction is not None else "")
        + (f"; {warnings} warning(s) to read" if warnings else "")
    )


def draft_dims(checkpoint: Checkpoint) -> DraftDims:
    """The draft's dims from its config, or failing that from its tensor shapes (`read_dims` says which)."""
    return read_dims(checkpoint)[0]


# DraftDims' attribute for each config field the dims need, for saying what was assumed in its place
_DIM_FIELDS = {"hidden_size": "hidden_size", "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
               "vocab_size": "vocab_size", "num_hidden_layers": "num_layers"}


def read_dims(checkpoint: Checkpoint) -> tuple[DraftDims, F.Finding | None]:
    """The draft's dims, and when its config.json is there but a field they need cannot be read (missing,
    null), the `dims-from-tensors` finding naming the field and the values taken from the tensors instead:
    never a silent guess. No config.json at all: the tensors' dims, and `config-unreadable` says so.
    A value there but impossible is the user's error (CheckpointError: exit 2)."""
    if checkpoint.config is None:
        return dims_from_tensors(checkpoint), None
    try:
        return DraftDims.from_config(checkpoint.config), None
    except ConfigValueError as e:
        raise CheckpointError(checkpoint.config_path, str(e)) from None
    except ConfigFieldUnread as e:
        field, problem = e.field, str(e)
    except (KeyError, TypeError, ValueError) as e:
        field, problem = None, f"{type(e).__name__}: {e}"[:200]
    dims, head_dim_from = _dims_from_tensors(checkpoint)
    name = field.rpartition(".")[2] if field else None
    assumed = [f"{name} {getattr(dims, _DIM_FIELDS[name])}"] if name in _DIM_FIELDS else []
    rest = ", ".join(f"{n} {getattr(dims, a)}" for n, a in (*_DIM_FIELDS.items(), ("num_key_value_heads", "num_kv_heads"))
                     if n != name)
    return dims, F.finding("dims-from-tensors", (
        f"{checkpoint.config_path}: {problem}, so the draft's dimensions were taken from its tensors' shapes instead: "
        + (f"assumed {assumed[0]}; also " if assumed else "")
        + f"{rest}, head_dim {dims.head_dim} ({head_dim_from}); the engine builds from config.json, not from the "
          f"tensors, so this report may not be what it does: write {field or 'the field'} into config.json"))


def dims_from_tensors(checkpoint: Checkpoint) -> DraftDims:
    """Best-effort dims from shapes alone (no config): enough to name and size the parameters."""
    return _dims_from_tensors(checkpoint)[0]


def _dims_from_tensors(checkpoint: Checkpoint) -> tuple[DraftDims, str]:
    """`dims_from_tensors`, and where its head_dim came from (the q norm's width, else a guess)."""
    by_suffix = {}
    for name, t in checkpoint.tensors.items():
        by_suffix.setdefault(name.split("midlayer.")[-1].split("layers.0.")[-1].removeprefix("model."), t.shape)
    try:
        H = by_suffix["norm.weight"][0] if "norm.weight" in by_suffix else by_suffix["fc.weight"][0]
        q_out = by_suffix["self_attn.q_proj.weight"][0]
        kv_out = by_suffix["self_attn.k_proj.weight"][0]
        inter = by_suffix["mlp.gate_proj.weight"][0]
    except KeyError as e:
        raise CheckpointError(checkpoint.path, f"no usable config.json, and no {e.args[0]} tensor to infer the draft's shape from") from None
    fc_in = by_suffix.get("fc.weight", (H, 3 * H))[1]
    head_dim = by_suffix.get("self_attn.q_norm.weight", (128 if q_out % 128 == 0 else 64,))[0]
    head_dim_from = ("q_norm's width" if "self_attn.q_norm.weight" in by_suffix else
                     f"a guess: 128 when it divides q_proj's {q_out} rows, else 64")
    lm = by_suffix.get("lm_head.weight")
    embed = by_suffix.get("embed_tokens.weight")
    vocab = embed[0] if embed else (by_suffix["t2d"][0] if "t2d" in by_suffix else (lm[0] if lm else 0))
    return DraftDims(
        hidden_size=H, num_heads=q_out // head_dim, num_kv_heads=kv_out // head_dim, head_dim=head_dim,
        intermediate_size=inter, vocab_size=vocab, draft_vocab_size=lm[0] if lm else None,
        target_hidden_size=fc_in // 3, num_layers=max(1, len(detect_layout(checkpoint.tensors, None).layer_prefixes)),
    ), head_dim_from


# what a checkpoint key must contain to count as the draft's own tensor of that role (vLLM's proposer
# shares the target's embedding or head when no key names one: `has_own_embed_tokens`/`has_own_lm_head`)
ROLE_KEYS = {"embed": "embed_tokens", "lm_head": "lm_head"}


def settle_unwritten(param: ParamStatus, profile: Profile, dims: DraftDims, spec: ParamSpec, keys) -> None:
    """What a parameter the checkpoint leaves unwritten holds at serve time, when that is not its
    random initial value: the target's tensor (from-target), or an initial value that is already
    right for this draft (identity). `keys`: the checkpoint's tensor names."""
    param.replaced_by_target = from_target(profile, dims, spec) or (
        spec.role in profile.unwritten.from_target_when_absent and not any(ROLE_KEYS[spec.role] in k for k in keys))
    if param.replaced_by_target and param.status in (UNINITIALIZED, PARTIAL):
        param.status = FROM_TARGET
    elif param.status == UNINITIALIZED and identity_by_default(dims, spec):
        param.status = IDENTITY


def resized_finding(profile: Profile, key: str, shape, param: str, expected) -> F.Finding:
    """A key the engine loaded into a parameter of another shape, padding or cutting it to fit."""
    return F.finding("shape-mismatch", (
        f"{key} {list(shape)} was loaded into {param} {list(expected)} without an error: "
        f"{profile.engine} pads or cuts it to fit, so the layer computes with the wrong weights"), severity=F.WARNING)


def dominant_dtype_bytes(checkpoint: Checkpoint) -> int:
    """Bytes per element of the checkpoint's weights (its largest tensor's dtype)."""
    if not checkpoint.tensors:
        return 2
    largest = max(checkpoint.tensors.values(), key=lambda t: t.nbytes)
    return max(1, DTYPE_BITS[largest.dtype] // 8)
