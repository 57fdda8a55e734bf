"""The draft's weights as an engine release's loader leaves them, for the reference engine.

The coverage report (replayed profile, or the release's own loader run on CPU) says for every
checkpoint key which parameter and shard it writes; this module carries that out on the real
tensors. Parameters no key writes keep `draft.initial_value`, so a broken load behaves like the
story's. Then, as SGLang's EAGLE worker does at start-up, the target's embedding replaces the
draft's (and the target's head too when `draft_vocab_size` is null).

A load the engine would refuse (unreadable config, loader crash, shape mismatch) raises
`LoadRefused` with the engine's own message, so the reference server refuses it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checkpoint import open_checkpoint
from ..coverage import DERIVED, LOADED, CoverageReport, draft_dims
from ..diagnose import check
from ..engines import parameters, resolve_engine
from ..statuses import ParamFate
from .draft import EagleDraft, build_draft, initial_value
from .llama import TargetModel, load_safetensors_dir

REFUSING_CODES = ("config-unreadable", "loader-crash", "shape-mismatch")


class LoadRefused(RuntimeError):
    """The emulated engine would not start with this draft."""


@dataclass
class LoadedDraft:
    draft: EagleDraft
    report: CoverageReport
    capture: tuple[int, ...]  # target layers whose input the engine captures as aux states
    written: set[str]


def load_for_engine(draft_dir, engine, target: TargetModel, loader: str = "replay") -> LoadedDraft:
    """Build the draft `engine` (an SGLang release: Engine or spec) would run from `draft_dir`, loaded by `loader`."""
    engine = resolve_engine(engine)
    profile = engine.profile
    if profile.engine != "sglang":
        raise LoadRefused(f"the reference backend emulates SGLang releases; {engine} is not one")
    report = check(draft_dir, engine, loader=loader)
    refusing = [f for f in report.findings if f.code in REFUSING_CODES]
    if refusing:
        raise LoadRefused("; ".join(f"{f.code}: {f.message}" for f in refusing))
    checkpoint = open_checkpoint(draft_dir)
    dims = draft_dims(checkpoint)
    specs = {p.name: p for p in parameters(profile, dims)}
    tensors = load_safetensors_dir(checkpoint.folder)
    state: dict[str, torch.Tensor] = {}
    hot_token_id = None
    for key in report.keys:
        if key.status == DERIVED and "d2t" in key.key:
            offsets = tensors[key.key].long()
            hot_token_id = offsets + torch.arange(offsets.shape[0])
        if key.status != LOADED:
            continue
        spec = specs[key.param]
        if key.shard is None:
            state[key.param] = tensors[key.key]
            continue
        full = state.setdefault(key.param, initial_value(key.param, spec.shape).clone())
        offset, rows = spec.shard_range(key.shard)
        full[offset:offset + rows] = tensors[key.key]
    written = {p.name for p in report.params if p.status in (ParamFate.WRITTEN, ParamFate.PARTIAL)}
    draft = build_draft(checkpoint.config, state, written, hot_token_id, engine=engine, dtype=target.dtype)
    # SGLang's EAGLE worker: set_embed (and set_embed_and_head without a draft vocabulary)
    for p in report.params:
        if p.replaced_by_target and p.role == "embed":
            draft.params[p.name] = target.embed
        elif p.replaced_by_target and p.role == "lm_head":
            draft.params[p.name] = target.w["lm_head.weight"]
    return LoadedDraft(draft, report, profile.captured_layers(checkpoint.config, target.n_layers), written)
