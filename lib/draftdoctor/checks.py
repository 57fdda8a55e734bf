"""Checks beyond names: the other ways a draft loads and then silently misbehaves.

The engine facts behind them are in docs/engine-facts.md ("Config formats", the two loaders,
"Acceptance"): aux-layer ids the engine does not read or reads in another convention,
training options the engine cannot compute, a vocabulary map that is missing or wrong, a missing
head, a draft that does not fit its target (values: draftdoctor.values). Each gives the same symptom as a naming
mismatch (low or zero acceptance, no error), so each is a finding with a stable code.

Only headers are read, except the two small vocabulary-map tensors (never whole files).
"""

from __future__ import annotations

from pathlib import Path

from . import auxids
from . import findings as F
from .checkpoint import Checkpoint, CheckpointError, TensorInfo, read_config
from .configrewrite import RECORD_KEY
from .configs import (DRAFT_OPTIONS, FLAT, SPECULATORS, ConfigValueError, DraftDims, check_target, config_format,
                      draft_options, layer_config, layer_options, unsupported_options)
from .engines import CRASH, SKIP, WARN, Profile, releases_where

OPTION_CODES = {"norm_before_residual": "norm-before-residual", "norm_before_fc": "input-norm-unsupported",
                "fc_norm": "fc-norm-unsupported", "norm_output": "norm-output-unsupported"}


def read_target_config(path) -> dict:
    """The target's config.json, from its folder or the file itself; CheckpointError naming it when a
    size in it is none a model can have (configs.check_target)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent if path.name == "config.json" else None
    config = read_config(folder) if folder is not None else None
    if config is None:
        raise CheckpointError(path, "no config.json for the target (give the target's folder or its config.json)")
    try:
        check_target(config)
    except ConfigValueError as e:
        raise CheckpointError(folder / "config.json", str(e)) from None
    return config


def draft_checks(checkpoint: Checkpoint, profile: Profile, dims: DraftDims, target: dict | None = None) -> list[F.Finding]:
    """Every check of this module for `checkpoint` served by `profile`'s engine (and `target`)."""
    config = checkpoint.config or {}
    found = []
    fmt = config_format(config)
    if fmt in profile.config.config_formats:  # an unreadable config is already a finding; its ids are moot
        found += aux_layer_checks(config, profile, target)
    if fmt in (FLAT, SPECULATORS):
        found += option_checks(checkpoint, profile)
    found += vocab_checks(checkpoint, profile, dims)
    if target is not None:
        found += target_checks(checkpoint, dims, target)
    else:
        found.append(F.finding("not-checked", "no --target: not checked whether the draft fits the target (hidden "
                                              "size, vocabulary) nor whether its aux layer ids are layers the "
                                              "engine can capture"))
    return found


def _input_of(offset: int) -> str:
    return f"the input of layer id + {offset}" if offset else "the input of layer id"


