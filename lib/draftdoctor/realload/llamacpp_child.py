"""Child process: llama.cpp's own converter and loader on EAGLE-3 draft checkpoints, reported in the
real-loader format (draftdoctor.realload).

For each draft: `convert_hf_to_gguf.py DRAFT --target-model-dir TARGET` runs in this process, imported
from the llama.cpp that `make llamacpp` built (the pinned llama-cpp-python sdist's vendor/llama.cpp),
with two records kept: which checkpoint key became which GGUF tensor (its EAGLE-3 renaming and its
`modify_tensors`), and where it stopped ("Can not map tensor"); then `llama-server -m DRAFT.gguf` loads
the file with llama.cpp's own model loader, whose refusals ("tensor ... not found", "wrong number of
tensors") are the load's. The converter needs a target folder (config and vocabulary): the caller's
target config when given, else a stand-in sized from the draft, with a SentencePiece vocabulary of
placeholder words. Run by `draftdoctor.realload` with the kit's own lib on PYTHONPATH.
"""

import argparse
import importlib.metadata
import json
import logging
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from ..toolstate import BUILD, trusted
from . import nocode
from .common import EXIT_ENVIRONMENT, add_child_arguments, batch, die_with_parent, error, exit_now, report_stream, run

LLAMACPP = BUILD / "llamacpp"
VENDOR = LLAMACPP / "src" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
SERVER = LLAMACPP / "build" / "bin" / "llama-server"
OPTIONAL = ("token_embd.weight", "output.weight", "d2t")  # eagle3.cpp: from the target, or no vocabulary map
ENC_OUTPUT_NORM = "enc.output_norm.weight"  # input_norm (norm_before_fc), created only with the GGUF's flag
LOADER = "llama.cpp src/llama-model-loader.cpp"
LOAD_ERROR = re.compile(r"error loading model: (.*)")
LOADER_RAN = "load_model: loading model"  # llama-server's words as it hands the file to its loader (past binding)
MODEL_LOADED = "llama_server: model loaded"  # its words once the loader and the context are done, before serving


def set_up():
    """Import the converter from the vendored llama.cpp (it puts its own gguf-py first on sys.path)."""
    trusted(LLAMACPP, "llama.cpp's build")
    if not (VENDOR / "convert_hf_to_gguf.py").exists() or not SERVER.exists():
        raise RuntimeError(f"llama.cpp is not built under {LLAMACPP}: run `make llamacpp`")
    sys.path.insert(0, str(VENDOR))
    import convert_hf_to_gguf  # noqa: F401
    from conversion.llama import LlamaModel  # noqa: F401


