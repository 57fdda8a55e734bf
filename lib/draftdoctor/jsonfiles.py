"""The small JSON files a checkpoint carries (config.json, an index) and the kit's own (--params):
read bounded (a regular file, at most MAX_JSON_BYTES), parsed with deep nesting and huge integers
caught, and refused in one `CheckpointError` naming the file and the problem. A config's naming
fields are checked here, where every config is read, before any engine row takes them for names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .headers import CheckpointError, open_regular, orjson

CONFIG_NAME = "config.json"
MAX_JSON_BYTES = 16 << 20  # config.json, an index, --params: far above any real one, far below a memory's worth

def read_json_file(path: Path, object_pairs_hook=None):
    """The JSON value in a small regular file, or CheckpointError naming the file and the problem
    (too large, not UTF-8, not JSON, nested or numbered past what the parser takes)."""
    try:
        with open_regular(path) as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointError(path, "no such file") from None
    except IsADirectoryError:
        raise CheckpointError(path, "is a directory, expected a JSON file") from None
    except OSError as e:
        raise CheckpointError(path, e.strerror or str(e)) from None
    if len(raw) > MAX_JSON_BYTES:
        raise CheckpointError(path, f"larger than {MAX_JSON_BYTES >> 20} MB; not a config")
    return parse_json(path, raw, object_pairs_hook)


def parse_json(path: Path, raw: bytes, object_pairs_hook=None):
    """`raw` parsed as JSON, or CheckpointError naming `path` and the problem."""
    if object_pairs_hook is None and orjson:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # the standard parser below names the problem
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=object_pairs_hook)
    except UnicodeDecodeError as e:
        raise CheckpointError(path, f"not valid UTF-8 (byte {e.start})") from None
    except RecursionError:
        raise CheckpointError(path, "not valid JSON (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, and integers of more than 4300 digits
        raise CheckpointError(path, f"not valid JSON ({e})") from None


def read_config(folder: Path) -> dict | None:
    """config.json of a checkpoint folder, or None when there is none."""
    path = Path(folder) / CONFIG_NAME
    if not os.path.exists(path):  # a FIFO or folder named config.json is an error, not "no config"
        return None
    config = read_json_file(path)
    if not isinstance(config, dict):
        raise CheckpointError(path, "config is not a JSON object")
    why = _names_problem(config)
    if why:
        raise CheckpointError(path, why)
    return config


def _names_problem(config: dict) -> str | None:
    """What is wrong with the fields that say what a config is, which every reader of it (the engines,
    transformers, each check) takes for names: `architectures` a list of class names, each `model_type`
    (and speculators' `speculators_model_type`) a name, also inside `transformer_layer_config`."""
    architectures = config.get("architectures")
    if architectures is not None and not (isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)):
        return f"architectures must be a list of class names, not {json.dumps(architectures)[:80]}"
    layer = config.get("transformer_layer_config")
    for holder, where in ((config, ""), (layer if isinstance(layer, dict) else {}, "transformer_layer_config.")):
        for name in ("model_type", "speculators_model_type"):
            if holder.get(name) is not None and not isinstance(holder[name], str):
                return f"{where}{name} must be a name, not {json.dumps(holder[name])[:80]}"
    return None
