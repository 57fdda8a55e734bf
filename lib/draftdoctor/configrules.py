"""Reading the config: why a release cannot read or build a draft from its config.json, as rules.

`RULES` is data, one row per way a release refuses a config, in the order the engine meets them: a
condition on what was read (`Reading`: the config, its format, the draft's dims, the release's row), the
finding code, the message (a `str.format` template over the `Reading`, as `r`, in the engine's own
words where known), and the docs/engine-facts.md heading the fact comes from. `config_problem` is their
one interpreter: the first rule that holds is the finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from . import findings as F
from .checkpoint import Checkpoint
from .configs import FLAT, MISSING, SPECULATORS, DraftDims, config_format
from .engines import Profile


@dataclass(frozen=True)
class Rule:
    """When `holds(reading)`, the release refuses the config with `code` and `message`."""

    cites: str  # the docs/engine-facts.md heading the fact is from
    holds: Callable[["Reading"], object]
    code: str
    message: str  # formatted with the Reading as `r`


@dataclass
class Reading:
    """What the rules read: a release's row, a draft's config (and its dims), and what they derive."""

    profile: Profile
    release: str
    config: dict | None
    where: str  # the config's path, as messages name it
    folder: str = ""
    dims: DraftDims | None = None

    @cached_property
    def fmt(self) -> str:
        return config_format(self.config)

    @property
    def flat(self) -> bool:
        return self.fmt == FLAT

    @property
    def speculators(self) -> bool:
        return self.fmt == SPECULATORS

    @property
    def engine(self) -> str:
        return self.profile.engine

    @cached_property
    def layer_config(self) -> dict:
        return self.config.get("transformer_layer_config") or {}

    @cached_property
    def architectures(self) -> list:
        return self.config.get("architectures") or []

    @cached_property
    def looked_up(self) -> list[str]:
        return self.profile.config.registry_names(self.architectures)

    @cached_property
    def unmodelled(self) -> list[str]:
        return [a for a in self.looked_up if a in self.profile.config.unmodelled_classes]

    @property
    def path_note(self) -> str:
        return ("this release's transformers (4.x) may instead take a model type named in the folder's path, "
                "and the build then fails: the server does not start either way; "
                if self.profile.config.model_type_from_path else "")

    @cached_property
    def kind(self):
        return self.config.get("speculators_model_type")

    @cached_property
    def types_read(self) -> dict | None:
        """speculators_model_type -> the top-level keys its reader needs; None: the release reads no type."""
        types = self.profile.config.speculators_types
        return None if types is None or self.kind is None else dict(types)

    @property
    def read_types(self) -> str:
        return " or ".join(map(repr, self.types_read))

    @property
    def refusal(self) -> str:
        return dict(self.profile.config.speculators_refusals).get(
            self.kind, "Expected one of: {...}. Please ensure you're loading a speculators-format model.")

    @cached_property
    def missing(self) -> list[str]:
        return [key for key in self.types_read[self.kind] if key not in self.config]

    @cached_property
    def layer_type(self) -> str:
        return self.layer_config.get("model_type") or "llama"

    @cached_property
    def rewritten(self) -> str | None:
        return dict(self.profile.config.rewritten_model_types).get(self.config.get("model_type")) if self.flat else None

    @property
    def kept_class(self) -> str:
        return self.architectures[0] if self.architectures else "the draft class"

    @property
    def unknown_said(self) -> str:
        looked_up = self.looked_up
        return self.profile.config.unknown_architecture.format(architectures=looked_up,
                                                               first=looked_up[0] if looked_up else None)

    @cached_property
    def hidden_act(self):
        """The activation the draft's MLP is built with (transformers' default: silu)."""
        return (self.layer_config if self.speculators else self.config).get("hidden_act", "silu")

    @property
    def activation_error(self) -> str:
        return self.profile.build.activation_error.format(act=self.hidden_act)

    def null(self, key: str) -> bool:
        """The config has `key` at its top level, set to null."""
        return key in self.config and self.config[key] is None


SGLANG, VLLM, FORMATS, REAL = ("SGLang's EAGLE-3 loader", "vLLM's EAGLE-3 loader", "Config formats",
                               "Real engines on these CPUs")
_FIX_WRITES = "`draftdoctor fix --engine {r.engine}=={r.release}` writes"

RULES: tuple[Rule, ...] = (
    Rule(FORMATS, lambda r: r.fmt == MISSING, "config-unreadable",
         "{r.where} does not exist; {r.engine} needs it to build the draft"),
    Rule(SGLANG, lambda r: r.fmt not in r.profile.config.config_formats and not r.flat, "config-unreadable",
         "{r.engine} cannot read {r.where} ({r.fmt} format): \"Unrecognized model in {r.folder}. Should have a "
         "`model_type` key in its config.json\"; {r.path_note}" + _FIX_WRITES + " the flat config it reads"),
    Rule(VLLM, lambda r: r.flat and r.unmodelled, "replay-not-modelled",
         "{r.engine} {r.release} builds {r.unmodelled[0]} for this draft, a draft class the replay does not model; "
         "`--loader real` runs {r.engine} {r.release}'s own loader"),
    Rule(VLLM, lambda r: r.speculators and r.types_read is not None and r.kind not in r.types_read,
         "config-unreadable", "{r.where}: {r.engine} {r.release} reads speculators_model_type {r.read_types} as an "
                              "EAGLE-3 draft, not {r.kind!r}: \"{r.refusal}\""),
    Rule(VLLM, lambda r: r.speculators and r.types_read is not None and r.missing, "config-unreadable",
         "{r.where}: {r.engine} {r.release} reads a {r.kind!r} speculators config only with {r.missing[0]!r} at its "
         "top level: \"KeyError: {r.missing[0]!r}\""),
    Rule(VLLM, lambda r: r.speculators and r.profile.config.speculators_classes
         and r.layer_type not in dict(r.profile.config.speculators_classes), "config-unreadable",
         "{r.where}: {r.engine} reads speculators' config by its layer model_type, and has no EAGLE-3 class for "
         "{r.layer_type!r}: \"Unsupported model_type {r.layer_type} for Eagle3 speculator\""),
    Rule(VLLM, lambda r: r.rewritten, "config-unreadable",
         "{r.where}: {r.engine} turns a draft of model_type {r.config[model_type]!r} into its MTP module before the "
         "registry: \"Model architectures ['{r.rewritten}'] are not supported for now\"; a model_type such as "
         "deepseek_v2 or kimi_k2 keeps {r.kept_class}"),
    Rule("Published drafts", lambda r: r.flat and r.profile.config.builds_a_target_model(r.architectures),
         "loader-crash",
         "{r.where}: architectures {r.architectures} name a target model, not an EAGLE-3 draft: {r.engine} builds a "
         "plain {r.looked_up[0]}, which has no fc and no draft layer, and its build or load fails (seen with SGLang's "
         "own loaders); " + _FIX_WRITES + " its EAGLE-3 class"),
    Rule(SGLANG, lambda r: r.flat and not set(r.looked_up) & set(r.profile.config.architectures), "config-unreadable",
         "{r.where}: {r.engine} has no EAGLE-3 draft class for architectures {r.architectures}: \"{r.unknown_said}\" "
         "(expected {r.profile.config.architectures[0]})"),
    Rule(REAL, lambda r: r.profile.config.needs_draft_vocab_size and "draft_vocab_size" not in r.config
         and "draft_vocab_size" not in r.layer_config, "loader-crash",
         "{r.where}: {r.engine} {r.release}: {r.profile.config.needs_draft_vocab_size}"),
    Rule(SGLANG, lambda r: r.profile.build.q_lora_required and r.dims.q_lora_rank is None, "loader-crash",
         "{r.where}: q_lora_rank is null; {r.engine} {r.release} raises "
         "\"{r.profile.build.q_lora_required}\" while building the draft"),
    Rule(SGLANG, lambda r: r.flat and r.profile.build.null_target_hidden_crashes and r.null("target_hidden_size"),
         "loader-crash", "{r.where}: target_hidden_size is null; {r.engine} computes target_hidden_size * num_aux and "
                         "fails (\"unsupported operand type(s) for *: 'NoneType' and 'int'\"). Remove the field."),
    Rule(SGLANG, lambda r: r.flat and r.null("draft_vocab_size") and r.profile.build.null_draft_vocab_error,
         "loader-crash",
         "{r.where}: draft_vocab_size is null; {r.engine} {r.profile.first}–{r.profile.last} sizes lm_head from it and "
         "fails (\"{r.profile.build.null_draft_vocab_error}\"); later releases take the head from the target. Set it "
         "to the head's row count."),
    Rule(SGLANG, lambda r: r.dims.num_layers != 1 and r.profile.build.single_layer_error, "loader-crash",
         "{r.engine} {r.profile.first}–{r.profile.last} builds one decoder layer and raises "
         "\"{r.profile.build.single_layer_error}\" for num_hidden_layers={r.dims.num_layers}"),
    Rule(SGLANG, lambda r: r.profile.build.activation_error and r.hidden_act != "silu", "loader-crash",
         "{r.where}: hidden_act {r.hidden_act!r}; {r.engine} {r.release} builds the draft's MLP with silu only and "
         "raises \"{r.activation_error}\": the server does not start. A draft trained with silu (its target's "
         "activation) needs hidden_act: \"silu\""),
)


def first_problem(reading: Reading, rules=RULES) -> F.Finding | None:
    """The finding of the first of `rules` that holds for `reading`, None when none does."""
    rule = next((rule for rule in rules if rule.holds(reading)), None)
    return None if rule is None else F.finding(rule.code, rule.message.format(r=reading))


def config_problem(profile: Profile, release: str, checkpoint: Checkpoint, dims: DraftDims) -> F.Finding | None:
    """Why the engine cannot read or build from this config, in the engine's own words where known."""
    return first_problem(Reading(profile, release, checkpoint.config, str(checkpoint.config_path),
                                 str(checkpoint.folder), dims))


def unmodelled_class(profile: Profile, release: str, config: dict | None) -> F.Finding | None:
    """`replay-not-modelled` when a flat config names a draft class the release builds but the replay does
    not model (`ConfigReading.unmodelled_classes`), else None."""
    return first_problem(Reading(profile, release, config, ""), [r for r in RULES if r.code == "replay-not-modelled"])