def stand_in_target(folder: Path, draft_config: dict, target_config: dict | None) -> Path:
    """A target folder the converter reads: the given config (else one sized from the draft) and a WORD
    SentencePiece vocabulary of placeholder words of the target's size (the draft GGUF copies it)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    layer = draft_config.get("transformer_layer_config") or draft_config
    config = target_config or {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": draft_config.get("target_hidden_size") or layer.get("hidden_size", 64),
        "num_hidden_layers": 32, "num_attention_heads": layer.get("num_attention_heads", 4),
        "num_key_value_heads": layer.get("num_key_value_heads", 4), "intermediate_size": layer.get("intermediate_size", 128),
        "vocab_size": layer.get("vocab_size") or draft_config.get("vocab_size", 256), "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    model = pb.ModelProto()
    for i in range(int(config["vocab_size"])):
        piece = model.pieces.add()
        piece.piece, piece.score = ("<unk>", "<s>", "</s>")[i] if i < 3 else f"w{i}", -float(i)
        piece.type = (pb.ModelProto.SentencePiece.UNKNOWN if i == 0 else pb.ModelProto.SentencePiece.CONTROL if i < 3
                      else pb.ModelProto.SentencePiece.NORMAL)
    spec = model.trainer_spec
    spec.model_type, spec.vocab_size, spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = (
        pb.TrainerSpec.WORD, int(config["vocab_size"]), 0, 1, 2, -1)
    (folder / "tokenizer.model").write_bytes(model.SerializeToString(deterministic=True))
    return folder


class Recorder:
    """Which checkpoint key the converter turned into which GGUF tensors: its EAGLE-3 renaming
    (LlamaModel.index_tensors keeps the base index's order) and each `modify_tensors` call."""

    def __init__(self):
        from conversion.base import ModelBase
        from conversion.llama import LlamaModel

        self.original_names, self.renamed_names = [], []
        self.outputs: dict[str, list[str]] = {}
        self.shapes: dict[str, list[int]] = {}
        self.current = None
        self.model = None  # the converter's model instance, once it chose a class
        self._saved = [(ModelBase, "index_tensors", ModelBase.index_tensors),
                       (LlamaModel, "index_tensors", LlamaModel.index_tensors),
                       (LlamaModel, "modify_tensors", LlamaModel.modify_tensors)]
        recorder = self
        base_index, llama_index, modify = (saved for _, _, saved in self._saved)

        def base(model, *a, **k):
            recorder.model = model
            tensors = base_index(model, *a, **k)
            recorder.original_names = list(tensors)
            return tensors

        def llama(model, *a, **k):
            tensors = llama_index(model, *a, **k)
            recorder.renamed_names = list(tensors)
            return tensors

        def modified(model, data, name, bid):
            recorder.current = name
            recorder.shapes[name] = list(data.shape)
            produced = recorder.outputs.setdefault(name, [])
            for new_name, tensor in modify(model, data, name, bid):
                produced.append(new_name)
                yield new_name, tensor
            if name == "d2t" and getattr(model, "_eagle3_int_tensors", None):
                produced.append("d2t")  # written later as int64 (prepare_tensors)

        ModelBase.index_tensors, LlamaModel.index_tensors, LlamaModel.modify_tensors = base, llama, modified

    def restore(self):
        for owner, name, saved in self._saved:
            setattr(owner, name, saved)

    def eagle3_path(self) -> bool:
        """Whether the converter chose a class with an EAGLE-3 path (only LlamaModel detects drafts)."""
        from conversion.llama import LlamaModel

        return isinstance(self.model, LlamaModel)

    def key_of(self, name: str) -> str:
        renamed = dict(zip(self.renamed_names, self.original_names)) if len(self.renamed_names) == len(self.original_names) else {}
        return renamed.get(name, name)


class LastError(logging.Handler):
    """The converter's last ERROR log line: what it says before `sys.exit(1)`."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.message = None

    def emit(self, record):
        self.message = record.getMessage()


def convert(draft: Path, target: Path, out: Path) -> tuple[Recorder, dict | None]:
    """Run the converter on `draft`; (its record, the error it stopped with or None). A refusal before
    it chose a class, or from a class with no EAGLE-3 path, is the config's (stage "config")."""
    import convert_hf_to_gguf

    recorder, last_error = Recorder(), LastError()
    logging.getLogger().addHandler(last_error)
    argv, sys.argv = sys.argv, ["convert_hf_to_gguf.py", str(draft), "--target-model-dir", str(target),
                                "--outtype", "f32", "--outfile", str(out)]
    try:
        convert_hf_to_gguf.main()
        return recorder, None
    except (Exception, SystemExit) as exc:  # the converter's refusal is the finding
        if isinstance(exc, SystemExit):
            if not exc.code:
                return recorder, None
            exc = RuntimeError(last_error.message or f"convert_hf_to_gguf.py exited with {exc.code}")
        failure = error("load", exc, recorder.key_of(recorder.current) if recorder.current else None)
        if recorder.model is None or not recorder.eagle3_path():
            chosen = f" converts it as {type(recorder.model).__name__}, which has no EAGLE-3 path" if recorder.model else ""
            failure.update(stage="config", key=None, message=f"convert_hf_to_gguf.py{chosen}: {failure['message']}")
        return recorder, failure
    finally:
        sys.argv = argv
        logging.getLogger().removeHandler(last_error)
        recorder.restore()


def load(gguf: Path, timeout: float = 120.0) -> dict | None:
    """llama.cpp's model loader on the draft's GGUF (llama-server -m): its refusal, or None. Only the
    model load is asked: the server starts without its warm-up decode (a draft alone, with no target,
    crashes there with SIGSEGV, often before its logging thread has written what the loader said) and
    is stopped once it says the model is loaded. It listens on a Unix socket beside the GGUF (no TCP
    port another process could take first, which would stop it before its loader ran), and only a
    loader that ran counts as an answer."""
    # a Unix socket path has at most 107 bytes: beside the GGUF (the batch's scratch), else a private folder in /tmp
    near = len(str(gguf.parent)) <= 80  # + "/s-XXXXXXXX/load.sock"
    with tempfile.TemporaryDirectory(prefix="s-" if near else "draftdoctor-sock-", dir=gguf.parent if near else "/tmp") as folder:
        said, status = _until_loaded([str(SERVER), "-m", str(gguf), "--host", str(Path(folder) / "load.sock"),
                                      "-t", "1", "-c", "64", "--no-webui", "--no-warmup"], timeout)
    found = LOAD_ERROR.search(said)
    if found:
        return {"stage": "load", "type": "llama_model_load", "message": found.group(1).strip(), "key": None,
                "origin": LOADER, "traceback": ""}
    if LOADER_RAN not in said:
        raise RuntimeError(f"llama-server stopped before its model loader read {gguf.name} (exit status "
                           f"{status}): {said.strip().splitlines()[-1:] or ''}")
    return None


def _until_loaded(argv: list[str], timeout: float) -> tuple[str, int | None]:
    """Run llama-server until it says MODEL_LOADED (then kill it: nothing more is asked of it) or exits;
    (what it said, its exit status, None when it was stopped). subprocess.TimeoutExpired past `timeout`."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
    said, deadline = b"", time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while MODEL_LOADED.encode() not in said:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(argv, timeout, output=said)
                if not selector.select(left):
                    continue
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    break  # it exited: everything it said has been read
                said += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
    loaded = MODEL_LOADED.encode() in said
    return said.decode(errors="replace"), None if loaded else proc.returncode


def check(draft: Path, target_config: dict | None, scratch: Path) -> dict:
    from gguf import GGUFReader

    timings, started = {}, time.perf_counter()
    draft_config = json.loads((draft / "config.json").read_text()) if (draft / "config.json").is_file() else {}
    target = stand_in_target(scratch / f"target-{draft.name}", draft_config, target_config)
    out = scratch / f"{draft.name}.gguf"
    recorder, failure = convert(draft, target, out)
    timings["convert"] = round(time.perf_counter() - started, 3)
    tensors, shapes, metadata = [], {}, {}
    if failure is None and not getattr(recorder.model, "is_eagle3", False):
        # converted as a model of its own (a target passed as the draft): llama-server would load and serve
        # it, not refuse it, so its load is not asked (it had run until the check's time-out)
        failure = {"stage": "build", "type": "NotAnEagle3Draft", "key": None, "origin": "convert_hf_to_gguf.py",
                   "traceback": "", "message": f"convert_hf_to_gguf.py converted it as a plain "
                   f"{type(recorder.model).__name__}, not an EAGLE-3 draft (it treats a config as a draft only with "
                   "draft_vocab_size and one decoder layer): llama-server would serve it as a model of its own"}
        return report(draft_config, failure, [], [], timings, metadata, [])
    if failure is None:
        reader = GGUFReader(str(out))
        tensors = [t.name for t in reader.tensors]
        shapes = {t.name: [int(d) for d in reversed(t.shape)] for t in reader.tensors}  # GGUF ne order
        field = reader.fields.get("eagle3.target_layers")
        metadata["eagle3.target_layers"] = [int(field.parts[i][0]) for i in field.data] if field else None
        field = reader.fields.get("eagle3.norm_before_fc")
        metadata["eagle3.norm_before_fc"] = bool(field.parts[field.data[0]][0]) if field else False
        started = time.perf_counter()
        failure = load(out)
        timings["load"] = round(time.perf_counter() - started, 3)
    if failure and (failure["stage"] == "config" or not getattr(recorder.model, "is_eagle3", False)):
        return report(draft_config, failure, [], [], timings, metadata, [])  # nothing was built as a draft
    keys, writes = [], {}
    for name, produced in recorder.outputs.items():  # the keys the converter reached, in its order
        key = recorder.key_of(name)
        if failure is None:
            for gguf_name in produced:
                writes.setdefault(gguf_name, []).append({"key": key, "shard": None, "ok": True})
        keys.append({"key": key, "shape": recorder.shapes.get(name, []), "dtype": None,
                     "consumed": bool(produced) and failure is None,
                     "consumed_as": "parameter" if produced and failure is None else None,
                     "parameters": produced if failure is None else [], "attributes": []})
    named = re.search(r"tensor '([^']+)'", failure["message"]) if failure else None
    if named and failure["origin"] == LOADER:  # the tensor the loader refused, and the key it came from
        failure["key"] = next((recorder.key_of(n) for n, out in recorder.outputs.items() if named.group(1) in out), None)
        if "wrong shape" in failure["message"] and failure["key"]:
            writes[named.group(1)] = [{"key": failure["key"], "shard": None, "ok": False}]
    missing = [named.group(1)] if named and "not found" in failure["message"] else []
    # eagle3.cpp creates enc.output_norm only when the GGUF says norm_before_fc: otherwise that tensor is one too many
    created = loader_tensors() - (set() if metadata.get("eagle3.norm_before_fc") else {ENC_OUTPUT_NORM})
    names = list(dict.fromkeys([*(t for t in tensors if t in created), *OPTIONAL, *missing]))
    # a failed load writes nothing: no file (the converter stopped), or a file the loader refused whole
    parameters = [{"name": n, "shape": shapes.get(n, []), "dtype": None, "numel": 0,
                   "status": "written" if n in tensors and failure is None else "untouched",
                   "elements_written": None, "writes": writes.get(n, []), "shards_expected": None,
                   "shards_written": None, "unattributed_write": False, "sha256": None} for n in names]
    # eagle3.cpp takes the target's embedding and head for a draft without its own
    from_target = [n for n in ("token_embd.weight", "output.weight") if n not in tensors] if failure is None else []
    return report(draft_config, failure, parameters, keys, timings, metadata, from_target,
                  complete=bool(tensors))


def loader_tensors() -> set[str]:
    """Every tensor llama.cpp's EAGLE-3 loader creates (src/models/eagle3.cpp's create_tensor calls,
    named by gguf-py's table), for block 0: a GGUF tensor outside it makes the load fail."""
    import gguf

    source = (VENDOR / "src" / "models" / "eagle3.cpp").read_text()
    names = set()
    for kind, suffix in re.findall(r'create_tensor\(tn\(LLM_TENSOR_(\w+)(?:,\s*"(\w+)")?', source):
        name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[kind]].format(bid=0)
        names.add(f"{name}.{suffix}" if suffix else name)
    return names


