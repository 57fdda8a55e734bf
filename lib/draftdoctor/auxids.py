"""Aux hidden-state layer ids: where a config keeps them, what they mean there, what an engine captures.

The one home of the convention (docs/engine-facts.md: "SGLang's EAGLE-3 loader", "Real engines on these CPUs"). A draft's fc reads the residual stream of a few
target layers; a list of ids names them, in one of two conventions told by where the config keeps it:
- `eagle_config.eagle_aux_hidden_state_layer_ids` holds SGLang's: id k names the input of target
  layer k + 1 (SGLang captures id + 1); the EAGLE repo and SpecForge write this place;
- a top-level `eagle_aux_hidden_state_layer_ids` holds the convention of speculators, vLLM and
  llama.cpp: id k names the input of layer k.
An engine reads the places its profile lists (`AuxCapture.aux_ids_from`, in order) and captures the input
of layer id + `AuxCapture.aux_capture_offset`; without ids it captures the inputs of layers
[2, N//2, N-3]. Header-only: no heavy imports.
"""

from __future__ import annotations

EAGLE_CONFIG, TOP_LEVEL = "eagle_config", "top-level"
KEY = "eagle_aux_hidden_state_layer_ids"
# the place's convention: id k there names the input of target layer k + offset
PLACE_OFFSET = {EAGLE_CONFIG: 1, TOP_LEVEL: 0}
CONVENTION = {EAGLE_CONFIG: "SGLang's convention", TOP_LEVEL: "the convention of speculators and vLLM"}


def holder(config: dict, where: str):
    """The object that keeps the ids at `where`: the config itself, or its eagle_config (whatever
    that is: configs.DraftDims checks it is an object)."""
    return config.get("eagle_config") if where == EAGLE_CONFIG else config


def ids_at(config: dict, where: str) -> list | None:
    """The ids the config keeps at `where` (None when that place holds none)."""
    place = holder(config, where)
    ids = place.get(KEY) if isinstance(place, dict) else None
    return list(ids) if ids else None


def find(config: dict) -> tuple[list | None, str | None]:
    """The ids and where they were found, eagle_config first (None, None when neither holds any)."""
    for where in (EAGLE_CONFIG, TOP_LEVEL):
        ids = ids_at(config, where)
        if ids:
            return ids, where
    return None, None


def convert(ids, source: str, dest: str) -> list[int]:
    """The same target layers written in `dest`'s convention (e.g. top level -> eagle_config: minus 1)."""
    return [int(i) + PLACE_OFFSET[source] - PLACE_OFFSET[dest] for i in ids]


def default_layers(n_layers: int) -> tuple[int, int, int]:
    """The target layers whose input SGLang, vLLM and llama.cpp capture when a draft names none."""
    return (2, n_layers // 2, n_layers - 3)


def trained_layers(ids, where: str) -> list[int]:
    """The target layers (inputs of) that ids kept at `where` name: the top level's convention."""
    return convert(ids, where, TOP_LEVEL)


def captured_layers(config: dict, n_layers: int, read_from: tuple[str, ...], capture_offset: int) -> tuple[int, ...]:
    """Target layers whose input an engine that reads `read_from` and adds `capture_offset` captures."""
    for where in read_from:
        ids = ids_at(config, where)
        if ids:
            return tuple(int(k) + capture_offset for k in ids)
    return default_layers(n_layers)
