"""The prompts a measurement or a prediction sends: read from a .jsonl or text file, bounded, one clear
line for a file that cannot be used. The demo's prompts are the default (package data)."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import UserError
from .toolstate import DEMO

MAX_PROMPTS_BYTES = 64 << 20
DEMO_PROMPTS = DEMO / "prompts.jsonl"  # the default, from any folder (package data)


class PromptsError(UserError, ValueError):
    """A prompts file that cannot be used."""


def load_prompts(path, limit: int | None = None) -> list[str]:
    """Prompts from a .jsonl file ({"prompt": ...} or {"text": ...} per line) or a plain text file."""
    from .checkpoint import CheckpointError, open_regular

    path = Path(path)
    try:
        with open_regular(path) as f:
            raw = f.read(MAX_PROMPTS_BYTES + 1)
        if len(raw) > MAX_PROMPTS_BYTES:
            raise PromptsError(f"{path}: larger than {MAX_PROMPTS_BYTES >> 20} MB of prompts")
        lines = [line for line in raw.decode("utf-8").splitlines() if line.strip()]
    except CheckpointError as e:  # the problem, not the class's name ("(CheckpointError)" had said nothing)
        raise PromptsError(f"{path}: cannot read prompts ({e.problem})") from None
    except UnicodeDecodeError as e:
        raise PromptsError(f"{path}: cannot read prompts (not valid UTF-8 at byte {e.start})") from None
    except OSError as e:
        raise PromptsError(f"{path}: cannot read prompts ({e.strerror or e})") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if path.suffix == ".jsonl":
            try:
                item = json.loads(line)
                prompts.append(item["prompt"] if "prompt" in item else item["text"])
                if not isinstance(prompts[-1], str):
                    raise TypeError
            except (ValueError, RecursionError, KeyError, TypeError):
                raise PromptsError(f"{path}:{number}: expected a JSON object with a \"prompt\" field") from None
        else:
            prompts.append(line)
    if not prompts:
        raise PromptsError(f"{path}: no prompts")
    return prompts[:limit] if limit else prompts