def aux_layer_checks(config: dict, profile: Profile, target: dict | None) -> list[F.Finding]:
    """Aux ids where the engine does not look, in another convention than the engine's, or outside
    the target."""
    name, aux = profile.spec, profile.aux  # the aux-capture stage
    present = {where: ids for where in auxids.PLACE_OFFSET if (ids := auxids.ids_at(config, where))}
    read = next(((where, present[where]) for where in aux.aux_ids_from if where in present), None)
    n_layers = (target or {}).get("num_hidden_layers")
    out = []
    if present and read is None:
        where, ids = next(iter(present.items()))
        # both engines' default: the inputs of these target layers
        default = list(auxids.default_layers(n_layers)) if n_layers else None
        ignored = (f"{name} reads aux layer ids only from {' or '.join(aux.aux_ids_from)}; the ids {ids} at "
                   f"{where} are ignored and it captures its default layers"
                   + (f" (for this {n_layers}-layer target, the inputs of layers {default})" if default else ""))
        if not default:
            out.append(F.finding("aux-layer-ids", f"{ignored}, which depend on the target's layer count: give "
                                 "--target to learn whether they are the trained ones. `draftdoctor fix` moves them",
                                 severity=F.WARNING))
            return out
        if auxids.trained_layers(ids, where) == default:
            out.append(F.finding("aux-layer-ids", f"{ignored}, which are the ones the ids name: no harm. "
                                 "`draftdoctor fix` moves them", severity=F.INFO))
            return out
        effect = "the draft sees other layers than it was trained on"
        if len(set(default)) < len(ids) and not aux.aux_repeats:  # the engine captures each layer once
            out.append(F.finding("aux-layer-uncapturable", (
                f"{ignored}: that is only {len(set(default))} distinct layers for an fc trained on {len(ids)}: a shape "
                "error the first time the draft runs. `draftdoctor fix` moves them")))
            return out
        out.append(F.finding("aux-layer-ids", f"{ignored}: {effect}. `draftdoctor fix` moves them"))
    if not aux.aux_repeats and (read is not None or n_layers):  # the engine captures each layer once
        captured = aux.captured_layers(config, n_layers)
        if len(set(captured)) < len(captured):
            said = (f"the ids {read[1]} at {read[0]} name the inputs of target layers {list(captured)}" if read else
                    f"no aux layer ids, so {name} captures its default layers, for this {n_layers}-layer target the "
                    f"inputs of layers {list(captured)}")
            out.append(F.finding("aux-layer-uncapturable", (
                f"{said}: only {len(set(captured))} distinct layers "
                f"for an fc that takes {len(captured)} aux states; {name} captures each layer once, so the first "
                "draft step is a shape error. Write the ids the draft was trained with into the config")))
            return out
    if read is None:
        return out
    where, ids = read
    shift = auxids.PLACE_OFFSET[where] - aux.aux_capture_offset
    if shift:
        out.append(F.finding("aux-layer-ids", (
            f"{where} ids {ids} name {_input_of(auxids.PLACE_OFFSET[where])} ({auxids.CONVENTION[where]}); {name} "
            f"captures {_input_of(aux.aux_capture_offset)}, so the draft reads each layer {abs(shift)} "
            f"{'below' if shift > 0 else 'above'} the one it was trained on. "
            f"`draftdoctor fix --engine {profile.engine}` converts them"), severity=F.WARNING))
    first, last = aux.capturable(n_layers)
    captured = [int(i) + aux.aux_capture_offset for i in ids]
    outside = [(i, c) for i, c in zip(ids, captured) if c < first or last is not None and c > last]
    if outside:
        bounds = f"{first}..{last}" if last is not None else f"{first} or above"
        target_text = f" of this {n_layers}-layer target" if n_layers else ""
        out.append(F.finding("aux-layer-uncapturable", (
            f"aux layer ids {[i for i, _ in outside]} ({where}) name the input of target layer(s) "
            f"{[c for _, c in outside]}, which {name} cannot capture: it captures "
            f"{_input_of(aux.aux_capture_offset)}, which must lie in {bounds}{target_text}; the first draft step "
            f"fails. No rewrite of the checkpoint can change which layers the draft was trained on: serve it on an "
            f"engine that captures them, or retrain with other aux layer ids")))
    return out


def option_keys(keys, option: str) -> list[str]:
    """The checkpoint's tensors that belong to a draft option's module, in every spelling trainers and engines
    use (docs/engine-facts.md: "EAGLE 3.1"): fc_norm's `fc_norm.N` (also `model.`-prefixed) and
    `aux_norm_low/mid/high`; norm_before_fc's `input_norm`."""
    if option == "fc_norm":
        return [k for k in keys if k.removeprefix("model.").startswith(("fc_norm.", "aux_norm_"))]
    if option == "norm_before_fc":
        return [k for k in keys if k.removeprefix("model.").startswith("input_norm.")]
    return []


def checkpoint_options(checkpoint: Checkpoint) -> dict:
    """The draft options the config states (read as SGLang and vLLM read it), and those its tensors show
    whatever the config says (an fc_norm or input_norm tensor is there only if the draft was trained with it)."""
    options = draft_options(checkpoint.config or {})
    options |= {o: True for o in TENSOR_OPTIONS if option_keys(checkpoint.tensors, o)}
    return options


