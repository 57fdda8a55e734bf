"""How fast `draftdoctor inspect` lists a Kimi-K2-class sharded checkpoint, against a bare header loop.

Generates (once, in build/bench/kimi-k2-sparse) Kimi-K2's layout: 61 MLA layers (the first dense),
384 experts, FP8 weights each with its block scale (`weight_scale_inv`), 139,583 tensors in 64 sparse
shards whose data are holes (1 TB claimed, 30 MB of headers on disk), then times, in rounds whose
order rotates (the machine's drift falls on every column alike):
  - baseline: a bare loop that opens each shard and reads its 8-byte length and JSON header with
              the standard `json` module, in this process;
  - baseline (whole process): the same loop as a script run by the same interpreter as a subprocess,
              start-up included, as the command's is: the like-for-like baseline for the command;
  - parsing:  the JSON every reading must parse, and nothing more: each header and the index with
              orjson, the parser the kit uses (the index is 13 MB here: the bare loop never reads it);
  - library:  draftdoctor's open_checkpoint (all validation) + the tensor table, in this process;
  - cli:      the whole `draftdoctor inspect` command, each output format, as a subprocess (start-up,
              output and exit included; the package's bytecode compiled first, as `pip install` does).
Prints each one's median and range and its ratio to the baseline's median; the target is 1.5x for
the command in every format. The command's ratios are printed against both baselines: the in-process
loop pays no interpreter start-up, the command does. With --stages, then where the command's time goes:
each step's CPU time in this process (medians, the bare loop timed in the same rounds), and the start-up's
as whole processes. Usage: .venv/bin/python benchmarks/inspect_speed.py [--rounds N] [--stages]
"""

import argparse
import compileall
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import orjson

from draftdoctor import checkpoint, headers
from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.cli import inspect as inspect_command
from draftdoctor.layouts import detect_layout
from draftdoctor.provenance import recognise
from draftdoctor.synthwrite import write_shards
from draftdoctor.tables import tensor_columns

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FOLDER = ROOT / "build" / "bench" / "kimi-k2-sparse"
LAYERS, EXPERTS, SHARDS = 61, 384, 64
HIDDEN, MOE_INTERMEDIATE, DENSE_INTERMEDIATE, VOCAB = 7168, 2048, 18432, 163840
Q_LORA, KV_LORA, ROPE, NOPE, V_HEAD, HEADS = 1536, 512, 64, 128, 128, 64
TARGET = 1.5


