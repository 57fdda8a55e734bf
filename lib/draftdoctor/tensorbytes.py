"""A checkpoint's tensors read in bounded pieces, for `compare`: byte ranges through one descriptor per
file (no read larger than `CHUNK_BYTES`), two byte streams compared a chunk of each at a time, a digest,
values decoded to float64 a chunk at a time, and what parts stacked together look like (dtype, shape,
rows). numpy only."""

from __future__ import annotations

import hashlib
import os

import numpy as np

from .checkpoint import CheckpointError, open_regular
from .valueread import FLOATS, decode

CHUNK_BYTES = 8 << 20  # what one read brings in: the memory a comparison holds per side
DECODABLE = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64,
             "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


class _Reader:
    """Byte ranges of a checkpoint's tensors, one open descriptor per file; no read is larger than
    CHUNK_BYTES."""

    def __init__(self):
        self.fds = {}

    def _range(self, t, offset: int, length: int, size: int):
        fd = self.fds.get(t.file)
        if fd is None:  # a regular file still: one swapped for a FIFO since its header was read is refused
            with open_regular(t.file) as f:
                fd = self.fds[t.file] = os.dup(f.fileno())
        offset, end = t.begin + offset, t.begin + offset + length
        while offset < end:
            data = os.pread(fd, min(size, end - offset), offset)
            if not data:
                raise CheckpointError(t.file, f"ends inside tensor {t.name} (changed while being read?)")
            offset += len(data)
            yield data

    def chunks(self, parts, size: int | None = None):
        """The bytes of `parts` (tensors, in order) in chunks of at most `size` (default CHUNK_BYTES)."""
        size = min(size or CHUNK_BYTES, CHUNK_BYTES)
        for t in parts:
            yield from self._range(t, 0, t.nbytes, size)

    def window(self, parts, start: int, length: int) -> bytes:
        """`length` bytes of `parts` (tensors, in order, as one stream) from byte `start`."""
        out = []
        for t in parts:
            if length <= 0:
                break
            if start >= t.nbytes:
                start -= t.nbytes
                continue
            take = min(length, t.nbytes - start)
            out += self._range(t, start, take, CHUNK_BYTES)
            length, start = length - take, 0
        return b"".join(out)

    def same_bytes(self, a_parts, b_parts) -> bool:
        """Whether the two byte streams are equal, read a chunk of each at a time (stops at the first
        difference)."""
        if sum(t.nbytes for t in a_parts) != sum(t.nbytes for t in b_parts):
            return False
        return all(x == y for x, y in zip(_fixed(self.chunks(a_parts)), _fixed(self.chunks(b_parts))))

    def digest(self, parts) -> str:
        h = hashlib.sha256()
        for data in self.chunks(parts):
            h.update(data)
        return h.hexdigest()

    def close(self):
        for fd in self.fds.values():
            os.close(fd)


def _fixed(chunks, size: int | None = None):
    """`chunks` re-cut into pieces of exactly `size` bytes (default CHUNK_BYTES; the last may be shorter)."""
    size = size or CHUNK_BYTES
    pending = b""
    for data in chunks:
        pending = pending + data if pending else data
        while len(pending) >= size:
            yield pending[:size]
            pending = pending[size:]
    if pending:
        yield pending


def _decode(raw: bytes, dtype: str) -> np.ndarray:
    if dtype in FLOATS:  # signalling NaNs made quiet, so numpy prints no warning (valueread.decode)
        return decode(raw, dtype)
    return np.frombuffer(raw, dtype=DECODABLE[dtype]).astype(np.float64)


def _elements(reader: _Reader, parts, dtype: str, per_chunk: int):
    """The values of `parts` in float64 chunks of `per_chunk` elements (the last may be shorter)."""
    item = ITEM_BYTES[dtype]
    pending = b""
    for data in reader.chunks(parts, per_chunk * item):
        pending += data
        while len(pending) >= per_chunk * item:
            yield _decode(pending[:per_chunk * item], dtype)
            pending = pending[per_chunk * item:]
    if pending:
        yield _decode(pending, dtype)


def _numel(parts) -> int:
    return sum(int(np.prod(t.shape, dtype=np.int64)) for t in parts)


def _dtype(parts) -> str:
    """The parts' dtype, or theirs joined by + when they differ."""
    dtypes = [t.dtype for t in parts]
    return dtypes[0] if len(set(dtypes)) == 1 else "+".join(dtypes)


def _shape(parts) -> tuple | None:
    """A tensor's shape; parts' stacked along their first dim (None when their other dims differ)."""
    if len(parts) == 1:
        return tuple(parts[0].shape)
    if any(not t.shape for t in parts) or len({tuple(t.shape[1:]) for t in parts}) > 1:
        return None
    return (sum(t.shape[0] for t in parts), *parts[0].shape[1:])


def _geometry(shape: tuple | None, numel: int) -> tuple[int, int]:
    """(rows, values per row) of a tensor seen as a matrix: its first dim against the rest."""
    if shape and len(shape) >= 2 and shape[0]:
        return shape[0], numel // shape[0]
    return numel, 1
