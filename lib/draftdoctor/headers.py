"""One safetensors file's header, read and validated without its data, and written.

`read_header` reads a file's 8-byte length and JSON header (never the data, never mmap, never torch)
into a `ShardHeader`: its tensors held as columns, checked a column at a time, with anything odd
handed to the per-entry validator that names the entry. `encode_header` is the one writer of
headers. Validation follows the reference reader (docs/engine-facts.md: "The safetensors format")
and adds duplicate keys; every problem is one `CheckpointError` naming the file, and the tensor
where there is one. `checkpoint` puts the headers of a whole checkpoint together.
"""

from __future__ import annotations

import errno
from array import array
import gc
import json
import os
import stat
import struct
from collections import namedtuple
from contextlib import contextmanager
from functools import partial
from itertools import chain, repeat
from math import prod
from operator import add, attrgetter, itemgetter, mul, sub
from pathlib import Path

try:
    import orjson
except ImportError:  # a real-loader child sees its release's packages only, which may lack it: the standard parser
    orjson = None

from .errors import UserError

MAX_HEADER_BYTES = 100_000_000  # the reference reader's limit
PAGE = os.sysconf("SC_PAGESIZE") if hasattr(os, "sysconf") else 4096


# Bits per element: sub-byte float formats are packed.
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}

DTYPE_NAMES = {name: name for name in DTYPE_BITS}
DTYPE_BYTES = {name: bits // 8 for name, bits in DTYPE_BITS.items() if bits % 8 == 0}


class CheckpointError(UserError):
    """A checkpoint that cannot be used, with the file (and tensor) at fault."""

    def __init__(self, path, problem: str, tensor: str | None = None):
        self.path = str(path)
        self.problem = problem
        self.tensor = tensor
        where = f"{self.path}: tensor {tensor!r}: " if tensor else f"{self.path}: "
        super().__init__(where + problem)


class TensorInfo(namedtuple("TensorInfo", "name dtype shape file begin end")):  # not typing's: 3 ms to import
    """One tensor as its header describes it: name, dtype (str), shape (tuple), file (Path), and
    `begin`/`end`, absolute byte offsets in `file`."""

    __slots__ = ()

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """The tensor's bytes, or `length` of them from `offset`, read from its file (for the few
        small tensors and sampled windows the checks look at; nothing reads a whole checkpoint)."""
        length = self.nbytes - offset if length is None else length
        with open_regular(self.file) as f:  # swapped for a FIFO since its header was read: refused, not waited on
            return os.pread(f.fileno(), length, self.begin + offset)


class ShardHeader:
    """One safetensors file's header: its tensors in file order and its `__metadata__`.

    Read from a file, the tensors are held as the header's columns (names, dtypes, shapes, and byte
    ranges within the data section), which `inspect` lists without a Python object per tensor;
    `tensors` makes their TensorInfo rows the first time it is asked for (10^5 of them cost tens of
    milliseconds)."""

    __slots__ = ("path", "header_len", "metadata", "_tensors", "_columns")

    def __init__(self, path: Path, header_len: int, tensors: list[TensorInfo] | None = None,
                 metadata: dict[str, str] | None = None, columns: tuple | None = None):
        self.path, self.header_len, self.metadata = path, header_len, metadata
        self._tensors, self._columns = tensors, columns  # names, dtypes, shapes, begins (in the data), sizes

    def __repr__(self) -> str:
        return f"ShardHeader({str(self.path)!r}, {len(self)} tensors)"

    def __len__(self) -> int:
        return len(self._columns[0] if self._tensors is None else self._tensors)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def tensors(self) -> list[TensorInfo]:
        if self._tensors is None:
            names, dtypes, shapes, begins, sizes = self._columns
            begins = list(map(add, begins, repeat(self.data_start)))
            self._tensors = list(map(partial(tuple.__new__, TensorInfo),
                                     zip(names, dtypes, shapes, repeat(self.path), begins, map(add, begins, sizes))))
        return self._tensors

    @property
    def names(self) -> list[str]:
        """The tensors' names, in file order."""
        return list(map(attrgetter("name"), self._tensors)) if self._columns is None else self._columns[0]

    def table(self) -> tuple[list[str], list[str], list[tuple[int, ...]], list[int]]:
        """The tensors as columns: names, dtypes, shapes and sizes in bytes, in file order."""
        if self._columns is None:
            names, dtypes, shapes, _, begins, ends = map(list, zip(*self._tensors)) if self._tensors else ([],) * 6
            return names, dtypes, shapes, list(map(sub, ends, begins))
        names, dtypes, shapes, _, sizes = self._columns
        return names, dtypes, shapes, sizes


def _reject_duplicates(path):
    def hook(pairs):
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen = set()
            key = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise CheckpointError(path, "duplicate key in header", tensor=key)
        return obj

    return hook


def open_regular(path: Path):
    """`path` opened for reading if it is a regular file: a FIFO, device or socket is refused, never
    waited on (opened non-blocking, checked, then read as usual)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        raise CheckpointError(path, "not a regular file (a FIFO, device or socket?)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_header(path: Path) -> ShardHeader:
    """Read and validate one safetensors file's header without touching its data."""
    path = path if isinstance(path, Path) else Path(path)
    try:
        with open_regular(path) as f:
            file_size = os.fstat(f.fileno()).st_size
            if file_size < 8:
                raise CheckpointError(path, f"file is {file_size} bytes, too short for a safetensors header")
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > MAX_HEADER_BYTES:
                raise CheckpointError(path, f"header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit")
            if 8 + header_len > file_size:
                raise CheckpointError(path, f"header length {header_len} runs past the end of the {file_size}-byte file")
            raw = f.read(header_len)
    except IsADirectoryError:
        raise CheckpointError(path, "is a directory, expected a .safetensors file") from None
    except PermissionError:
        raise CheckpointError(path, "permission denied") from None
    except FileNotFoundError:
        raise CheckpointError(path, "no such file") from None
    except OSError as e:  # a link loop, an I/O error, a name too long
        raise CheckpointError(path, e.strerror or str(e)) from None
    try:
        # orjson: 1.6x the standard parser on these headers; it checks UTF-8 itself
        header = orjson.loads(raw) if orjson else json.loads(raw)
    except (ValueError, RecursionError) as e:  # orjson's JSONDecodeError is a ValueError, as are json's errors
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise CheckpointError(path, f"header is not valid UTF-8 (byte {bad.start})") from None
        raise CheckpointError(path, f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "header is not a JSON object")
    if raw.count(b'"data_offsets"') != len(header) - ("__metadata__" in header):
        # Fewer entries than data_offsets keys: a name may repeat (the parser keeps the last). The slow
        # parse that names it runs only then.
        _name_a_repeat(path, raw)
    data_start = 8 + header_len
    metadata = header.get("__metadata__")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise CheckpointError(path, "__metadata__ must map strings to strings")
    header.pop("__metadata__", None)
    columns = _columns(header, file_size - data_start)
    if columns is not None:
        _refuse_repeats(path, raw, header, metadata)
        return ShardHeader(path, header_len, None, metadata, columns)
    # an entry that is not as the format says, or tensors not stored in header order: entry by entry,
    # naming the first problem
    tensors = [_tensor_info(path, name, entry, data_start) for name, entry in header.items()]
    _check_packing(path, tensors, data_start, file_size)
    _refuse_repeats(path, raw, header, metadata)
    return ShardHeader(path, header_len, tensors, metadata)


def _refuse_repeats(path: Path, raw: bytes, header: dict, metadata: dict | None) -> None:
    """Refuse a key the header's text holds twice, which the parser dropped without a word (it keeps the
    last), whatever the entry dropped held (the count of data_offsets keys above misses one without it,
    or with its name spelt in an escape). Each entry here is an object with a string dtype, so the parsed
    header holds at least its names, their keys and their dtypes as strings, and __metadata__'s key, keys
    and values. Without a backslash in the text each of its strings is two quote characters, so a text
    with no more quotes than twice that count dropped none; otherwise it is parsed again to name the key
    (or to find none: a string in a field the format does not have)."""
    strings = 2 * len(header) + sum(map(len, header.values())) + (1 + 2 * len(metadata) if metadata is not None else 0)
    if b"\\" in raw or raw.count(b'"') != 2 * strings:
        _name_a_repeat(path, raw)


def _name_a_repeat(path: Path, raw: bytes) -> None:
    """The slow parse of a header's text that refuses a repeated key by name (the standard parser, which
    recurses: a header nested past its depth is refused too, where the fast parser took it)."""
    try:
        json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates(path))
    except RecursionError:
        raise CheckpointError(path, "header is not valid JSON (nested too deeply)") from None