TENSOR_OPTIONS = ("fc_norm", "norm_before_fc")
WITHOUT = {"fc_norm": "its per-aux norms before fc", "norm_before_fc": "its norm over the concatenated aux states",
           "norm_before_residual": "its normed residual", "norm_output": "its output norm"}


def _unbuilt_key_fate(profile: Profile, key: str) -> str:
    """What the release's loader does with a key of a module it did not build: SKIP, WARN or CRASH."""
    keys = profile.keys
    if any(s in key for s in keys.dropped_unless_built) or key.endswith(keys.unmatched_skipped_suffixes):
        return SKIP
    return keys.on_unmatched[0]


LOSS = ", a different function than the one trained, and acceptance drops"


def _key_fate(option: str, keys: list[str], profile: Profile) -> tuple[str, str]:
    """(what the release's loader does with the keys of `option`'s module, which it did not build; what the
    draft computes then, without the loss)."""
    without = f"the draft computes without {WITHOUT[option]}"
    fates = {k: _unbuilt_key_fate(profile, k) for k in keys}
    refused = [k for k, fate in fates.items() if fate == CRASH]
    if refused:
        return (f"loading fails on {refused[0]}, which matches no parameter there: the server does not start",
                f"without those tensors {without}")
    shown = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
    return f"its loader skips {shown} {'with a warning' if WARN in fates.values() else 'without a word'}", without


def _what_happens(option: str, keys: list[str], profile: Profile) -> str:
    """What serving the draft there comes to when the release computes without `option`."""
    without = f"the draft computes without {WITHOUT[option]}"
    if option == "norm_output":
        return ("it feeds the pre-norm state back to the next draft step where the draft was trained on the post-norm "
                f"one: {without}{LOSS}")
    if option == "norm_before_residual":
        return ("it keeps the hidden state from before hidden_norm as the residual where the draft was trained with the "
                f"normed one: it computes{LOSS.removeprefix(',')}")
    if not keys:
        return f"it ignores the flag: {without}{LOSS}"
    happens, computes = _key_fate(option, keys, profile)
    return f"{happens}: {computes}{LOSS}" if happens.startswith("its loader") else f"{happens} ({computes})"


def option_checks(checkpoint: Checkpoint, profile: Profile) -> list[F.Finding]:
    """Training options and extra norms the engine cannot compute, says what serving it there does (the
    keys skipped, the load refused, the flag ignored), and norms whose tensors are there without the flag
    that makes the engine build them."""
    name, draft_class = profile.spec, profile.build.draft_class
    config = checkpoint.config or {}
    fmt = config_format(config)
    stated = draft_options(config)
    read_here = draft_options(config, profile.config.norm_before_fc_from)
    options = checkpoint_options(checkpoint)
    norm_keys = {o: option_keys(checkpoint.tensors, o) for o in TENSOR_OPTIONS}
    not_computed = unsupported_options(options, profile, fmt, layer_options(config))
    out = []
    for option in [o for o, value in options.items() if value]:
        if option in not_computed:
            why = ("does not read from speculators' config (it reads it from a flat one)"
                   if profile.implements(option) else "does not implement")
            text = f"the draft was trained with {option}: true, which {name} {why}"
        elif option == "norm_before_fc" and stated.get(option) and not read_here.get(option):
            text = (f"the draft was trained with norm_before_fc: true, set in eagle_config, where {name} does not read "
                    f"it (it reads the config's top level only; `draftdoctor fix --engine {profile.engine}` writes it "
                    "there)")
        else:
            if norm_keys.get(option) and not profile.option_enabled(config, option):
                out.append(_flag_missing(option, norm_keys[option], profile))
            continue
        happens = _what_happens(option, norm_keys.get(option, []), profile)
        out.append(F.finding(OPTION_CODES.get(option, "lossy-config"), f"{text}: {happens}"
                             + _serving(lambda row, option=option: row.implements(option), draft_class)))
    out += _norm_output_meaning(checkpoint, profile, stated)
    # `fix --allow-lossy` keeps an option the engine cannot express only in its record, which no
    # engine reads: the draft was still trained with it
    record = config.get(RECORD_KEY) if isinstance(config.get(RECORD_KEY), dict) else {}
    fields = record.get("fields") if isinstance(record.get("fields"), dict) else {}
    for option in sorted(k for k, v in fields.items() if k in DRAFT_OPTIONS and v and k not in options):
        remedy = (f"; {name} implements it: `draftdoctor fix --engine {profile.engine}` writes it where it is read"
                  if profile.implements(option) else "")
        out.append(F.finding(OPTION_CODES.get(option, "lossy-config"), (
            f"the draft was trained with {option}: true, kept only in the config's {RECORD_KEY} record by a lossy fix, "
            f"where no engine reads it: {name} computes without it, a different function than the one trained, and "
            f"acceptance drops{remedy or _serving(lambda row, option=option: row.implements(option), draft_class)}")))
    qk_keys = [k for k in checkpoint.tensors if k.endswith(("q_norm.weight", "k_norm.weight"))]
    qwen3 = layer_config(config).get("model_type") == "qwen3"
    if (qk_keys or qwen3) and not profile.build.supports_qk_norm:
        what = f"{len(qk_keys)} q_norm/k_norm tensors" if qk_keys else "model_type qwen3 (q/k norms)"
        out.append(F.finding("qk-norm-unsupported", f"{what}: {name}'s Llama EAGLE-3 draft has no q/k norms; "
                                                    "they are not applied and the attention differs from training"
                                                    + _serving(lambda row: row.build.supports_qk_norm, "qwen3")))
    return out


