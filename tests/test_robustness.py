"""The header reader under hostile input: a committed malformed corpus and hypothesis fuzzing.

Every input must end in success or one CheckpointError naming the file; never another exception,
never a hang, never memory proportional to a size the file merely claims. FUZZ_EXAMPLES (default
10,000, three quarters generated headers, one quarter mutations of a valid file) sets the number of
generated cases; `make fuzz` runs many more.
"""

import io
import json
import os
import struct
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdoctor.checkpoint import DTYPE_BITS, CheckpointError, open_checkpoint
from draftdoctor.cli import main

CORPUS = sorted((Path(__file__).parent / "corpus" / "malformed").glob("*.safetensors"))
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "10000"))


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_corpus_file_gives_one_clear_error(path):
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_cli_exits_2_with_one_line_on_every_corpus_file(command):
    for path in CORPUS:
        err = io.StringIO()
        args = [command, str(path)] + (["--engine", "sglang==0.5.10"] if command == "check" else [])
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            code = main(args)
        lines = err.getvalue().strip().splitlines()
        assert code == 2 and len(lines) == 1 and str(path) in lines[0], (path.name, err.getvalue())


# --- generated inputs -----------------------------------------------------------------------------

ints = st.one_of(st.integers(-3, 64), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.booleans(),
                 st.text(max_size=3), st.none())
entries = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.one_of(st.sampled_from(sorted(DTYPE_BITS)), st.text(max_size=6), ints),
        "shape": st.one_of(st.lists(st.integers(0, 8), max_size=3), st.lists(ints, max_size=3), ints),
        "data_offsets": st.one_of(st.lists(st.integers(0, 80), min_size=2, max_size=2), st.lists(ints, max_size=3), ints),
    },
)
headers = st.dictionaries(st.text(max_size=8), st.one_of(entries, ints, st.lists(ints, max_size=2)), max_size=4)


def _file(header_bytes: bytes, data: bytes, length_delta: int) -> bytes:
    return struct.pack("<Q", max(0, len(header_bytes) + length_delta) % 2**64) + header_bytes + data


def _must_be_clean(tmp: Path, raw: bytes) -> None:
    tmp.write_bytes(raw)
    try:
        open_checkpoint(tmp)
    except CheckpointError as e:
        assert str(tmp) in str(e)


@settings(max_examples=EXAMPLES * 3 // 4, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(header=headers, data=st.binary(max_size=96), length_delta=st.sampled_from([0, 0, 0, -1, 1, 7, 2**40]))
def test_generated_headers(tmp_path_factory, header, data, length_delta):
    tmp = tmp_path_factory.getbasetemp() / "fuzz.safetensors"
    _must_be_clean(tmp, _file(json.dumps(header).encode(), data, length_delta))


VALID = _file(json.dumps({"__metadata__": {"format": "pt"},
                          "a": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]},
                          "b": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]}}).encode(), bytes(16), 0)


@settings(max_examples=EXAMPLES // 4, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(edits=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=6),
       cut=st.integers(0, len(VALID)))
def test_mutated_valid_file(tmp_path_factory, edits, cut):
    raw = bytearray(VALID)
    for position, value in edits:
        raw[position] = value
    _must_be_clean(tmp_path_factory.getbasetemp() / "mutant.safetensors", bytes(raw[:cut] if cut else raw))
