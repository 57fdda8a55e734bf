"""`draftdoctor fix`: rewrite a draft checkpoint so that an engine loads every tensor, and prove it.

`plan_fix` decides, from headers alone: new tensor names (the rules in `renames`), the config the
engine reads (`configrewrite.rewrite_config`), the other files to copy, and `check`'s verdict on the result
(`diagnose` over the renamed headers, with the target's config when one is given): a `fixplan.FixPlan`.
A plan whose result would carry an error finding is refused (`FixBlocked`), unless the only errors
are losses the user accepts (`--allow-lossy`). `apply_fix` (`fixwrite`) carries the plan out: the
copy compared byte for byte with SRC as it is written, DST's headers re-read and diagnosed again,
and only a verified result put in place. The names callers use from the three modules are
importable from here.
"""

from __future__ import annotations

import json

from . import findings as F
from .checkpoint import (CONFIG_NAME, INDEX_NAME, PICKLE_SUFFIXES, Checkpoint, CheckpointError, ShardHeader,
                         TensorInfo, in_hf_cache_blobs, open_checkpoint)
from .configrewrite import ABSENT, ConfigChange, rewrite_config
from .configs import (FLAT, MISSING, UNKNOWN, ConfigValueError, check_shape, config_format, draft_options, layer_options,
                      unsupported_options)
from .checks import TENSOR_OPTIONS, WITHOUT, option_keys, read_target_config
from .coverage import draft_dims
from .configrules import unmodelled_class
from .provenance import recognise
from .predict import PredictionSpec
from .engines import EngineRelease, parameters, resolve_engine
from .layouts import detect_layout
from .renames import choose
from .fixplan import LOSS_CODES, NOTHING_TO_CHANGE, FileCopy, FixBlocked, FixError, FixPlan, TensorMove  # noqa: F401
from .fixwrite import MARKER, FixResult, Verification, apply_fix, check_destination  # noqa: F401


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
    try:  # said as check says it, not as the rewrite trips on it ("invalid literal for int()")
        check_shape(ckpt.config)
    except ConfigValueError as e:
        raise FixError(f"{ckpt.config_path}: {e}") from None
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
    if "lm_head" in profile.unwritten.from_target_when_absent:
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
    if profile.build.null_draft_vocab_error:
        raise FixError(f"{why}: {profile.engine} fails to build a draft whose draft_vocab_size is null "
                       f"({profile.build.null_draft_vocab_error})")
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
    if not profile.build.vocab_map_param or profile.build.vocab_map_param in params:
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
