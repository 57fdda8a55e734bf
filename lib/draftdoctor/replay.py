"""The replay: an engine profile's `load_weights` played over a checkpoint's keys, which makes a
`CoverageReport` (draftdoctor.coverage) without running the engine.

For every checkpoint key: the parameter (and shard of a fused parameter) it would write, or why it
would not (derived into an attribute, ignored by design, dropped, crash). For every parameter the
engine creates: written, partly written, never written (left at its initial values), taken from the
target at serve time, or shape mismatch. Keys are replayed in the order SGLang's safetensors
iterator yields them (files in order, names sorted), and the replay stops where the engine would
raise, as the real load would. The real loader (draftdoctor.realcheck) makes the same report from
the engine's own run; `diagnose` chooses between them.
"""

from __future__ import annotations

from . import findings as F
from .checkpoint import Checkpoint
from .configs import FLAT, MISSING, SPECULATORS, DraftDims, config_format
from .engines import CRASH, WARN, EngineRelease, ParamSpec, Profile, expect_release, parameters
from .layouts import detect_layout, is_training_only
from .coverage import (PAIR_REASON, PARAM_MISMATCH, CRASHED, DERIVED, DROPPED, IGNORED, LOADED, MISMATCH, NOT_REACHED, PARTIAL, TRAINING_ONLY,
                       UNINITIALIZED, WRITTEN, CoverageReport, KeyStatus, ParamStatus, coverage_findings,
                       dominant_dtype_bytes, draft_dims, resized_finding, settle_unwritten)


def _nbytes(shape, dtype_bytes: int) -> int:
    n = dtype_bytes
    for d in shape:
        n *= d
    return n


def _lookup(profile: Profile, name: str, params: dict) -> str | None:
    return next((c for c in profile.lookup_names(name) if c in params), None)


def renamed(profile: Profile, key: str) -> str:
    """The key after the profile's legacy renames (substring; `^old`: only at the start)."""
    name = key
    for old, new in profile.legacy_renames:
        if old.startswith("^"):
            name = new + name[len(old) - 1:] if name.startswith(old[1:]) else name
        elif old in name:
            name = name.replace(old, new)
    return name


PAIRED = "paired"  # resolve_key's status for a key the loader holds until its partner arrives


def resolve_key(profile: Profile, key: str, params: dict) -> tuple[str, str | None, object, str]:
    """Follow the profile's resolution steps for one key -> (status, parameter, shard, reason). A key
    of a cached pair (`Profile.paired_keys`) gets PAIRED with the name it is looked up as; the replay
    settles it when its partner arrives, or at the end."""
    name = renamed(profile, key)
    for sub, attribute in profile.derived_keys:
        if sub in name:
            return DERIVED, None, None, f"becomes the {attribute} attribute"
    for sub in profile.ignored_keys:
        if sub in name:
            return IGNORED, None, None, f"{sub} is skipped by design"
    for sub in profile.dropped_unless_built:
        if sub in name and not any(sub in param for param in params):
            return DROPPED, None, None, f"the config builds no {sub.strip('.')}; the loader drops it silently"
    for sub, param in profile.renamed_keys:
        if sub in name:
            if param in params:
                return LOADED, param, None, f"renamed to {param}"
            return _unmatched(profile, key, param, profile.on_unmatched)
    for weight_name, param_name, shard in profile.stacked:
        if weight_name in name:
            fused = name.replace(weight_name, param_name)
            target = _lookup(profile, fused, params)
            if target is None:
                return _unmatched(profile, key, fused, profile.on_unmatched_stacked, params)
            return LOADED, target, shard, ""
    if any(first in name or second in name for first, second, _ in profile.paired_keys):
        return PAIRED, profile.lookup_names(name)[-1], None, ""
    target = _lookup(profile, name, params)
    if target is None:
        return _unmatched(profile, key, name, profile.on_unmatched, params)
    return LOADED, target, None, ""


def _failing_prefix(name: str, params) -> str:
    """The part of `name` a module-tree loader (vLLM's AutoWeightsLoader) names when it cannot place
    it: its components up to the first one no parameter path has at that place."""
    parts = name.split(".")
    paths = [p.split(".") for p in params]
    depth = 0
    while depth < len(parts) and any(p[:depth + 1] == parts[:depth + 1] for p in paths):
        depth += 1
    return ".".join(parts[:depth + 1])