def _flag_missing(option: str, keys: list[str], profile: Profile) -> F.Finding:
    """A norm's tensors whose flag the config does not set, on a release that builds the norm only with it."""
    happens, computes = _key_fate(option, keys, profile)
    return F.finding("norm-flag-missing", (
        f"the checkpoint holds {len(keys)} {option} tensor(s) ({keys[0]}, ...), so the draft was trained with "
        f"{option}, but its config does not set {option}: true, and {profile.spec} builds the norm only when it "
        f"does: {happens} ({computes}{LOSS if happens.startswith('its loader') else ''}). "
        f"`draftdoctor fix --engine {profile.engine}` sets it"))


def _norm_output_meaning(checkpoint: Checkpoint, profile: Profile, stated: dict) -> list[F.Finding]:
    """norm_output: true in SpecForge's export (a flat config, `midlayer.*` keys), whose meaning changed in 2026-09
    (docs/engine-facts.md: "EAGLE 3.1"): nothing in the checkpoint says which meaning it was trained with."""
    config = checkpoint.config or {}
    midlayer = any(k.startswith("midlayer.") for k in checkpoint.tensors)
    if not (stated.get("norm_output") and config_format(config) == FLAT and midlayer):
        return []
    fed = "post-norm" if profile.implements("norm_output") else "pre-norm"
    return [F.finding("norm-output-ambiguous", (
        "norm_output: true in a flat config with midlayer.* keys, as SpecForge exports: SpecForge trained with it as "
        "plain EAGLE-3 (the final norm before the head only, the pre-norm state fed back to the next step) from its "
        "EAGLE 3.1 support (2026-07) until 2026-09, and as EAGLE 3.1 (the post-norm state fed back) since; the "
        f"checkpoint does not say which. {profile.spec} feeds the {fed} state back, so a draft of the other kind "
        "computes otherwise than trained, silently: measure it (`draftdoctor bench`), and with norm_output: false "
        "where the release reads it"), severity=F.WARNING)]


def _serving(holds, draft_class: str) -> str:
    """"; releases that compute it: ..." from the profile rows, or "" when none does."""
    releases = releases_where(holds, draft_class)
    return f"; releases that compute it: {', '.join(releases)}" if releases else ""