def report(draft_config, failure, parameters, keys, timings, metadata, from_target, complete=True) -> dict:
    """The load report's fields (draftdoctor.loadreport.LoadReport); `parameters_complete` is False when
    the converter stopped before writing a GGUF, so only the tensors it made so far are listed (the rest
    are the profile's to name)."""
    return {"config": {"architectures": draft_config.get("architectures"), "model_type": None, "dtype": "float32"},
            "model_class": "llama.cpp eagle3", "device": "cpu", "error": failure, "parameters": parameters,
            "keys": keys, "all_keys_seen": failure is None, "parameters_complete": complete, "timings": timings,
            "gguf": metadata, "from_target": from_target}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m draftdoctor.realload.llamacpp_child", description=__doc__.split("\n")[0])
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    nocode.install(trust=[VENDOR])  # no code from a checkpoint or target folder runs here
    out = report_stream()  # the converter logs and prints
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()
    try:
        set_up()
    except Exception:
        print(f"draftdoctor: the llama.cpp {args.release} environment failed to set up:\n{traceback.format_exc()}",
              file=sys.stderr)
        return EXIT_ENVIRONMENT
    versions = {"llama-cpp-python": args.release, "sentencepiece": importlib.metadata.version("sentencepiece")}
    setup_s = round(time.perf_counter() - started, 3)

    def checks(paths, device, target_config):
        target = json.loads(Path(target_config).read_text()) if target_config else None
        header = {"engine_name": "llamacpp", "release": args.release, "versions": versions}
        return batch(paths, header, setup_s, lambda checkpoint, scratch: check(checkpoint, target, scratch))

    return run(args, out, checks)


if __name__ == "__main__":
    exit_now(main())