def _unmatched(profile: Profile, key: str, tried: str, on_unmatched: tuple[str, str], params=()):
    policy, message = on_unmatched
    if is_training_only(key) and policy != CRASH:
        return TRAINING_ONLY, None, None, "training-only tensor; no engine parameter exists for it"
    last = profile.lookup_names(tried)[-1]  # the name the engine looked up last
    if key.endswith(profile.unmatched_skipped_suffixes):
        return DROPPED, None, None, f"no parameter {last}; skipped silently (unexpected {key.rsplit('.', 1)[-1]} weights are ignored)"
    inner = last.startswith("model.")
    outer_module, inner_module = profile.module_names
    prefix = _failing_prefix(last.removeprefix("model.") if inner else last,
                             [p.removeprefix("model.") for p in params if p.startswith("model.") == inner])
    said = (f': "{message.format(name=last, local=tried, key=key, prefix=prefix, module=inner_module if inner else outer_module)}"'
            if message else "")
    if policy == CRASH:
        return CRASHED, None, None, f"no parameter {last}; the load fails{said}"
    if policy == WARN:
        return DROPPED, None, None, f"no parameter {last}; skipped with a warning{said}"
    return DROPPED, None, None, f"no parameter {last}; skipped silently"


def _iteration_order(checkpoint: Checkpoint, key_order: str = "sorted"):
    """Keys in the order SGLang's safetensors iterator yields them: file by file, names sorted (or, for
    `key_order` "offset", in the order of their data in the file)."""
    for shard in checkpoint.shards:
        if key_order == "offset":
            yield from (t.name for t in sorted(shard.tensors, key=lambda t: t.begin))
        else:
            yield from sorted(t.name for t in shard.tensors)


def unmodelled_class(profile: Profile, release: str, config: dict | None) -> F.Finding | None:
    """`replay-not-modelled` when a flat config names a draft class the release builds but the replay does
    not model (`Profile.unmodelled_classes`), else None."""
    if config_format(config) != FLAT:
        return None
    unmodelled = [a for a in profile.registry_names(config.get("architectures") or []) if a in profile.unmodelled_classes]
    if not unmodelled:
        return None
    return F.finding("replay-not-modelled", (
        f"{profile.engine} {release} builds {unmodelled[0]} for this draft, a draft class the replay does not "
        f"model; `--loader real` runs {profile.engine} {release}'s own loader"))


def speculators_type_problem(profile: Profile, release: str, checkpoint: Checkpoint) -> F.Finding | None:
    """`config-unreadable` when the release's reader of speculators' config refuses its
    `speculators_model_type`, or lacks a key that type needs (`Profile.speculators_types`), else None."""
    kind = checkpoint.config.get("speculators_model_type")
    if profile.speculators_types is None or kind is None:
        return None
    where, read = checkpoint.config_path, dict(profile.speculators_types)
    if kind not in read:
        said = dict(profile.speculators_refusals).get(
            kind, "Expected one of: {...}. Please ensure you're loading a speculators-format model.")
        return F.finding("config-unreadable", (
            f"{where}: {profile.engine} {release} reads speculators_model_type {' or '.join(map(repr, read))} as an "
            f"EAGLE-3 draft, not {kind!r}: \"{said}\""))
    missing = [key for key in read[kind] if key not in checkpoint.config]
    if missing:
        return F.finding("config-unreadable", (
            f"{where}: {profile.engine} {release} reads a {kind!r} speculators config only with {missing[0]!r} at its "
            f"top level: \"KeyError: {missing[0]!r}\""))
    return None


