"""Malformed safetensors files, made in one place for every command that must refuse them.

One list, DEFECTS: the committed corpus (corpus/malformed, one hand-made file per defect) and the
variants built here at test time (other bytes for the same rules, files too short to hold a length, and
a draft folder whose header was overwritten). `tests/test_robustness.py` gives each to every reader and
command: each must refuse it with one line naming the file and saying what is wrong (exit 2), never a
traceback.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftdoctor.synth import write_draft

CORPUS = Path(__file__).parent / "corpus" / "malformed"


def safetensors_bytes(header: dict | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    """A file of `header` (JSON of a dict, or raw bytes) and `data`, its length field `length` if given."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(body) if length is None else length) + body + data


@dataclass(frozen=True)
class Defect:
    name: str
    problem: str  # what the one error line says about it, besides the file's path
    raw: bytes | None = None  # the file's bytes; None: the committed corpus file `name`.safetensors
    edit: Callable[[bytes], bytes] | None = None  # made from a synthetic draft's model.safetensors, the folder given

    def make(self, folder: Path) -> tuple[Path, Path]:
        """(what a command is given, the file its error must name); what is made goes under `folder`."""
        if self.edit is not None:
            draft = write_draft(folder / "draft", layout="speculators")
            weights = draft / "model.safetensors"
            weights.write_bytes(self.edit(weights.read_bytes()))
            return draft, weights
        if self.raw is None:
            path = CORPUS / f"{self.name}.safetensors"
            assert path.is_file(), path
            return path, path
        path = folder / f"{self.name}.safetensors"
        path.write_bytes(self.raw)
        return path, path


def _overwrite_header_start(raw: bytes) -> bytes:
    return raw[:8] + b"{not json!!!" + raw[20:]


T = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}  # a good entry, bytes [0, 8)

DEFECTS = [
    # the committed corpus
    Defect("claims-terabytes", "past the end"),
    Defect("data-truncated", "past the end"),
    Defect("dtype-missing", "unknown dtype"),
    Defect("dtype-unknown", "unknown dtype"),
    Defect("duplicate-key", "duplicate key"),
    Defect("empty", "too short"),
    Defect("entry-not-object", "not an object"),
    Defect("f4-odd-elements", "needs 1.5"),
    Defect("hole", "hole"),
    Defect("json-array", "not a JSON object"),
    Defect("json-deep", "not valid JSON"),
    Defect("length-huge", "exceeds"),
    Defect("length-past-end", "past the end"),
    Defect("length-zero", "not valid JSON"),
    Defect("metadata-not-strings", "__metadata__"),
    Defect("not-json", "not valid JSON"),
    Defect("not-utf8", "UTF-8"),
    Defect("offsets-reversed", "data_offsets"),
    Defect("offsets-strings", "data_offsets"),
    Defect("offsets-three", "data_offsets"),
    Defect("overlap", "overlaps"),
    Defect("seven-bytes", "too short"),
    Defect("shape-bool", "shape"),
    Defect("shape-float", "shape"),
    Defect("shape-huge", "shape"),
    Defect("shape-negative", "shape"),
    Defect("size-mismatch", "needs 6"),
    Defect("trailing-bytes", "trailing"),
    # made here: the same rules with other bytes
    Defect("two-bytes", "too short", b"xx"),
    Defect("three-bytes", "too short", b"\1\2\3"),
    Defect("four-zero-bytes", "too short", b"\0" * 4),
    Defect("length-over-limit", "exceeds", safetensors_bytes(b"{}", length=200_000_000)),
    Defect("length-just-past-end", "past the end", safetensors_bytes(b"{}", length=50)),
    Defect("utf16-mark", "UTF-8", safetensors_bytes(b"\xff\xfe{}")),
    Defect("json-bare-word", "not valid JSON", safetensors_bytes(b"{not json")),
    Defect("json-list", "not a JSON object", safetensors_bytes(b"[1, 2]")),
    Defect("dtype-f31", "unknown dtype", safetensors_bytes({"t": T | {"dtype": "F31"}}, b"\0" * 8)),
    Defect("shape-minus-one", "shape", safetensors_bytes({"t": T | {"shape": [-1]}}, b"\0" * 8)),
    Defect("offsets-reversed-full", "data_offsets", safetensors_bytes({"t": T | {"data_offsets": [8, 0]}}, b"\0" * 8)),
    Defect("size-mismatch-f32", "needs 12", safetensors_bytes({"t": T | {"shape": [3]}}, b"\0" * 8)),
    Defect("hole-two-floats", "hole", safetensors_bytes({"t": T | {"data_offsets": [4, 12]}}, b"\0" * 12)),
    Defect("trailing-after-good", "trailing", safetensors_bytes({"t": T}, b"\0" * 12)),
    Defect("data-truncated-good-header", "past the end", safetensors_bytes({"t": T}, b"\0" * 4)),
    Defect("duplicate-key-t", "duplicate", safetensors_bytes(b'{"t": ' + json.dumps(T).encode() + b', "t": '
                                                             + json.dumps(T).encode() + b"}", b"\0" * 8)),
    Defect("metadata-int-value", "__metadata__", safetensors_bytes({"__metadata__": {"k": 1}})),
    # a repeated key whose first entry has no literal "data_offsets" (none, not an object, the key spelt in an
    # escape): a count of that key had missed each, and the parser keeps the last without a word
    Defect("duplicate-key-first-without-offsets", "duplicate key in header",
           safetensors_bytes(b'{"t": {"dtype": "F32", "shape": [2]}, "t": ' + json.dumps(T).encode() + b"}", b"\0" * 8)),
    Defect("duplicate-key-first-a-number", "duplicate key in header",
           safetensors_bytes(b'{"t": 5, "t": ' + json.dumps(T).encode() + b"}", b"\0" * 8)),
    Defect("duplicate-key-offsets-escaped", "duplicate key in header",
           safetensors_bytes(b'{"t": ' + json.dumps(T).encode().replace(b"data_offsets", b"data_offset\\u0073")
                             + b', "t": ' + json.dumps(T).encode() + b"}", b"\0" * 8)),
    # nested past the standard parser's depth (not the fast one's) in a field the format does not have, where
    # the slow parse that names a repeated key runs: it had raised RecursionError
    Defect("deep-extra-field", "nested too deeply",
           safetensors_bytes(b'{"__metadata__": {"data_offsets": "x"}, "t": ' + json.dumps(T).encode()[:-1]
                             + b', "x": ' + b"[" * 1000 + b"]" * 1000 + b"}}", b"\0" * 8)),
    # a draft folder whose header's first bytes were overwritten: the error names the file inside it
    Defect("draft-header-overwritten", "not valid JSON", edit=_overwrite_header_start),
]
assert len({d.name for d in DEFECTS}) == len(DEFECTS)  # one name each: the test ids
