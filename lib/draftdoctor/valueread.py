"""One bounded read of a tensor's values, for the value checks (`values.py`): at most READ_ELEMENTS
values (at least MIN_ROWS whole rows), placed with `secrets`, decoded to float64 (`decode` widens bf16
and quiets signalling NaNs; `compare` decodes with it too). numpy only, never torch, never a whole file.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from .checkpoint import TensorInfo

READ_ELEMENTS = 1 << 15  # per tensor: 64 kB of bf16 (more only for rows so long that MIN_ROWS of them are more)
MIN_ROWS = 16  # a block holds at least this many rows (so a 14336-wide row is read 16 at a time: 448 kB of bf16)
MAX_ROW = 1 << 17  # rows longer than this are read as a window of values: constant and finite checks only
# numpy's view of each float dtype; BF16 is widened by hand (numpy has none)
FLOATS = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}
ITEM = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class Block:
    """What was read of a tensor: `values` (float64; 2-D rows x columns for a matrix read as a block
    of whole rows, else 1-D), whether that is the whole tensor, and where in it (for messages)."""

    values: np.ndarray
    whole: bool
    where: str


def decode(raw: bytes, dtype: str) -> np.ndarray:
    """`raw` (whole elements of `dtype`, a float type of FLOATS) as float64. A signalling NaN (any NaN
    bit pattern with the quiet bit clear: bf16 0x7f81, f32 0x7f800001) is made quiet first: numpy's
    float32-to-float64 cast raises the invalid-operation flag on one and prints a RuntimeWarning."""
    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
    elif dtype == "F32":
        bits = np.frombuffer(raw, dtype=np.uint32)
    else:
        return np.frombuffer(raw, dtype=FLOATS[dtype]).astype(np.float64)
    nan = (bits & 0x7F800000 == 0x7F800000) & (bits & 0x007FFFFF != 0)
    if nan.any():
        bits = bits | np.where(nan, np.uint32(0x00400000), np.uint32(0))
    return bits.view(np.float32).astype(np.float64)


def read_block(t: TensorInfo) -> Block | None:
    """One bounded read of float tensor `t`: all of it when it has at most READ_ELEMENTS values; else,
    for a matrix (any tensor of 2+ dimensions, as rows of its last one), a block of whole consecutive
    rows starting at a row drawn with `secrets`; else a window of READ_ELEMENTS values so placed.
    None for other dtypes (integers, bools, 8-bit floats) and empty tensors."""
    if t.dtype not in FLOATS or t.nbytes == 0:
        return None
    item = ITEM[t.dtype]
    count = t.nbytes // item
    width = int(t.shape[-1]) if len(t.shape) >= 2 else 0
    rows = count // width if width else 0
    if count <= READ_ELEMENTS:
        first, length, where = 0, count, f"all {count} values"
    elif width and width <= MAX_ROW and rows >= 2:
        take = min(rows, max(MIN_ROWS, READ_ELEMENTS // width))
        start = secrets.randbelow(rows - take + 1)
        first, length, where = start * width, take * width, f"rows {start}-{start + take - 1} of {rows}"
    else:
        first, length = secrets.randbelow(count - READ_ELEMENTS + 1), READ_ELEMENTS
        width, where = 0, f"values {first}-{first + READ_ELEMENTS - 1} of {count}"
    raw = t.read(first * item, length * item)  # a file shorter than its header says gives fewer bytes
    values = decode(raw[:len(raw) // item * item], t.dtype)
    if width and len(values) == length and length % width == 0 and length // width >= 2:
        values = values.reshape(-1, width)
    return Block(values, len(values) == count, where) if len(values) else None
