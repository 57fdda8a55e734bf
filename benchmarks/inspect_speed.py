"""How fast `draftdoctor inspect` lists a Kimi-class sharded checkpoint, against a bare header loop.

Generates (once, in build/bench/kimi-sparse) 64 sparse shards holding about 10^5 tensors whose
data are holes (a multi-TB checkpoint on almost no disk), then times in this one run:
  - baseline: a bare loop that opens each shard and reads its 8-byte length and JSON header;
  - inspect:  draftdoctor's open_checkpoint (all validation) + the tensor table;
  - cli:      the whole `draftdoctor inspect` command, each output format, as a subprocess (startup
              included; the package's bytecode compiled first, as `pip install` does).
Prints the times and the ratios to the baseline. Usage: .venv/bin/python benchmarks/inspect_speed.py
"""

import compileall
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.synth import write_shards
from draftdoctor.tables import tensor_columns

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FOLDER = ROOT / "build" / "bench" / "kimi-sparse"
LAYERS, EXPERTS, SHARDS = 61, 540, 64


def kimi_tensors():
    tensors = {"model.embed_tokens.weight": ("BF16", (163840, 7168)), "lm_head.weight": ("BF16", (163840, 7168))}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = ("BF16", (7168, 7168))
        tensors[p + "input_layernorm.weight"] = ("BF16", (7168,))
        for j in range(EXPERTS):
            for w, shape in (("w1", (2048, 7168)), ("w2", (7168, 2048)), ("w3", (2048, 7168))):
                tensors[f"{p}mlp.experts.{j}.{w}.weight"] = ("BF16", shape)
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


def best_of(fn, repeat=5):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    build()
    compileall.compile_dir(ROOT / "lib" / "draftdoctor", quiet=1)
    n = bare_loop()
    size = sum(json.loads((FOLDER / "model.safetensors.index.json").read_text())["metadata"].values())
    print(f"checkpoint: {SHARDS} shards, {n} tensors, {size / 1e12:.1f} TB claimed (sparse)")
    base = best_of(bare_loop)
    inspect = best_of(lambda: tensor_columns(open_checkpoint(FOLDER)))
    print(f"bare header loop    {base:7.3f} s   1.00x")
    print(f"inspect (library)   {inspect:7.3f} s   {inspect / base:.2f}x")
    for fmt in ("text", "csv", "json"):
        command = [str(BIN / "draftdoctor"), "inspect", str(FOLDER), "--format", fmt]
        cli = best_of(lambda: subprocess.run(command, check=True, stdout=subprocess.DEVNULL), repeat=3)
        print(f"inspect (CLI, {fmt:4}) {cli:7.3f} s   {cli / base:.2f}x")


if __name__ == "__main__":
    main()
