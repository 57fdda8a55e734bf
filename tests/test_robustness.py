"""The header reader under hostile input: every malformed file refused by every command, and hypothesis
fuzzing of the reader.

Every malformed file (tests/bad_files.py: the committed corpus and variants made there) is refused by the
reader with one CheckpointError, and by each command that reads a checkpoint with one line (exit 2), both
naming the file and the problem; never a traceback. Every generated input must end in success or one
CheckpointError naming the file; never another exception, never a hang, never memory proportional to a
size the file merely claims. FUZZ_EXAMPLES (default 10,000, three quarters generated headers, one quarter
mutations of a valid file) sets the number of generated cases; `make fuzz` runs many more.
"""

import io
import json
import os
import struct
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdoctor.checkpoint import DTYPE_BITS, CheckpointError, open_checkpoint
from draftdoctor.cli import main

from bad_files import DEFECTS  # tests/bad_files.py

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "10000"))

# What must refuse a malformed file: the reader itself, and each command that reads a checkpoint (the file
# given as the checkpoint; compare's other side a good draft; fix's --out unmade).
REFUSERS = {
    "open_checkpoint": None,
    "inspect": lambda given, out: ["inspect", given],
    "check": lambda given, out: ["check", given, "--engine", "sglang==0.5.10"],
    "fix": lambda given, out: ["fix", given, "--engine", "sglang==0.5.10", "--out", out],
    "compare": lambda given, out: ["compare", given, DEMO / "draft-story"],
}
# The commands run in this process (main() as the console script calls it: ~1 ms, not a 0.3 s interpreter
# start each); these defects also run as a user runs them, a separate process (its exit status, its stderr).
AS_A_USER_RUNS_IT = {"two-bytes", "four-zero-bytes", "draft-header-overwritten"}
assert AS_A_USER_RUNS_IT <= {d.name for d in DEFECTS}


def _run(argv: list, separate: bool) -> tuple[int, str]:
    """(exit status, stderr) of the command line `argv`."""
    if separate:
        proc = subprocess.run([sys.executable, "-m", "draftdoctor.cli", *map(str, argv)], capture_output=True,
                              text=True, timeout=120)
        return proc.returncode, proc.stderr
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(list(map(str, argv)))  # an exception escaping main() fails the test: it would be a traceback
    return code, err.getvalue()


@pytest.mark.parametrize("refuser", list(REFUSERS))
@pytest.mark.parametrize("defect", DEFECTS, ids=lambda d: d.name)
def test_malformed_file_is_refused_in_one_line_naming_it(defect, refuser, tmp_path):
    given, named = defect.make(tmp_path)
    if REFUSERS[refuser] is None:
        with pytest.raises(CheckpointError) as e:
            open_checkpoint(given)
        assert str(named) in str(e.value) and defect.problem in str(e.value), str(e.value)
        return
    code, err = _run(REFUSERS[refuser](given, tmp_path / "out"), separate=defect.name in AS_A_USER_RUNS_IT)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert str(named) in lines[0] and defect.problem in lines[0], lines
    assert not (tmp_path / "out").exists()  # fix wrote nothing


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