def vocab_checks(checkpoint: Checkpoint, profile: Profile, dims: DraftDims) -> list[F.Finding]:
    """The draft-to-target vocabulary map, the head, and the embedding."""
    out, unwritten = [], profile.unwritten
    V, Vd = dims.vocab_size, dims.draft_vocab_size
    d2t, t2d = checkpoint.find("d2t"), checkpoint.find("t2d")
    if Vd is not None and Vd < V and d2t is None:
        out.append(F.finding("vocab-map-missing", (
            f"draft vocabulary {Vd} < target vocabulary {V} but there is no d2t tensor: draft token ids are taken as "
            "target ids, so almost every drafted token is wrong")))
    if d2t is not None:
        out += _vocab_map_problems(d2t, t2d, V, Vd)
    has_head = checkpoint.find("lm_head.weight") is not None
    if not has_head and "lm_head" in unwritten.from_target_when_absent:
        fits = Vd in (None, V)
        out.append(F.finding("lm-head-missing", (
            "no lm_head.weight: the engine uses the target's head at serve time"
            + (", as intended" if fits else f", {V} rows for a draft vocabulary of {Vd}: mapping its logits through "
               "the draft's vocabulary map fails at the first draft step")), severity=F.INFO if fits else F.ERROR))
    elif Vd is not None and not has_head:
        out.append(F.finding("lm-head-missing", (
            f"config declares draft_vocab_size {Vd} but the checkpoint has no lm_head.weight: the engine builds its "
            "own head and leaves it at initial values (the draft picks random tokens)")))
    if checkpoint.find("embed_tokens.weight") is None and (unwritten.embed_from_target
                                                              or "embed" in unwritten.from_target_when_absent):
        fits = dims.target_hidden_size in (None, dims.hidden_size)
        unusable = ("target_hidden_size differs from hidden_size, so the engine cannot use the target's embedding and "
                    "this one stays at initial values" if unwritten.embed_from_target else
                    f"the engine uses the target's embedding ({dims.target_hidden_size} wide) in a draft {dims.hidden_size} "
                    "wide: a shape error at the first draft step")
        out.append(F.finding("embed-missing", (
            "no embed_tokens.weight: " + ("the engine uses the target's embedding at serve time, as intended"
                                          if fits else unusable)),
            severity=F.INFO if fits else F.ERROR))
    return out


# a t2d that disagrees with a well-formed d2t: evidence about a tensor no engine reads, so a prediction that the
# draft as loaded works outranks it (`diagnose`), as it outranks the value rules
T2D_DISAGREES = "t2d does not mark exactly the target ids that d2t maps to"


def _vocab_map_problems(d2t: TensorInfo, t2d: TensorInfo | None, V: int, Vd: int | None) -> list[F.Finding]:
    import numpy as np  # here, not at the top: `fix` starts its copy before numpy is imported (60-90 ms)

    problems = []
    if d2t.dtype not in ("I64", "I32") or len(d2t.shape) != 1:
        return [F.finding("vocab-map-invalid", f"d2t is {d2t.dtype}{list(d2t.shape)}; expected a 1-D integer tensor")]
    offsets = np.frombuffer(d2t.read(), dtype=np.int64 if d2t.dtype == "I64" else np.int32).astype(np.int64)
    if Vd is not None and len(offsets) != Vd:
        problems.append(f"d2t has {len(offsets)} entries but draft_vocab_size is {Vd}")
    target_ids = offsets + np.arange(len(offsets))
    if len(target_ids) and (target_ids.min() < 0 or target_ids.max() >= V):
        problems.append(f"d2t maps draft ids to target ids {int(target_ids.min())}..{int(target_ids.max())}, outside 0..{V - 1}")
    elif len(target_ids) > 1 and not np.all(np.diff(target_ids) > 0):
        problems.append("d2t's target ids are not strictly increasing (d2t must hold target_id - draft_id)")
    if t2d is not None and not problems:
        mask = np.frombuffer(t2d.read(), dtype=np.uint8).astype(bool)
        if len(mask) != V:
            problems.append(f"t2d has {len(mask)} entries but the target vocabulary is {V}")
        elif mask.sum() != len(target_ids) or not mask[target_ids].all():
            return [F.finding("vocab-map-invalid", T2D_DISAGREES + (
                ": one of the two is not the draft's map; every engine reads d2t only (t2d is skipped by design), so "
                "if it is d2t, drafted ids turn into the wrong target tokens"))]
    return [F.finding("vocab-map-invalid", p + ": drafted ids turn into the wrong target tokens") for p in problems]


