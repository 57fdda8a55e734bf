"""Child process: run one SGLang release's own config reader, model registry, model class and
`load_weights` on a draft checkpoint, and print what happened as one JSON document on stdout.

Run by `draftdoctor.realload.run_real_loader` as
`PYTHONPATH=build/sglang/<release> python -m draftdoctor.realload.child --release R CHECKPOINT...`
(several checkpoints share one process set-up; with none, it only checks the release's adapter).
The path through SGLang is the one its scheduler takes for a draft: `ModelConfig.from_server_args(...,
is_draft_model=True)`, then `get_model` (registry lookup by `architectures`, build under the model's
dtype, production safetensors iterator, the class's `load_weights`). The only interventions are the
import stubs, the adapter's CPU flags, and the recorder wrapped around `load_weights_and_postprocess`.
Prints a JSON array with one load report per checkpoint (draftdoctor.loadreport). Exit status: 0 with the reports (also when SGLang
raised: that is a finding), 3 when the release's environment or adapter is broken (message on
stderr), 2 on bad arguments.
"""

import argparse
import inspect
import json
import logging
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import nocode, stubs
from .adapters import AdapterMismatch, get as get_adapter
from .common import (EXIT_ENVIRONMENT, Captured, Stages, add_child_arguments, batch, device_for, emit, error, exit_now,
                     process_group_init, fused_shards, report_stream, run)
from .recorder import LoadRecorder


# ServerArgs reads its `model_path` as the *target* model. The draft must only be read the way the
# draft worker reads it, so the target is a minimal Llama config of our own.
_TARGET_STAND_IN = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 256,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "float16",
}


def set_up(adapter, scratch):
    """Stubs, adapter check, server args, a world-size-1 gloo group. Returns the ServerArgs.
    `scratch`: a folder that outlives the checks (holds the stand-in target's config)."""
    adapter.apply_torch_compat()
    stubs.freeze_availability_checks()
    if adapter.real_auto_image_processor:
        stubs.real_auto_image_processor()
    stubs.install(strict=adapter.stubbed, aliases=adapter.aliases)
    adapter.verify()
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.models import registry  # noqa: F401  (imports every model module now, not mid-check)
    from sglang.srt.server_args import ServerArgs

    (Path(scratch) / "config.json").write_text(json.dumps(_TARGET_STAND_IN))
    server_args = ServerArgs(model_path=str(scratch), device="cpu", **adapter.server_args_extra)
    adapter.publish_server_args(server_args)
    init_distributed_environment(backend="gloo", world_size=1, rank=0, local_rank=0,
                                 distributed_init_method=process_group_init())
    initialize_model_parallel()
    adapter.apply_cpu_flags()
    return server_args


def _fused_shards(module):
    from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    return fused_shards(module, QKVParallelLinear, MergedColumnParallelLinear)


def check(adapter, server_args, checkpoint, device):
    """Read, build and load `checkpoint` through SGLang; return the load report's fields it found
    (draftdoctor.loadreport.LoadReport; SGLang does not say what it takes from the target)."""
    import torch
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader import get_model
    from sglang.srt.model_loader.loader import DefaultModelLoader

    report = {"device": device, "timings": {}}
    captured = Captured()
    logging.getLogger().addHandler(captured)
    stages = Stages(report["timings"], captured)
    enter = stages.enter
    state = {"recorder": None}

    hook = adapter.load_hook
    original = inspect.getattr_static(DefaultModelLoader, hook)  # the staticmethod object itself, if it is one
    owned = hook in DefaultModelLoader.__dict__

    def instrument(model, weights):
        """The model is built and about to load `weights`: record from here on."""
        enter("load")
        report["model_class"] = f"{type(model).__module__}.{type(model).__qualname__}"
        recorder = state["recorder"] = LoadRecorder(model, _fused_shards)
        recorder.prepare()
        load_weights = model.load_weights

        def load_then_mark(weights):
            load_weights(weights)
            enter("postprocess")

        model.load_weights = load_then_mark
        return recorder.track(weights)

    if hook == "load_weights_and_postprocess":
        def recorded_load(model, weights, target_device):
            try:
                return original.__func__(model, instrument(model, weights), target_device)
            finally:
                del model.load_weights

        replacement = staticmethod(recorded_load)
    else:  # "_get_all_weights": load_model asks for the iterator, then calls model.load_weights itself
        def recorded_weights(self, model_config, model):
            return instrument(model, original(self, model_config, model))

        replacement = recorded_weights

    try:
        model_config = adapter.model_config(server_args, str(checkpoint))
        hf = model_config.hf_config
        report["config"] = {"architectures": list(getattr(hf, "architectures", None) or []),
                            "model_type": getattr(hf, "model_type", None),
                            "dtype": str(model_config.dtype).removeprefix("torch.")}
        enter("build")
        setattr(DefaultModelLoader, hook, replacement)
        device_config = DeviceConfig("cpu")
        if device == "meta":
            # DeviceConfig accepts only real devices; load_model builds under `torch.device(device_config.device)`.
            device_config.device = torch.device("meta")
        get_model(model_config=model_config, load_config=LoadConfig(load_format=server_args.load_format),
                  device_config=device_config)
        report["postprocess"] = "done"
        enter("done")
    except Exception as exc:  # SGLang's failure is the finding: keep its type and message
        if stages.current == "postprocess" and device == "meta":
            # Post-load processing needs real tensors; on meta only its refusal is known.
            report["postprocess"] = f"skipped on meta: {type(exc).__name__}: {exc}"
        else:
            key = state["recorder"].abort() if stages.current == "load" else None
            report["error"] = error(stages.current, exc, key)
        enter("done")
    finally:
        if owned:
            setattr(DefaultModelLoader, hook, original)
        else:
            delattr(DefaultModelLoader, hook)
        logging.getLogger().removeHandler(captured)
        if state["recorder"] is not None:
            state["recorder"].restore()
    if state["recorder"] is not None:
        report.update(state["recorder"].report())
    report["logs"] = captured.records
    return report