def _columns(header: dict, data_size: int) -> tuple | None:
    """A header's entries (`__metadata__` taken out) as columns: names, dtypes, shapes (tuples), begins
    (within the data section) and sizes in bytes, when every entry is as the format says and the
    tensors tile the data section in header order (as every writer stores them); otherwise None.

    This runs over 10^5 entries for a large checkpoint, where each Python-level pass costs milliseconds,
    so the checks are whole columns at once: a known dtype per entry (a dictionary lookup); every shape
    a list of non-negative integers and every data_offsets a pair of them, checked on the columns
    written back as JSON, where such lists are nothing but digits inside a fixed skeleton of brackets
    and commas (any other value writes some other character there); each tensor ending where the next
    begins; each size from its shape and dtype. A shape is parsed once per distinct one (its JSON text),
    so every tensor of that shape holds the same tuple.
    """
    n = len(header)
    if not n:
        return ([], [], [], array("q"), []) if data_size == 0 else None
    names, values = list(header), list(header.values())
    try:
        dtypes = list(map(DTYPE_NAMES.get, map(itemgetter("dtype"), values)))
        shapes = _dumps(list(map(itemgetter("shape"), values)))
        offsets = list(map(itemgetter("data_offsets"), values))
        if (None in dtypes or shapes.translate(None, b"0123456789,") != b"[" + b"[]" * n + b"]"
                or _dumps(offsets).translate(None, b"0123456789") != b"[" + b"[,]," * (n - 1) + b"[,]]"):
            return None
    except (TypeError, KeyError, ValueError, RecursionError):  # not an object, a field missing, an unhashable dtype
        return None
    begins, ends = zip(*offsets)
    if begins[0] or ends[-1] != data_size or begins[1:] != ends[:-1]:
        return None  # not tiled in header order: the entry-by-entry check sorts and names the problem
    texts = shapes[2:-2].split(b"],[")  # each shape's JSON: b'2048,7168'
    parsed = {text: tuple(map(int, text.split(b","))) if text else () for text in dict.fromkeys(texts)}
    sizes = list(map(sub, ends, begins))
    numel = {text: prod(shape) for text, shape in parsed.items()}
    element = list(map(DTYPE_BYTES.get, dtypes))
    if None in element:  # a sub-byte dtype (F4, F6): in bits
        element, sizes8 = list(map(DTYPE_BITS.__getitem__, dtypes)), list(map(mul, sizes, repeat(8)))
    else:
        sizes8 = sizes
    if list(map(mul, element, map(numel.__getitem__, texts))) != sizes8:
        return None
    return names, dtypes, list(map(parsed.__getitem__, texts)), array("q", begins), sizes


