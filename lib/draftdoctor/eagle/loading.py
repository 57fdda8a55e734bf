"""The draft's weights as an engine release's loader leaves them, for the reference engine.

The coverage report (replayed profile, or the release's own loader run on CPU) says for every
checkpoint key which parameter and shard it writes; this module carries that out on the real
tensors. Parameters no key writes keep `draft.initial_value`, so a broken load behaves like the
story's. Then the parameters the engine takes from the target are the target's (SGLang's EAGLE
worker: always the embedding, the head when `draft_vocab_size` is null; vLLM's proposer: whichever
the draft lacks). SGLang releases and vLLM releases are emulated alike, from their profile rows:
names, vocabulary map (SGLang's hot_token_id attribute, vLLM's draft_id_to_target_id parameter),
aux layers, chain positions, norm_before_residual where the engine computes it.

A load the engine would refuse (unreadable config, loader crash, shape mismatch) raises
`LoadRefused` with the engine's own message, so the reference server refuses it too; so does a
vocabulary map that sends draft ids outside the target's vocabulary (the engine fails at the first one drafted).

`place` takes the diagnosis `check` made (so this module sits below `diagnose`, whose prediction runs
the placed draft) and a target that lends its dtype, its layer count and the tensors the engine takes
from it (`embed`, `head`): the reference Llama, or the recorded transformers target of a prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checkpoint import open_checkpoint
from ..coverage import DERIVED, LOADED, CoverageReport, draft_dims
from ..replay import replay
from ..engines import EngineRelease, parameters
from ..statuses import ParamFate
from .draft import EagleDraft, build_draft, initial_value
from .llama import TargetModel

REFUSING_CODES = ("config-unreadable", "loader-crash", "shape-mismatch", "replay-not-modelled")
# speculators' draft options the reference draft does not compute (norm_before_residual it does)
NOT_COMPUTED = ("norm_before_fc", "fc_norm", "norm_output")


class LoadRefused(RuntimeError):
    """The emulated engine would not start with this draft."""


@dataclass
class LoadedDraft:
    draft: EagleDraft
    report: CoverageReport
    capture: tuple[int, ...]  # target layers whose input the engine captures as aux states
    written: set[str]
    chain_offset: int  # rope position of draft chain step i is committed + chain_offset + i
    drafts_within_budget: bool = False  # ServedDraft.drafts_within_budget
    aux_repeats: bool = False  # AuxCapture.aux_repeats: a layer named twice is captured twice
    counts_accepted: str = "before_stop"  # ServedDraft.counts_accepted: which accepted drafts its counters count

    def speculate(self, target: TargetModel, prompt_ids: list[int], max_new_tokens: int, num_steps: int,
                  eos_token_id: int | None = None, draft: EagleDraft | None = None):
        """One request, speculated as the emulated engine runs this draft (or `draft` in its place)."""
        from .engine import speculative_generate

        return speculative_generate(target, draft or self.draft, self.capture, prompt_ids, max_new_tokens, num_steps,
                                    eos_token_id, chain_offset=self.chain_offset,
                                    drafts_within_budget=self.drafts_within_budget, aux_repeats=self.aux_repeats)


def place(report: CoverageReport, target, checkpoint=None) -> LoadedDraft:
    """Build the draft `report`'s engine runs from `report`'s checkpoint (or `checkpoint`, the open one
    `report` was made of: `fix`'s planned result, renamed, is no folder), as `report`'s loader (the
    replay, or the release's own) says it writes it; `target` (a `TargetModel`, or anything with its
    `dtype`, `n_layers`, `embed` and `head`) lends what the engine takes from the target."""
    engine = report.engine
    refusing = [f for f in report.findings if f.code in REFUSING_CODES]
    if refusing:
        raise LoadRefused("; ".join(f.brief() for f in refusing))
    checkpoint = checkpoint or open_checkpoint(report.path)
    profile = engine.profile_for(checkpoint.config)
    if profile.build.draft_class != "llama":
        raise LoadRefused(f"{engine} builds {profile.config.architectures[0]} ({profile.build.draft_class}) for this "
                          "draft; the reference backend computes the Llama EAGLE-3 draft only: measure it on a real "
                          "engine (--backend vllm)")
    computes = [o for o in NOT_COMPUTED if profile.implements(o) and profile.option_enabled(checkpoint.config, o)]
    if computes:
        raise LoadRefused(f"{engine} computes {', '.join(computes)} for this draft; the reference backend does not")
    placing, placed = engine, report
    if profile.build.naming != "hf":
        # llama.cpp places every tensor of a Llama EAGLE-3 checkpoint or refuses it (checked above); the
        # reference places them under vLLM's names (the same tensors, fused as the reference computes)
        placing = EngineRelease.newest("vllm")
        placed = replay(checkpoint, placing)
    dims = draft_dims(checkpoint)
    specs = {p.name: p for p in parameters(placing.profile_for(checkpoint.config), dims)}
    tensors = _Tensors(checkpoint)
    state: dict[str, torch.Tensor] = {}
    hot_token_id = None
    for key in placed.keys:
        if key.status == DERIVED and "d2t" in key.key:  # SGLang: hot_token_id = d2t + arange
            hot_token_id = _draft_to_target(tensors[key.key])
        if key.status != LOADED:
            continue
        if specs[key.param].role == "vocab-map":  # vLLM: draft_id_to_target_id holds d2t's offsets
            hot_token_id = _draft_to_target(tensors[key.key])
            continue
        spec = specs[key.param]
        if key.shard is None:
            state[key.param] = tensors[key.key]
            continue
        full = state.setdefault(key.param, initial_value(key.param, spec.shape).clone())
        offset, rows = spec.shard_range(key.shard)
        full[offset:offset + rows] = tensors[key.key]
    vocab = target.embed.shape[0]
    if hot_token_id is not None and len(hot_token_id) and not 0 <= hot_token_id.min() <= hot_token_id.max() < vocab:
        # the engine indexes its embedding (and its target-id tensors) with the mapped id at the next draft step:
        # out of range there, the first such id drafted stops the server (a device-side assert on GPU)
        raise LoadRefused(f"d2t maps draft ids to target ids {int(hot_token_id.min())}..{int(hot_token_id.max())}, "
                          f"outside the target's vocabulary 0..{vocab - 1}: the first such id drafted indexes the "
                          "embedding out of range")
    written = {p.name for p in placed.params if p.status in (ParamFate.WRITTEN, ParamFate.PARTIAL)
               and p.role != "vocab-map"}
    try:
        draft = build_draft(checkpoint.config, state, written, hot_token_id, engine=placing, dtype=target.dtype,
                            norm_before_residual=profile.option_enabled(checkpoint.config, "norm_before_residual"))
    except ValueError as e:  # what the reference draft does not compute (a rope scaling, tied embeddings, biases)
        raise LoadRefused(str(e)) from None
    # SGLang's EAGLE worker: set_embed (and set_embed_and_head without a draft vocabulary); vLLM's
    # proposer: the target's embedding or head for a draft without its own
    for p in placed.params:
        if p.replaced_by_target and p.role == "embed":
            draft.params[p.name] = target.embed
        elif p.replaced_by_target and p.role == "lm_head":
            draft.params[p.name] = target.head
    aux, serving = profile.aux, profile.serving
    return LoadedDraft(draft, report, aux.captured_layers(checkpoint.config, target.n_layers), written,
                       serving.chain_position_offset, serving.drafts_within_budget, aux.aux_repeats,
                       serving.counts_accepted)


# torch's view of each safetensors dtype a draft holds
TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                "BOOL": torch.bool}


class _Tensors:
    """A checkpoint's tensors by name, each read when asked for, from where its header says (so a renamed
    view of a checkpoint reads the bytes under their new names)."""

    def __init__(self, checkpoint):
        self.checkpoint = checkpoint

    def __getitem__(self, name: str) -> torch.Tensor:
        info = self.checkpoint.tensors[name]
        if info.dtype not in TORCH_DTYPES:
            raise LoadRefused(f"{name}: dtype {info.dtype} is not one the reference computes with")
        data = bytearray(info.read())
        return torch.frombuffer(data, dtype=TORCH_DTYPES[info.dtype]).reshape(info.shape) if data else \
            torch.empty(info.shape, dtype=TORCH_DTYPES[info.dtype])


def _draft_to_target(d2t: torch.Tensor) -> torch.Tensor:
    """Target id of each draft id: speculators' d2t holds target id - draft id."""
    offsets = d2t.long()
    return offsets + torch.arange(offsets.shape[0])