def kimi_tensors():
    """Kimi-K2's tensors as its checkpoint names them (DeepSeek-V3's layout): MLA attention, a dense
    first layer, then 384 routed experts and a shared one per layer, FP8 block-quantised (128x128)."""
    tensors = {"model.embed_tokens.weight": ("BF16", (VOCAB, HIDDEN))}

    def fp8(name, rows, cols):
        tensors[name + ".weight"] = ("F8_E4M3", (rows, cols))
        tensors[name + ".weight_scale_inv"] = ("F32", (-(-rows // 128), -(-cols // 128)))

    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = ("BF16", (HIDDEN,))
        tensors[p + "post_attention_layernorm.weight"] = ("BF16", (HIDDEN,))
        fp8(p + "self_attn.q_a_proj", Q_LORA, HIDDEN)
        tensors[p + "self_attn.q_a_layernorm.weight"] = ("BF16", (Q_LORA,))
        fp8(p + "self_attn.q_b_proj", HEADS * (NOPE + ROPE), Q_LORA)
        fp8(p + "self_attn.kv_a_proj_with_mqa", KV_LORA + ROPE, HIDDEN)
        tensors[p + "self_attn.kv_a_layernorm.weight"] = ("BF16", (KV_LORA,))
        fp8(p + "self_attn.kv_b_proj", HEADS * (NOPE + V_HEAD), KV_LORA)
        fp8(p + "self_attn.o_proj", HIDDEN, HEADS * V_HEAD)
        if i == 0:
            mlps = [(p + "mlp.", DENSE_INTERMEDIATE)]
        else:
            tensors[p + "mlp.gate.weight"] = ("BF16", (EXPERTS, HIDDEN))
            tensors[p + "mlp.gate.e_score_correction_bias"] = ("F32", (EXPERTS,))
            mlps = [(p + "mlp.shared_experts.", MOE_INTERMEDIATE)]
            mlps += [(f"{p}mlp.experts.{j}.", MOE_INTERMEDIATE) for j in range(EXPERTS)]
        for m, intermediate in mlps:
            fp8(m + "gate_proj", intermediate, HIDDEN)
            fp8(m + "up_proj", intermediate, HIDDEN)
            fp8(m + "down_proj", HIDDEN, intermediate)
    tensors["model.norm.weight"] = ("BF16", (HIDDEN,))
    tensors["lm_head.weight"] = ("BF16", (VOCAB, HIDDEN))
    return tensors


def build():
    if (FOLDER / "model.safetensors.index.json").exists():
        return
    FOLDER.mkdir(parents=True, exist_ok=True)
    write_shards(FOLDER, kimi_tensors(), SHARDS, fill="sparse")


def bare_loop():
    count = 0
    for path in sorted(FOLDER.glob("*.safetensors")):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            count += len(json.loads(f.read(n))) - 1
    return count


BARE_SCRIPT = """import json, struct, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        json.loads(f.read(n))
"""


def parse_only(index: bool = True):
    for path in sorted(FOLDER.glob("*.safetensors")):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            orjson.loads(f.read(n))
    if index:
        orjson.loads((FOLDER / "model.safetensors.index.json").read_bytes())


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def stages(rounds: int) -> None:
    """Each step of `inspect` timed on its own in this process (CPU time, medians of `rounds`, the bare loop
    timed in the same rounds), then the start-up of a whole process: the interpreter alone, and with the
    command's imports (its parser built), each against the bare loop run as a process."""
    times: dict[str, list[float]] = {}

    def cpu(name, fn):
        start = time.process_time()
        value = fn()
        times.setdefault(name, []).append(time.process_time() - start)
        return value

    with open(os.devnull, "w") as out:
        for _ in range(rounds):
            cpu("bare header loop (json)", bare_loop)
            with headers.gc_paused():
                cpu("parsing the headers alone (orjson)", lambda: parse_only(index=False))
                files = cpu("index: read, parsed, checked; its files", lambda: checkpoint._resolve_files(FOLDER))[0]
                cpu("headers: read, parsed, checked as columns", lambda: [headers.read_header(f) for f in files.values()])
                ckpt = cpu("open_checkpoint (all of it)", lambda: open_checkpoint(FOLDER))
                cpu("tensor table (modules, grouped)", lambda: tensor_columns(ckpt))
                keys = ckpt.keys()
                cpu("layout", lambda: detect_layout(keys, ckpt.config))
                cpu("provenance", lambda: recognise(keys, ckpt.config, all(s.metadata is None for s in ckpt.shards)))
                del ckpt, keys
                for fmt in ("text", "json", "csv"):
                    cpu(f"the command's run ({fmt})", lambda: inspect_command.run(
                        argparse.Namespace(path=str(FOLDER), format=fmt), out))
    median = {name: statistics.median(values) for name, values in times.items()}
    base = median["bare header loop (json)"]
    median["index against the headers, config.json"] = (median["open_checkpoint (all of it)"]
                                                         - median["index: read, parsed, checked; its files"]
                                                         - median["headers: read, parsed, checked as columns"])
    before_output = sum(median[k] for k in ("open_checkpoint (all of it)", "tensor table (modules, grouped)",
                                            "layout", "provenance"))
    for fmt in ("text", "json", "csv"):
        median[f"output ({fmt}): rows made and written"] = median[f"the command's run ({fmt})"] - before_output
    print(f"\nwhere the time goes, in this process (CPU, medians of {rounds}):")
    for name, value in median.items():
        print(f"  {name:44} {value * 1000:7.1f} ms {value / base:6.2f}x")
    processes = {"interpreter alone": [sys.executable, "-c", "pass"],
                 "the command's imports": [sys.executable, "-c", "from draftdoctor import cli, toolstate; "
                                           "cli.build_parser('inspect')"],
                 "bare loop (process)": [sys.executable, "-c", BARE_SCRIPT, str(FOLDER)]}
    spent = {name: [] for name in processes}
    for _ in range(rounds):
        for name, command in processes.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            spent[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    base = statistics.median(spent["bare loop (process)"])
    print(f"start-up, as whole processes (CPU, medians of {rounds}):")
    for name, values in spent.items():
        print(f"  {name:44} {statistics.median(values) * 1000:7.1f} ms {statistics.median(values) / base:6.2f}x "
              "the bare loop's process")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--stages", action="store_true", help="then where the command's time goes, step by step")
    args = parser.parse_args()
    build()
    compileall.compile_dir(ROOT / "lib" / "draftdoctor", quiet=1)
    n = bare_loop()
    size = sum(json.loads((FOLDER / "model.safetensors.index.json").read_text())["metadata"].values())
    print(f"checkpoint: {SHARDS} shards, {n} tensors, {size / 1e12:.2f} TB claimed (sparse); "
          f"{args.rounds} rounds, the order rotating\n")

    def cli(fmt):
        command = [str(BIN / "draftdoctor"), "inspect", str(FOLDER), "--format", fmt]
        return lambda: subprocess.run(command, check=True, stdout=subprocess.DEVNULL)

    bare_process = [sys.executable, "-c", BARE_SCRIPT, str(FOLDER)]
    runs = {"bare header loop": bare_loop,
            "bare loop (process)": lambda: subprocess.run(bare_process, check=True, stdout=subprocess.DEVNULL),
            "parsing (orjson)": parse_only,
            "inspect (library)": lambda: tensor_columns(open_checkpoint(FOLDER)),
            **{f"inspect (CLI, {fmt})": cli(fmt) for fmt in ("text", "csv", "json")}}
    names = list(runs)
    for fn in runs.values():  # once each, not counted: files and bytecode in the cache
        fn()
    times = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(runs[name]))
    base = statistics.median(times["bare header loop"])
    print(f"{'':22} {'median':>8} {'min..max':>15} {'x bare loop':>12}")
    for name in names:
        median = statistics.median(times[name])
        print(f"{name:22} {median:6.3f} s {min(times[name]):6.3f}..{max(times[name]):.3f} s {median / base:9.2f}x")
    process = statistics.median(times["bare loop (process)"])
    for fmt in ("text", "json"):  # the target; csv is printed for comparison
        command = times[f"inspect (CLI, {fmt})"]
        ratio = statistics.median(command) / base
        print(f"\ninspect (CLI, {fmt}) / bare header loop: {ratio:.2f}x (target <= {TARGET}x: "
              f"{'met' if ratio <= TARGET else 'MISSED'})")
        pairs = sorted(map(lambda a, b: a / b, command, times["bare loop (process)"]))
        print(f"inspect (CLI, {fmt}) / bare loop (process): {statistics.median(command) / process:.2f}x; "
              f"round by round {pairs[0]:.2f}x..{pairs[-1]:.2f}x, median {statistics.median(pairs):.2f}x "
              f"(target <= {TARGET}x: {'met' if statistics.median(pairs) <= TARGET else 'MISSED'})")
    if args.stages:
        stages(args.rounds)


if __name__ == "__main__":
    main()