def _dumps(value) -> bytes:
    """`value` as compact JSON (orjson where there is one: it writes 10^5 short lists in a millisecond)."""
    return orjson.dumps(value) if orjson else json.dumps(value, separators=(",", ":")).encode()


def _tensor_info(path: Path, name: str, entry, data_start: int) -> TensorInfo:
    if type(entry) is not dict:
        raise CheckpointError(path, "entry is not an object", tensor=name)
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    bits = DTYPE_BITS.get(dtype) if type(dtype) is str else None
    if bits is None:
        raise CheckpointError(path, f"unknown dtype {dtype!r}", tensor=name)
    if type(shape) is not list:
        raise CheckpointError(path, f"shape must be a list of non-negative integers, got {shape!r}", tensor=name)
    for d in shape:
        if type(d) is not int or d < 0:
            raise CheckpointError(path, f"shape must be a list of non-negative integers, got {shape!r}", tensor=name)
        bits *= d
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or type(offsets[0]) is not int
        or type(offsets[1]) is not int
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise CheckpointError(path, f"data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}", tensor=name)
    if bits % 8 or offsets[1] - offsets[0] != bits // 8:
        raise CheckpointError(
            path, f"{offsets[1] - offsets[0]} bytes of data, but shape {shape} of {dtype} needs {bits / 8:g}", tensor=name
        )
    return TensorInfo(name, dtype, tuple(shape), path, data_start + offsets[0], data_start + offsets[1])


def _check_packing(path: Path, tensors: list[TensorInfo], data_start: int, file_size: int) -> None:
    """Tensors must tile the data section exactly: no holes, no overlaps, no trailing bytes."""
    if tensors:
        bounds = list(chain.from_iterable(sorted(map(attrgetter("begin", "end"), tensors))))  # begin, end, ...
        tiled = bounds[0] == data_start and bounds[-1] == file_size and bounds[1:-1:2] == bounds[2::2]
    else:
        tiled = data_start == file_size
    if tiled:
        return  # the common case, checked in C; the loop below names the first problem
    position = data_start
    for t in sorted(tensors, key=attrgetter("begin", "end")):
        if t.begin > position:
            raise CheckpointError(path, f"hole of {t.begin - position} bytes before this tensor", tensor=t.name)
        if t.begin < position:
            raise CheckpointError(path, "data overlaps the previous tensor", tensor=t.name)
        position = t.end
    if position > file_size:
        raise CheckpointError(path, f"data ends at byte {position}, past the end of the {file_size}-byte file")
    if position < file_size:
        raise CheckpointError(path, f"{file_size - position} trailing bytes after the last tensor")


def encode_header(entries, metadata: dict | None = None, page_offset_of: int | None = None) -> bytes:
    """The 8-byte length and JSON header of a safetensors file whose tensors are `entries`
    ((name, dtype, shape, nbytes), packed in that order): what `read_header` reads back.

    Padded with spaces to a multiple of 8, as the reference writer pads; given `page_offset_of` (another
    file's data start), further so that the data starts at the same offset within a page as there:
    the kernel copies whole pages between page-aligned ranges, and a copy shifted by a few bytes took
    1.5x as long (`fix`)."""
    header, offset = ({"__metadata__": metadata} if metadata is not None else {}), 0
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    pad = -len(raw) % 8
    if page_offset_of is not None and page_offset_of % 8 == 0:
        pad += (page_offset_of - (8 + len(raw) + pad)) % PAGE
    raw += b" " * pad
    return len(raw).to_bytes(8, "little") + raw


@contextmanager
def gc_paused():
    """Parsing 10^5 header entries allocates millions of objects that all stay alive; the cyclic
    GC would rescan them again and again (4x the parse time), and none of them form cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