def config_problem(profile: Profile, release: str, checkpoint: Checkpoint, dims: DraftDims) -> F.Finding | None:
    """Why the engine cannot read or build from this config, in the engine's own words where known."""
    config, fmt = checkpoint.config, config_format(checkpoint.config)
    where = str(checkpoint.config_path)
    if fmt == MISSING:
        return F.finding("config-unreadable", f"{where} does not exist; {profile.engine} needs it to build the draft")
    if fmt not in profile.config_formats:
        if fmt != FLAT:
            return F.finding(
                "config-unreadable",
                f"{profile.engine} cannot read {where} ({fmt} format): \"Unrecognized model in "
                f"{checkpoint.folder}. Should have a `model_type` key in its config.json\"; "
                + ("this release's transformers (4.x) may instead take a model type named in the folder's path, "
                   "and the build then fails: the server does not start either way; " if profile.model_type_from_path else "")
                + f"`draftdoctor fix --engine {profile.engine}=={release}` writes the flat config it reads",
            )
    unmodelled = unmodelled_class(profile, release, config)
    if unmodelled is not None:
        return unmodelled
    refused = speculators_type_problem(profile, release, checkpoint) if fmt == SPECULATORS else None
    if refused is not None:
        return refused
    layer_type = (config.get("transformer_layer_config") or {}).get("model_type") or "llama"
    if fmt == SPECULATORS and profile.speculators_classes and layer_type not in dict(profile.speculators_classes):
        return F.finding("config-unreadable", (
            f"{where}: {profile.engine} reads speculators' config by its layer model_type, and has no EAGLE-3 class "
            f"for {layer_type!r}: \"Unsupported model_type {layer_type} for Eagle3 speculator\""))
    architectures = config.get("architectures") or []
    rewritten = dict(profile.rewritten_model_types).get(config.get("model_type")) if fmt == FLAT else None
    if rewritten:
        return F.finding("config-unreadable", (
            f"{where}: {profile.engine} turns a draft of model_type {config.get('model_type')!r} into its MTP module "
            f"before the registry: \"Model architectures ['{rewritten}'] are not supported for now\"; a model_type "
            f"such as deepseek_v2 or kimi_k2 keeps {architectures[0] if architectures else 'the draft class'}"))
    looked_up = profile.registry_names(architectures)
    if fmt == FLAT and profile.builds_a_target_model(architectures):
        return F.finding(
            "loader-crash",
            f"{where}: architectures {architectures} name a target model, not an EAGLE-3 draft: {profile.engine} "
            f"builds a plain {looked_up[0]}, which has no fc and no draft layer, and its build or load fails (seen "
            f"with SGLang's own loaders); `draftdoctor fix --engine {profile.engine}=={release}` writes its EAGLE-3 class",
        )
    if fmt == FLAT and not set(looked_up) & set(profile.architectures):
        said = profile.unknown_architecture.format(architectures=looked_up, first=looked_up[0] if looked_up else None)
        return F.finding(
            "config-unreadable",
            f"{where}: {profile.engine} has no EAGLE-3 draft class for architectures {architectures}: \"{said}\" "
            f"(expected {profile.architectures[0]})",
        )
    if profile.needs_draft_vocab_size and "draft_vocab_size" not in config \
            and "draft_vocab_size" not in (config.get("transformer_layer_config") or {}):
        return F.finding("loader-crash", f"{where}: {profile.engine} {release}: {profile.needs_draft_vocab_size}")
    if profile.q_lora_required and dims.q_lora_rank is None:
        return F.finding("loader-crash", f"{where}: q_lora_rank is null; {profile.engine} {release} raises "
                                         f"\"{profile.q_lora_required}\" while building the draft")
    if fmt == FLAT and profile.null_target_hidden_crashes and "target_hidden_size" in config \
            and config["target_hidden_size"] is None:
        return F.finding(
            "loader-crash",
            f"{where}: target_hidden_size is null; {profile.engine} computes target_hidden_size * "
            "num_aux and fails (\"unsupported operand type(s) for *: 'NoneType' and 'int'\"). Remove the field.",
        )
    if fmt == FLAT and "draft_vocab_size" in config and config["draft_vocab_size"] is None \
            and profile.null_draft_vocab_error:
        return F.finding(
            "loader-crash",
            f"{where}: draft_vocab_size is null; {profile.engine} {profile.first}–{profile.last} sizes lm_head from "
            f"it and fails (\"{profile.null_draft_vocab_error}\"); later releases take the head from the target. "
            "Set it to the head's row count.",
        )
    if dims.num_layers != 1 and profile.single_layer_error:
        return F.finding(
            "loader-crash",
            f"{profile.engine} {profile.first}–{profile.last} builds one decoder layer and raises "
            f"\"{profile.single_layer_error}\" for num_hidden_layers={dims.num_layers}",
        )
    return None


