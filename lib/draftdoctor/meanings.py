"""Two draft configs compared by what they mean to the engines, not by their text.

A config's meaning on one engine release (`engine_meaning`, from the release's profile rows): the
target layers whose input it captures as aux states (`auxids`; with no ids read, its defaults, which
need the target's layer count), how many aux states fc takes, the norms it computes (speculators'
options it implements and reads from this config, the q/k norms of its draft class), the vocabularies
it builds, and whether the head and the embedding are the draft's or the target's. `written_meaning`
is what the config states itself: its ids in their place's convention, the options it sets, its
vocabularies.

`compare_configs` evaluates both configs on the releases asked for, or on every release whose engine
reads both, groups neighbouring releases with one outcome into ranges, and says where the meanings
differ. Configs and tensor names only: no values, no heavy imports.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from itertools import groupby

from . import auxids
from .checkpoint import Checkpoint, CheckpointError
from .configs import (DRAFT_OPTIONS, MAX_DIM, SPECULATORS, ConfigValueError, DraftDims, config_format, draft_options,
                      layer_config, layer_options)
from .engines import EngineRelease, all_profiles, expect_release, fc_aux_count, parse_version
from .replay import config_problem

DEFAULTS = "defaults"  # no ids read: the engine captures its default layers, which depend on the target
SAME, DIFFERENT, NEEDS_TARGET, READS_ONE, READS_NEITHER = ("same", "different", "needs a target", "reads one",
                                                           "reads neither")
WRITTEN = "as written"
QK_NORMS = "q/k norms"


def _has(checkpoint: Checkpoint, suffix: str) -> bool:
    return checkpoint.find(suffix) is not None


def is_draft(checkpoint: Checkpoint) -> bool:
    """An EAGLE-3 draft, by its fc or its config (a target has neither fc nor a draft's config)."""
    config = checkpoint.config or {}
    architectures = config.get("architectures")
    return (_has(checkpoint, "fc.weight") or config_format(config) == SPECULATORS or "eagle_config" in config
            or isinstance(architectures, list) and any("eagle" in str(a).lower() for a in architectures))


def engine_meaning(profile, config: dict, dims: DraftDims, checkpoint: Checkpoint, n_layers: int | None) -> dict:
    """What the engine of `profile` (the row it builds this config with) does with `config`."""
    read = any(auxids.ids_at(config, where) for where in profile.aux.aux_ids_from)
    layers = (profile.aux.captured_layers(config, n_layers or 0) if read
              else auxids.default_layers(n_layers) if n_layers else DEFAULTS)
    fmt, carried = config_format(config), layer_options(config)
    norms = []
    for option in DRAFT_OPTIONS:
        on = profile.option_enabled(config, option)
        if option == "fc_norm" and "fc_norm" not in config and "use_aux_norm" in config:
            on = bool(config["use_aux_norm"]) and profile.config.reads_use_aux_norm  # SGLang's older name
        dropped = fmt == SPECULATORS and option in profile.config.speculators_drops and option not in carried
        if on and profile.implements(option) and not dropped:
            norms.append(option)
    if profile.build.supports_qk_norm:
        norms.append(QK_NORMS)
    draft_vocab = dims.draft_vocab_size or dims.vocab_size
    unwritten = profile.unwritten
    head_from_target = dims.draft_vocab_size is None or (
        "lm_head" in unwritten.from_target_when_absent and not _has(checkpoint, "lm_head.weight"))
    embed_from_target = (unwritten.embed_from_target and dims.target_hidden_size in (None, dims.hidden_size)) or (
        "embed" in unwritten.from_target_when_absent and not _has(checkpoint, "embed_tokens.weight"))
    return {"aux layers": layers, "fc aux states": fc_aux_count(profile, dims),
            "norms": tuple(norms), "vocabularies": (dims.vocab_size, draft_vocab),
            "head": "the target's" if head_from_target else "the draft's",
            "embedding": "the target's" if embed_from_target else "the draft's",
            "draft class": profile.build.draft_class}


def written_meaning(config: dict, dims: DraftDims, n_layers: int | None) -> dict:
    """What the config states: the layers its ids name (in their place's convention), the options it
    sets, its vocabularies."""
    ids, where = auxids.find(config)
    layers = (tuple(auxids.trained_layers(ids, where)) if ids
              else auxids.default_layers(n_layers) if n_layers else DEFAULTS)
    return {"aux layers": layers, "norms": tuple(o for o, on in draft_options(config).items() if on),
            "vocabularies": (dims.vocab_size, dims.draft_vocab_size or dims.vocab_size)}


def _text(aspect: str, value) -> str:
    if aspect == "aux layers":
        return "the defaults [2, N//2, N-3]" if value == DEFAULTS else str(list(value))
    if aspect == "norms":
        return ", ".join(value) or "none"
    if aspect == "vocabularies":
        return f"{value[0]}/{value[1]} (target/draft)"
    return str(value)


def _layers_settle(a, b) -> tuple[str, str]:
    """(SAME | DIFFERENT | NEEDS_TARGET, why) for captured layers, one side possibly the defaults."""
    if a == b:
        return SAME, ""
    if DEFAULTS not in (a, b):
        return DIFFERENT, ""
    ids = b if a == DEFAULTS else a
    n = ids[-1] + 3 if len(ids) == 3 else None
    if n is not None and tuple(ids) == auxids.default_layers(n):
        return NEEDS_TARGET, f"the same only for a {n}-layer target: give --target to settle it"
    return DIFFERENT, "different for every target"


def differences(a: dict, b: dict) -> tuple[str, list[str]]:
    """(SAME | DIFFERENT | NEEDS_TARGET, one text per aspect that differs) of two meanings."""
    outcome, out = SAME, []
    for aspect in a:
        if aspect == "aux layers":
            settled, why = _layers_settle(a[aspect], b[aspect])
        else:
            settled, why = (SAME, "") if a[aspect] == b[aspect] else (DIFFERENT, "")
        if settled == SAME:
            continue
        outcome = DIFFERENT if DIFFERENT in (outcome, settled) else settled
        out.append(f"{aspect}: A {_text(aspect, a[aspect])}, B {_text(aspect, b[aspect])}" + (f" ({why})" if why else ""))
    return outcome, out


def summary(meaning: dict) -> str:
    """One line for a meaning both sides share."""
    return ", ".join(f"{aspect} {_text(aspect, value)}" for aspect, value in meaning.items())


@dataclass
class ConfigRow:
    """One release range (or the configs as written) and what it makes of the two configs."""

    releases: str
    outcome: str  # SAME | DIFFERENT | NEEDS_TARGET | READS_ONE | READS_NEITHER
    differences: list[str] = field(default_factory=list)
    summary: str = ""
    counted: bool = True  # whether it decides `same` (releases that read only one config do not, by default)


@dataclass
class ConfigComparison:
    """Both configs, compared by meaning per engine release; `same` None when they were not compared."""

    note: str = ""
    target_layers: int | None = None
    rows: list[ConfigRow] = field(default_factory=list)
    same: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def unsettled_only(self) -> bool:
        """Whether every counted outcome that is not SAME waits only for the target's layer count."""
        return all(r.outcome in (SAME, NEEDS_TARGET) for r in self.rows if r.counted)

    @property
    def differing(self) -> list[str]:
        """The releases (or WRITTEN) whose counted outcome is not SAME."""
        return [r.releases for r in self.rows if r.counted and r.outcome != SAME]


def target_layers(path) -> int:
    """The layer count of the target model at `path` (its folder or config.json); CheckpointError
    when it has none a target could have."""
    from .checks import read_target_config

    n = layer_config(read_target_config(path)).get("num_hidden_layers")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_DIM:
        raise CheckpointError(path, f"the target's config has no usable num_hidden_layers ({json.dumps(n)[:40]})")
    return n


def _dims(checkpoint: Checkpoint) -> tuple[DraftDims | None, str]:
    """The draft's dimensions, or None and why its config cannot be read as a draft's."""
    config = checkpoint.config or {}
    architectures = config.get("architectures")
    try:
        if architectures is not None and not (isinstance(architectures, list)
                                              and all(isinstance(a, str) for a in architectures)):
            raise ConfigValueError(f"architectures must be a list of class names, not {json.dumps(architectures)[:80]}")
        for holder in (config, layer_config(config) if isinstance(layer_config(config), dict) else {}):
            if not isinstance(holder.get("model_type", ""), str):
                raise ConfigValueError(f"model_type must be a name, not {json.dumps(holder['model_type'])[:80]}")
        return DraftDims.from_config(config), ""
    except (KeyError, ConfigValueError, TypeError, ValueError) as e:
        return None, f"{checkpoint.config_path}: cannot be read as a draft config ({type(e).__name__}: {e})"[:300]


def _versions(engine_name: str) -> list[str]:
    """Every release a row of `engine_name` starts or ends at, oldest first: between two neighbours nothing
    changes, so evaluating these is evaluating every release."""
    found = {v for p in all_profiles() if p.engine_name == engine_name for v in (p.first, p.last)}
    return sorted(found, key=parse_version)


def _outcome(engine: EngineRelease, sides, n_layers: int | None, asked: bool) -> tuple:
    """(outcome, differences, summary, counted) of one release for both sides."""
    readable, problems = [], []
    for checkpoint, dims, _ in sides:
        try:
            profile = None if dims is None else engine.profile_for(checkpoint.config)
            problem = None if dims is None else config_problem(profile, engine.release, checkpoint, dims)
        except (TypeError, AttributeError, ValueError) as e:  # a field of a shape no engine reads
            profile, problem, dims = None, None, None
            problems.append(f"unreadable: {type(e).__name__}")
        else:
            problems.append("unreadable" if dims is None else problem.code if problem else "")
        readable.append((profile, problem) if dims is not None and problem is None else None)
    if all(readable):
        meanings = [engine_meaning(profile, checkpoint.config, dims, checkpoint, n_layers)
                    for (profile, _), (checkpoint, dims, _) in zip(readable, sides)]
        outcome, found = differences(*meanings)
        return outcome, tuple(found), summary(meanings[0]) if outcome == SAME else "", True
    which = [name for name, r in zip("AB", readable) if r]
    if which:
        other = "B" if which[0] == "A" else "A"
        return READS_ONE, (f"reads only {which[0]}'s config ({other}'s: {problems['AB'.index(other)]})",), "", asked
    return READS_NEITHER, (f"reads neither config (A's: {problems[0]}, B's: {problems[1]})",), "", False


def compare_configs(a: Checkpoint, b: Checkpoint, engines: list[EngineRelease] | None = None,
                    n_layers: int | None = None) -> ConfigComparison:
    """A's and B's configs compared by meaning: as written, then on each of `engines` (default: every
    release whose engine reads both, neighbouring releases with one outcome grouped into a range)."""
    result = ConfigComparison(target_layers=n_layers)
    if a.config is None and b.config is None:
        result.note = "neither has a config.json"
        return result
    if a.config is None or b.config is None:
        result.note = f"only {'B' if a.config is None else 'A'} has a config.json"
        result.same = False
        return result
    if not (is_draft(a) and is_draft(b)):
        result.note = (f"not compared by meaning: {'A' if not is_draft(a) else 'B'} is not an EAGLE-3 draft "
                       "(no fc.weight, no draft config)")
        return result
    sides = [(c, *_dims(c)) for c in (a, b)]
    unreadable = [problem for _, dims, problem in sides if dims is None]
    if unreadable:
        result.note = "; ".join(unreadable)
    else:
        outcome, found = differences(*(written_meaning(c.config, dims, n_layers) for c, dims, _ in sides))
        result.rows.append(ConfigRow(WRITTEN, outcome, found, summary(written_meaning(a.config, sides[0][1], n_layers))
                                     if outcome == SAME else ""))
    asked = engines is not None
    names = (dict.fromkeys(expect_release(e, "engines").name for e in engines) if asked
             else dict.fromkeys(p.engine_name for p in all_profiles()))
    for name in names:
        releases = ([e for e in engines if e.name == name] if asked
                    else [EngineRelease.of(name, v) for v in _versions(name)])
        evaluated = [(e.release, _outcome(e, sides, n_layers, asked)) for e in releases]
        # releases asked for are rows of their own (what lies between them was not evaluated)
        runs = ([[item] for item in evaluated] if asked
                else [list(run) for _, run in groupby(evaluated, key=lambda item: item[1])])
        for run in runs:
            key = run[0][1]
            run = [v for v, _ in run]
            label = f"{name}=={run[0]}" if run[0] == run[-1] else f"{name} {run[0]}–{run[-1]}"
            outcome, found, shared, counted = key
            result.rows.append(ConfigRow(label, outcome, list(found), shared, counted))
    compared = [r for r in result.rows if r.counted and r.releases != WRITTEN]
    if not compared and not asked:
        result.note = "; ".join(filter(None, (result.note, "no engine release reads both configs")))
    if unreadable or not (compared or asked):  # nothing to evaluate: only equal configs mean the same
        result.same = a.config == b.config
    else:
        result.same = all(r.outcome == SAME for r in result.rows if r.counted)
    return result