def load_only(adapter, server_args, checkpoint):
    """Read, build and load `checkpoint` the way SGLang's draft worker does, with nothing of the kit's
    around it: what the guard's hook sees in a server (`--load-only`, tests/test_guard.py)."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader import get_model

    model_config = adapter.model_config(server_args, str(checkpoint))
    return get_model(model_config=model_config, load_config=LoadConfig(load_format=server_args.load_format),
                     device_config=DeviceConfig("cpu"))


def _versions():
    import importlib.metadata

    return {name: importlib.metadata.version(name) for name in ("sglang", "torch", "transformers")}


def run_checks(adapter, server_args, release, paths, device, setup_s):
    """One LoadReport per checkpoint folder."""
    header = {"engine_name": "sglang", "release": release, "versions": _versions()}
    return batch(paths, header, setup_s,
                 lambda checkpoint, _scratch: check(adapter, server_args, checkpoint, device_for(checkpoint, device)))


def parse_launch(argv: list[str]) -> dict:
    """SGLang's own verdict on a `sglang.launch_server` argument list: the release's
    `prepare_server_args` (its argument parser, then `ServerArgs`' own checks and adjustments), then
    `resolve_once` where the release has it and `check_server_args`, in the order its launch runs them. This machine has no accelerator, so a list
    without `--device` is validated with `--device cpu` added (said in `device`): checks that need a
    GPU (its memory, CUDA graphs) do not run here. {"accepted", "stage" (parser | validation),
    "message" (SGLang's own words when refused), "device", "notes" (what SGLang logged while checking)}."""
    import contextlib
    import io

    from sglang.srt import server_args as module

    validated = list(argv) if "--device" in argv else [*argv, "--device", "cpu"]
    notes = Captured()
    logging.getLogger().addHandler(notes)
    said = io.StringIO()
    verdict = {"accepted": True, "stage": None, "message": None,
               "device": "as given" if "--device" in argv else "cpu (added here: no accelerator)"}
    try:
        with contextlib.redirect_stderr(said):
            try:
                server_args = module.prepare_server_args(validated)
            except SystemExit as exc:  # argparse: usage, then "prog: error: ..." on stderr
                errors = [line for line in said.getvalue().splitlines() if ": error: " in line]
                verdict.update(accepted=False, stage="parser",
                               message=errors[-1].split(": error: ", 1)[1] if errors else f"the parser exited ({exc.code})")
                return verdict
        if hasattr(server_args, "resolve_once"):  # from 0.5.2x the launch resolves defaults before its checks
            server_args.resolve_once()
        if hasattr(server_args, "check_server_args"):
            server_args.check_server_args()
    except Exception as exc:  # noqa: BLE001 - whatever SGLang raises while checking is its refusal
        verdict.update(accepted=False, stage="validation", message=f"{type(exc).__name__}: {exc}")
    finally:
        logging.getLogger().removeHandler(notes)
        verdict["notes"] = [r["message"] for r in notes.records if r["level"] in ("WARNING", "ERROR")][:20]
    return verdict


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m draftdoctor.realload.child", description=__doc__.split("\n")[0])
    add_child_arguments(parser)
    parser.add_argument("--parse-launch", metavar="JSON",
                        help="instead of checkpoints: SGLang's verdict on each of these sglang.launch_server argument "
                             "lists (a JSON list of lists)")
    parser.add_argument("--load-only", action="store_true",
                        help="only build and load each checkpoint as SGLang's draft worker does, with no recorder "
                             "(what the guard's hook sees in a server); exit 0 when every load returned")
    args = parser.parse_args(argv)
    nocode.install()  # no code from a checkpoint or target folder runs here

    out = report_stream()  # SGLang and its dependencies print to stdout
    with tempfile.TemporaryDirectory(prefix="draftdoctor-realload-") as scratch:
        started = time.perf_counter()
        try:
            adapter = get_adapter(args.release)
            server_args = set_up(adapter, scratch)
        except AdapterMismatch as exc:
            print(f"draftdoctor: {exc}", file=sys.stderr)
            return EXIT_ENVIRONMENT
        except Exception:
            print(f"draftdoctor: the sglang {args.release} environment failed to set up:\n{traceback.format_exc()}",
                  file=sys.stderr)
            return EXIT_ENVIRONMENT
        setup_s = round(time.perf_counter() - started, 3)
        if args.load_only:
            for checkpoint in args.checkpoints:
                try:
                    # a folder by its real path, as SGLang's launcher resolves it; anything else (a hub id) as given
                    load_only(adapter, server_args, Path(checkpoint).resolve() if Path(checkpoint).exists()
                              else checkpoint)
                except SystemExit as exc:  # a hook ended the load (the guard's refusal): its status, cleaned up
                    return exc.code
                except Exception:  # SGLang's own refusal of the draft, as a server would log it
                    traceback.print_exc()
                    return 1
                print(f"draftdoctor: sglang {args.release} loaded {checkpoint}", file=sys.stderr)
            return 0
        if args.parse_launch is not None:
            return emit(out, [parse_launch(argv) for argv in json.loads(args.parse_launch)])
        return run(args, out, lambda paths, device, _target: run_checks(adapter, server_args, args.release, paths,
                                                                          device, setup_s))


if __name__ == "__main__":
    exit_now(main())
