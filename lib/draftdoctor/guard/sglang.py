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
the real check.
"""

from __future__ import annotations

import importlib.metadata

from . import KEEP_INITIAL_BYTES, GuardVerdict, announce, enabled, judge, rank_label, refuse
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
    after_import("sglang.srt.model_loader.loader", _patch_loader)


def draft_classes() -> frozenset:
    """The EAGLE-3 draft classes of every SGLang row (SGLang's registry names a class by its name)."""
    from ..engines import all_profiles

    return frozenset(a for p in all_profiles() if p.engine == "sglang" for a in p.architectures)


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
        outer, _STATE["load"] = _STATE["load"], {"raw": None, "draft": str(getattr(model_config, "model_path", "?"))}
        try:
            model = load_model(self, *args, **kwargs)
            load = _STATE["load"]
        finally:
            _STATE["load"] = outer
        if type(model).__name__ in draft_classes():
            _judge(load)
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
    verdict = judge(load["raw"], load["draft"], engine, rank_label(DISTRIBUTED))
    if verdict.refused:
        refuse(verdict, LIVE)
    announce(verdict)