def replay(checkpoint: Checkpoint, engine: EngineRelease, dims: DraftDims | None = None) -> CoverageReport:
    """The coverage report of loading `checkpoint` with `engine`'s profile; `dims`: the checkpoint's
    (`draft_dims`) when the caller has read them already."""
    expect_release(engine)
    profile, release = engine.profile_for(checkpoint.config), engine.release
    dims = draft_dims(checkpoint) if dims is None else dims
    dtype_bytes = dominant_dtype_bytes(checkpoint)
    specs: dict[str, ParamSpec] = {p.name: p for p in parameters(profile, dims)}
    params = {
        name: ParamStatus(name, p.role, p.shape, _nbytes(p.shape, dtype_bytes),
                          shards_missing=[str(s) for s in p.shards])
        for name, p in specs.items()
    }
    keys: list[KeyStatus] = []
    findings: list[F.Finding] = []
    blocking = config_problem(profile, release, checkpoint, dims)
    if blocking is not None:
        findings.append(blocking)
    fmt = config_format(checkpoint.config)
    # a config the engine cannot parse at all still has weights worth checking: they are replayed under
    # the config `fix` writes (its dims); any other refusal builds nothing
    crashed = blocking is not None and not (blocking.code == "config-unreadable" and fmt in (FLAT, SPECULATORS)
                                            and fmt not in profile.config_formats)
    if crashed:
        params = {}  # the engine fails while building the draft (or builds a class not modelled here)
    held: dict[str, KeyStatus] = {}  # keys of a cached pair waiting for their partner, by looked-up name
    for key in _iteration_order(checkpoint, profile.key_order):
        t = checkpoint.tensors[key]
        if crashed:
            keys.append(KeyStatus(key, NOT_REACHED, reason="the load failed before this key", shape=t.shape, nbytes=t.nbytes))
            continue
        status, target, shard, reason = resolve_key(profile, key, specs)
        ks = KeyStatus(key, status, target, None if shard is None else str(shard), reason, t.shape, t.nbytes)
        if status == LOADED:
            spec = specs[target]
            expected = spec.shard_shape(shard)
            if tuple(t.shape) != tuple(expected) and _resized_silently(profile, target, t.shape, expected):
                _mark_written(params[target], key, shard)
                findings.append(resized_finding(profile, key, t.shape, target, expected))
            elif tuple(t.shape) != tuple(expected):
                ks.status, ks.reason = MISMATCH, f"shape {list(t.shape)} does not fit {target} {list(expected)}"
                params[target].status = PARAM_MISMATCH
                findings.append(F.finding(
                    "shape-mismatch",
                    f"{key} {list(t.shape)} cannot load into {target}"
                    + (f" shard {shard}" if shard is not None else "") + f" {list(expected)}: "
                    f"\"Attempted to load weight ({list(t.shape)}) into parameter ({list(expected)})\"",
                ))
                crashed = True
            else:
                _mark_written(params[target], key, shard)
        elif status == CRASHED:
            findings.append(F.finding("loader-crash", f"{key}: {reason}"))
            crashed = True
        elif status == PAIRED:
            crashed = _settle_pair(profile, ks, target, held, specs, params, findings)
        keys.append(ks)
    report = CoverageReport(
        engine=engine, loader="replay", path=str(checkpoint.path),
        layout=detect_layout(checkpoint.tensors, checkpoint.config), config_format=config_format(checkpoint.config),
        params=list(params.values()), keys=keys, findings=findings, profile=profile,
    )
    for p in report.params:
        settle_unwritten(p, profile, dims, specs[p.name], checkpoint.tensors)
    missing = [p for p in report.params if p.status == UNINITIALIZED]
    if profile.unwritten_fails and missing and not crashed:  # llama.cpp's load refuses a missing tensor
        report.findings.append(F.finding("loader-crash", profile.unwritten_fails.format(name=missing[0].name)))
        crashed = True
    if crashed and profile.loads_all_or_nothing:
        _nothing_loaded(report)
    report.findings += coverage_findings(report)
    return report


