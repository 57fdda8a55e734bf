"""The guard in SGLang, which has no plugin entry point: installed in every Python process the server
starts by the start-up hook `python -m draftdoctor.guard -- <command>` puts on their path (SGLang
builds and loads the draft in a scheduler subprocess, one per tensor-parallel rank; docs/guard.md).

It waits for SGLang's own import of its model loader and wraps two methods of `DefaultModelLoader`,
the loader of the default load formats, which every release's model runner calls for the draft:
- `load_model`: builds the model, loads it, returns it; the guard judges the load when it returns;
- `load_weights_and_postprocess` (a staticmethod, SGLang 0.4.6 and later): for an EAGLE-3 draft class
  (the classes the kit's SGLang rows name), the real check's recorder around the class's `load_weights`.
Each rank judges its own shard: a parameter is written when every rank's shard is, and any rank
that finds its shard unwritten ends the server (status 1) before it is ready. The parameters SGLang's
EAGLE worker takes from the target after loading (the embedding) are settled by the kit's rows, as in
the real check. The draft is judged as read from the folder whose files the loader opened (a hub id's
snapshot). A draft of another class (SGLang's NextN/MTP heads, EAGLE-1) is loaded untouched and gets
one line saying it was not judged, where SGLang's model config says which model is the draft.
"""

from __future__ import annotations

import functools
import importlib.metadata

from . import (KEEP_INITIAL_BYTES, PRESENT, GuardVerdict, announce, enabled, engine_config, judge, not_judged,
               opened_folders, rank_label, refuse, report, rows_of)
from .hooks import after_import

LIVE = ("run: SGLang's own model loader in the process that loads the draft, on the real draft and "
        "server arguments; the kit has proven this hook on CPU through SGLang's build-and-load path only, "
        "never in a serving GPU server")
_STATE = {"installed": False, "load": None}
DISTRIBUTED = "sglang.srt.distributed"  # its tensor-parallel group


def install():
    """Wrap SGLang's loader once it is imported (in this process); safe to call more than once."""
    if not enabled() or _STATE["installed"]:
        return
    _STATE["installed"] = True
    report(PRESENT, by="start-up hook")
    after_import("sglang.srt.configs.model_config", _mark_drafts)
    after_import("sglang.srt.model_loader.loader", _patch_loader)


def _mark_drafts(module):
    """Up to 0.5.2 SGLang's ModelConfig takes `is_draft_model` but does not keep it: keep it for the guard
    (`_draftdoctor_draft`), so that a draft of a class it does not judge is said to be one there too."""
    import inspect

    config_class = module.ModelConfig
    init = config_class.__init__
    try:
        signature = inspect.signature(init)
    except (TypeError, ValueError):
        return
    if "is_draft_model" not in signature.parameters:
        return

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            self._draftdoctor_draft = bool(signature.bind(self, *args, **kwargs).arguments.get("is_draft_model"))
        except TypeError:
            pass

    config_class.__init__ = functools.wraps(init)(__init__)


def is_draft(model_config) -> bool:
    """Whether SGLang built this model config for the draft (its own word where it keeps it)."""
    return bool(getattr(model_config, "is_draft_model", getattr(model_config, "_draftdoctor_draft", False)))


@functools.cache
def draft_classes() -> frozenset:
    """The EAGLE-3 draft classes the kit's rows model for this SGLang release (SGLang's registry names a
    class by its name); others (NextN heads, EAGLE-1) are not judged."""
    return frozenset(a for p in rows_of("sglang", release()) for a in p.config.architectures)


def _fused_shards(module):
    from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    from ..realload.common import fused_shards

    return fused_shards(module, QKVParallelLinear, MergedColumnParallelLinear)


def _patch_loader(module):
    loader_class = module.DefaultModelLoader
    load_model = loader_class.load_model
    if "load_weights_and_postprocess" not in vars(loader_class):
        _STATE["unsupported"] = (f"SGLang {release()} has no DefaultModelLoader.load_weights_and_postprocess "
                                 "(it came with 0.4.6): the guard cannot see its loads")
    else:
        original = vars(loader_class)["load_weights_and_postprocess"].__func__
        drafts = draft_classes()

        def load_weights_and_postprocess(model, weights, target_device, *args, **kwargs):
            if type(model).__name__ not in drafts or _STATE["load"] is None:
                return original(model, weights, target_device, *args, **kwargs)
            from ..realload.recorder import LoadRecorder

            recorder = LoadRecorder(model, _fused_shards, digests=False)
            recorder.prepare(KEEP_INITIAL_BYTES)
            try:
                result = recorder.around_load_weights(lambda: original(model, weights, target_device, *args, **kwargs))
                _STATE["load"]["raw"] = recorder.report()
                recorder.restore_unwritten()
            finally:
                recorder.restore()
            return result

        loader_class.load_weights_and_postprocess = staticmethod(load_weights_and_postprocess)

    def guarded_load_model(self, *args, **kwargs):
        model_config = kwargs.get("model_config", args[0] if args else None)
        opened = []
        outer, _STATE["load"] = _STATE["load"], {"raw": None, "draft": str(getattr(model_config, "model_path", "?")),
                                                 "opened": opened}
        undo = opened_folders(self, opened)
        try:
            model = load_model(self, *args, **kwargs)
            load = _STATE["load"]
        finally:
            _STATE["load"] = outer
            undo()
        if type(model).__name__ in draft_classes():
            load["config"] = engine_config(model_config)
            _judge(load)
        elif is_draft(model_config):  # a draft of a class the kit does not model: said
            not_judged(f"sglang=={release()}", load["draft"], type(model).__name__, draft_classes(),
                       rank_label(DISTRIBUTED))
        return model

    loader_class.load_model = guarded_load_model


def release() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _judge(load):
    engine = f"sglang=={release()}"
    if load["raw"] is None:
        why = _STATE.get("unsupported") or "the draft was loaded without DefaultModelLoader.load_weights_and_postprocess"
        refuse(GuardVerdict(engine, load["draft"], 0, 0, True, [why], rank=rank_label(DISTRIBUTED)), LIVE)
    verdict = judge(load["raw"], load["draft"], engine, rank_label(DISTRIBUTED), load["opened"], load["config"])
    if verdict.refused:
        refuse(verdict, LIVE)
    announce(verdict)
