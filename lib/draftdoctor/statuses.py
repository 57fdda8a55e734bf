"""The words a coverage report uses: what a loader did with each checkpoint key and each parameter.

The bottom floor: every module that reads or writes a status takes it from here. Members are strings
(`StrEnum`), so JSON, CSV and DataFrames show the plain words ("loaded", "uninitialized", ...).
"""

from __future__ import annotations

from enum import StrEnum


class KeyFate(StrEnum):
    """What the engine's loader does with one checkpoint key."""

    LOADED = "loaded"  # written into a parameter (or one shard of a fused parameter)
    DERIVED = "derived"  # turned into an attribute instead (SGLang's d2t -> hot_token_id)
    IGNORED = "ignored"  # skipped by design (t2d)
    DROPPED = "dropped"  # matches no parameter: discarded (silently, or with a warning)
    TRAINING_ONLY = "training-only"  # a training-only tensor no engine has a parameter for
    MISMATCH = "shape-mismatch"  # matches a parameter of another shape: the load raises
    NOT_REACHED = "not-reached"  # the load failed before this key
    CRASHED = "crash"  # the loader raises on this key (e.g. KeyError)


class ParamFate(StrEnum):
    """What a parameter the engine creates holds once the load is over."""

    WRITTEN = "written"  # every element written from the checkpoint
    PARTIAL = "partial"  # some shards of a fused parameter written, others left at init
    UNINITIALIZED = "uninitialized"  # never written: its initial (random) values stay
    FROM_TARGET = "from-target"  # unwritten, and the engine swaps in the target's tensor at serve time
    IDENTITY = "identity"  # unwritten, and its initial value is already right (a zeros vocab map)
    MISMATCH = "shape-mismatch"  # a key of another shape was aimed at it: the load raises (KeyFate's word)