def target_checks(checkpoint: Checkpoint, dims: DraftDims, target: dict) -> list[F.Finding]:
    """A draft that does not fit the target it will serve with."""
    layer = layer_config(target)
    Ht, V = layer.get("hidden_size"), layer.get("vocab_size")
    out = []
    fc = checkpoint.find("fc.weight")
    n_aux = len(dims.aux_layer_ids or ()) or 3
    if fc is not None and Ht and len(fc.shape) == 2 and fc.shape[1] != n_aux * Ht:
        out.append(f"fc.weight takes {fc.shape[1]} inputs but {n_aux} aux layers x target hidden size {Ht} = {n_aux * Ht}")
    if Ht and dims.target_hidden_size and dims.target_hidden_size != Ht:
        out.append(f"config target_hidden_size {dims.target_hidden_size} but the target's hidden_size is {Ht}")
    if Ht and dims.target_hidden_size is None and dims.hidden_size != Ht:
        out.append(f"draft hidden_size {dims.hidden_size} differs from the target's {Ht} and no target_hidden_size says so")
    if V and dims.vocab_size != V:
        out.append(f"draft vocab_size {dims.vocab_size} but the target's vocabulary is {V}")
    draft_ctx = layer_config(checkpoint.config or {}).get("max_position_embeddings")
    target_ctx = layer.get("max_position_embeddings")
    if draft_ctx and target_ctx and draft_ctx < target_ctx:
        out.append(f"draft max_position_embeddings {draft_ctx} is below the target's context length {target_ctx}")
    return [F.finding("target-mismatch", m) for m in out] + _layer_math(layer_config(checkpoint.config or {}), layer)


def _rope_theta(layer: dict):
    return (layer.get("rope_parameters") or {}).get("rope_theta", layer.get("rope_theta"))


def _layer_math(draft: dict, target: dict) -> list[F.Finding]:
    """Warnings for a draft layer whose norm epsilon or rope base differ from the target's. A draft's layer is
    built from its target's config (speculators derives transformer_layer_config from the verifier's; the EAGLE
    and SpecForge configs copy it), and the engine computes it with the draft's own values: at other values the
    draft computes otherwise than it was trained (on the demo, rms_norm_eps 0.1 cost 3.24 -> 1.32, rope_theta
    100 cost 3.24 -> 3.05). A warning: the prediction, given a target, says what it costs."""
    out = []
    for field, draft_value, target_value in (("rms_norm_eps", draft.get("rms_norm_eps"), target.get("rms_norm_eps")),
                                             ("rope_theta", _rope_theta(draft), _rope_theta(target))):
        if isinstance(draft_value, (int, float)) and isinstance(target_value, (int, float)) and draft_value != target_value:
            out.append(F.finding("target-mismatch", (
                f"draft {field} {draft_value:g} but the target's is {target_value:g}: drafts are trained with their "
                f"target's (speculators, SpecForge and the EAGLE configs copy it), and the engine computes this draft's "
                f"layer with {draft_value:g}"), severity=F.WARNING))
    return out


def is_eagle3_draft(path) -> bool:
    """An EAGLE-3 draft by its config (class or speculators type) or, failing that, its fc width."""
    from .checkpoint import open_checkpoint

    config = read_config(Path(path)) if Path(path).is_dir() else None
    if config:
        arch = " ".join(config.get("architectures") or [])
        if "Eagle3" in arch or config.get("speculators_model_type") == "eagle3":
            return True
    try:
        fc = open_checkpoint(path).find("fc.weight")
    except CheckpointError:
        return False
    return fc is not None and len(fc.shape) == 2 and fc.shape[1] >= 3 * fc.shape[0]


def launch_checks(algorithm: str, draft) -> list[F.Finding]:
    """Problems with a launch configuration, found before anything starts."""
    if draft is not None and algorithm.upper() == "EAGLE" and is_eagle3_draft(draft):
        return [F.finding("algorithm-mismatch", (
            f"{draft} is an EAGLE-3 draft but the launch uses --speculative-algorithm EAGLE: the engine skips its fc "
            "projection and accepts no draft token (accept length 1.00, no warning). Use EAGLE3"))]
    return []