def _nothing_loaded(report: CoverageReport) -> None:
    """A failed all-or-nothing load (`Profile.loads_all_or_nothing`): no parameter was written."""
    for p in report.params:
        if p.status in (WRITTEN, PARTIAL):
            p.status, p.keys, p.shards_written = UNINITIALIZED, [], []
    for k in report.keys:
        if k.status == LOADED:
            k.status, k.param, k.shard, k.reason = NOT_REACHED, None, None, "the load failed, and it loads all or nothing"


def pair_of(profile: Profile, name: str) -> tuple[str, str]:
    """(partner's looked-up name, fused parameter name) of a key of a cached pair (`Profile.paired_keys`)."""
    first, second, fused_sub = next(p for p in profile.paired_keys if p[0] in name or p[1] in name)
    partner = name.replace(first, second) if first in name else name.replace(second, first)
    return partner, (partner if first in partner else name).replace(first, fused_sub)


def _settle_pair(profile: Profile, ks: KeyStatus, name: str, held: dict, specs: dict, params: dict, findings: list) -> bool:
    """One key of a cached pair (`Profile.paired_keys`): held until its partner arrives, then both are
    concatenated (first, second) into the fused parameter; returns whether the load fails here."""
    first = next(p for p in profile.paired_keys if p[0] in name or p[1] in name)[0]
    partner, fused = pair_of(profile, name)
    ks.status, ks.param = DROPPED, None
    ks.reason = (f"held until {partner} arrives, which it never does: {profile.engine} never loads it, and says nothing")
    if partner not in held:
        held[name] = ks
        return False
    other = held.pop(partner)
    pair = (other, ks) if first in partner else (ks, other)
    if fused not in specs:
        for k in pair:
            k.reason = f"concatenated with its partner into {fused}, which is no parameter: dropped silently"
        return False
    shapes = [tuple(k.shape) for k in pair]
    want = specs[fused].shape
    if shapes[0][1:] != shapes[1][1:]:  # torch.cat fails before anything is written
        ks.status, ks.reason = MISMATCH, f"cannot be concatenated with {other.key} {list(other.shape)}"
        findings.append(F.finding("shape-mismatch", (
            f"{pair[0].key} {list(shapes[0])} and {pair[1].key} {list(shapes[1])} cannot be concatenated into {fused}: "
            "\"Sizes of tensors must match except in dimension 0\"")))
        return True
    if shapes[0][0] + shapes[1][0] != want[0] or shapes[0][1:] != want[1:]:
        got = [shapes[0][0] + shapes[1][0], *shapes[0][1:]]
        ks.status, ks.param, ks.reason = MISMATCH, fused, f"with {other.key}, shape {got} does not fit {fused} {list(want)}"
        params[fused].status = PARAM_MISMATCH
        findings.append(F.finding("shape-mismatch", (
            f"{pair[0].key} {list(shapes[0])} and {pair[1].key} {list(shapes[1])}, concatenated, cannot load into "
            f"{fused} {list(want)}")))
        return True
    for k in pair:
        k.status, k.param, k.reason = LOADED, fused, f"{PAIR_REASON} into {fused}"
        _mark_written(params[fused], k.key, None)
    return False


def _resized_silently(profile: Profile, param: str, got, expected) -> bool:
    """Whether the engine pads or cuts this weight to fit instead of failing (only one dim differs, on
    the side the engine resizes)."""
    differing = [d for d, (a, b) in enumerate(zip(got, expected)) if a != b]
    return len(got) == len(expected) and any(
        param.endswith(suffix) and differing == [dim] and (side == "either" or got[dim] > expected[dim])
        for suffix, dim, side in profile.resized_silently)


def _mark_written(param: ParamStatus, key: str, shard) -> None:
    param.keys.append(key)
    if shard is None:
        param.status, param.shards_missing = WRITTEN, []
        return
    shard = str(shard)
    if shard not in param.shards_written:
        param.shards_written.append(shard)
    if shard in param.shards_missing:
        param.shards_missing.remove(shard)
    param.status = PARTIAL if param.shards_missing else WRITTEN
