"""The header-only reader: what it reads, and the index and folder rules. Every malformed-file rule (field
notes §10) has its files in tests/bad_files.py, refused by the reader and each command in tests/test_robustness.py."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from draftdoctor.checkpoint import CheckpointError, open_checkpoint, read_header
from draftdoctor.synthwrite import write_safetensors


def test_reads_what_safetensors_wrote(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(4, dtype=np.int64)}
    save_file(arrays, tmp_path / "x.safetensors", metadata={"format": "pt"})
    shard = read_header(tmp_path / "x.safetensors")
    by_name = {t.name: t for t in shard.tensors}
    assert by_name["a"].shape == (2, 3) and by_name["a"].dtype == "F32" and by_name["a"].nbytes == 24
    assert shard.metadata == {"format": "pt"}
    with open(tmp_path / "x.safetensors", "rb") as f:
        f.seek(by_name["a"].begin)
        assert np.frombuffer(f.read(24), dtype=np.float32).tolist() == list(range(6))


def test_folder_and_sharded(draft):
    single = open_checkpoint(draft("speculators"))
    sharded = open_checkpoint(draft("speculators", shards=3))
    assert single.keys() and sorted(single.keys()) == sorted(sharded.keys())
    assert len(sharded.shards) == 3 and sharded.config["speculators_model_type"] == "eagle3"
    assert open_checkpoint(single.path / "model.safetensors").keys() == single.keys()


def test_never_reads_tensor_data(tmp_path):
    """A sparse 'huge' file (data never written) lists instantly: only the header is read."""
    write_safetensors(tmp_path / "big.safetensors", {"w": ("F16", (200_000, 50_000))}, fill="sparse")
    ckpt = open_checkpoint(tmp_path / "big.safetensors")
    assert ckpt.tensors["w"].nbytes == 20_000_000_000


def _sharded(draft):
    folder = draft("speculators", shards=2)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return folder, index


def _write_index(folder, index):
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_index_entry_pointing_at_missing_file(draft):
    folder, index = _sharded(draft)
    index["weight_map"]["fc.weight"] = "model-00009-of-00009.safetensors"
    _write_index(folder, index)
    with pytest.raises(CheckpointError, match="does not exist") as e:
        open_checkpoint(folder)
    assert "fc.weight" in str(e.value)


@pytest.mark.parametrize("kind", ["nul", "fifo", "folder"])
def test_index_entry_naming_no_regular_file_says_what_it_is(draft, kind):
    """A NUL in a file name had raised ValueError (a traceback); a FIFO or folder was said not to exist."""
    folder, index = _sharded(draft)
    shard = index["weight_map"]["fc.weight"]
    if kind == "nul":
        index["weight_map"]["fc.weight"] = "model\0.safetensors"
        _write_index(folder, index)
    else:
        (folder / shard).unlink()
        os.mkfifo(folder / shard) if kind == "fifo" else (folder / shard).mkdir()
    said = "holds a NUL character" if kind == "nul" else "is not a regular file"
    with pytest.raises(CheckpointError, match=said) as e:
        open_checkpoint(folder)
    assert str(folder / "model.safetensors.index.json") in str(e.value)


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd"])
def test_index_entry_outside_folder(draft, target):
    folder, index = _sharded(draft)
    (folder.parent / "outside.safetensors").write_bytes(b"")
    index["weight_map"]["fc.weight"] = target
    _write_index(folder, index)
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        open_checkpoint(folder)


def test_symlinked_shard_leaving_folder_is_refused(draft):
    folder, index = _sharded(draft)
    shard = folder / index["weight_map"]["fc.weight"]
    moved = folder.parent / "elsewhere.safetensors"
    shard.rename(moved)
    shard.symlink_to(moved)
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        open_checkpoint(folder)


def hf_cache_snapshot(folder: Path) -> Path:
    """`folder` laid out as the Hugging Face cache lays out a download: every file of the snapshot a
    link to `../../blobs/<hash>`."""
    repo = folder.parent / "models--org--draft"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for i, item in enumerate(sorted(folder.iterdir())):
        (repo / "blobs" / f"blob{i}").write_bytes(item.read_bytes())
        (snapshot / item.name).symlink_to(Path("../../blobs") / f"blob{i}")
    return snapshot


def test_a_sharded_hugging_face_cache_snapshot_is_read(draft):
    folder, _ = _sharded(draft)
    snapshot = hf_cache_snapshot(folder)
    assert open_checkpoint(snapshot).tensors.keys() == open_checkpoint(folder).tensors.keys()
    # a link out of the snapshot to anything but its repository's blobs is still refused
    shard = next(snapshot.glob("*.safetensors"))
    elsewhere = snapshot.parent.parent.parent / "elsewhere.safetensors"
    elsewhere.write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        open_checkpoint(snapshot)


def test_index_entry_absent_from_shard_header(draft):
    folder, index = _sharded(draft)
    index["weight_map"]["ghost.weight"] = index["weight_map"]["fc.weight"]
    _write_index(folder, index)
    with pytest.raises(CheckpointError, match="not in that file's header") as e:
        open_checkpoint(folder)
    assert "ghost.weight" in str(e.value)


def test_tensor_missing_from_index(draft):
    folder, index = _sharded(draft)
    del index["weight_map"]["norm.weight"]
    _write_index(folder, index)
    with pytest.raises(CheckpointError, match="not listed in") as e:
        open_checkpoint(folder)
    assert "norm.weight" in str(e.value)


def test_index_pointing_at_wrong_shard(draft):
    folder, index = _sharded(draft)
    files = sorted(set(index["weight_map"].values()))
    index["weight_map"]["fc.weight"] = next(f for f in files if f != index["weight_map"]["fc.weight"])
    _write_index(folder, index)
    with pytest.raises(CheckpointError, match="but stored in"):
        open_checkpoint(folder)


def test_pickle_checkpoints_are_never_unpickled(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    for path in (tmp_path, tmp_path / "pytorch_model.bin"):
        with pytest.raises(CheckpointError, match="not read: unpickling"):
            open_checkpoint(path)


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        open_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no .safetensors file"):
        open_checkpoint(tmp_path)


def test_tensor_stored_in_two_shards(draft):
    folder, index = _sharded(draft)
    from draftdoctor.synthwrite import write_safetensors

    other = next(f for f in set(index["weight_map"].values()) if f != index["weight_map"]["fc.weight"])
    write_safetensors(folder / other, {"fc.weight": np.zeros((64, 192), dtype=np.float16),
                                       **{n: np.zeros(1, dtype=np.float16) for n, f in index["weight_map"].items()
                                          if f == other}})
    with pytest.raises(CheckpointError, match="also stored in") as e:
        open_checkpoint(folder)
    assert "fc.weight" in str(e.value)


@pytest.mark.parametrize("spaced", [False, True])
def test_a_tensor_listed_twice_in_the_index_is_refused(draft, spaced):
    """The index parse keeps the last of repeated keys; the quote count catches the repeat, whatever the
    file's formatting, and the slow parse names it."""
    folder, index = _sharded(draft)
    text = json.dumps(index, separators=(", ", " : ") if spaced else (",", ":"))
    first = next(iter(index["weight_map"]))
    entry = json.dumps(first) + (" : " if spaced else ":") + json.dumps(index["weight_map"][first])
    (folder / "model.safetensors.index.json").write_text(text.replace(entry, entry + ", " + entry, 1))
    with pytest.raises(CheckpointError, match="duplicate key") as e:
        open_checkpoint(folder)
    assert first in str(e.value)


def test_an_escaped_quote_in_an_index_is_no_duplicate(draft):
    """A name with a quote in it raises the quote count (the slow parse then runs, and finds nothing)."""
    folder, index = _sharded(draft)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index | {"metadata": {"note": 'a "quoted" word'}}))
    assert len(open_checkpoint(folder).tensors) == len(index["weight_map"])
