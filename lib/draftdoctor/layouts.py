"""Producer layouts: which tool wrote a draft checkpoint, told from its keys and config.

docs/engine-facts.md, "Config formats": speculators saves the decoder layer as `layers.N.*` and a nested config; the original
EAGLE-3 repo and SpecForge save it as `midlayer.*` with a flat config; some exports prefix every
key with `model.` (as an engine's own parameter names are). Detection returns the evidence it used,
so a user can see why the kit thinks what it thinks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import repeat

from .beginnings import each_beginning
from .configs import FLAT, SPECULATORS, config_format

SPECULATORS_LAYOUT = "speculators"
MIDLAYER_LAYOUT = "midlayer"  # original EAGLE-3 repo and SpecForge
PREFIXED_LAYOUT = "prefixed"  # keys already carry an engine's `model.` prefix
UNKNOWN_LAYOUT = "unknown"

LAYER_HEAD = re.compile(r"(?:model\.)?(?:layers\.(\d+)|midlayer)\.")  # 'layers.3.', 'model.midlayer.', ...
DRAFT_MARKERS = ("fc.weight", "d2t", "t2d")

# Keys a producer saves for training only; no engine has a parameter for them.
TRAINING_ONLY_KEYS = (re.compile(r"^(?:model\.)?verifier_norm\."),)


@dataclass(frozen=True)
class Layout:
    """A detected producer layout and the facts that gave it away."""

    name: str
    evidence: tuple[str, ...]
    layer_prefixes: tuple[str, ...]  # e.g. ("layers.0.",) or ("midlayer.",) or ("model.midlayer.",)

    @property
    def num_layers(self) -> int:
        return len(self.layer_prefixes)


def layer_prefixes(keys) -> tuple[str, ...]:
    """The distinct decoder-layer prefixes among `keys`, in layer order (`midlayer.` first), prefixes of
    one layer in text order (not the set's, which changes with the process's string hashing)."""
    heads = each_beginning(list(keys), _head) - {None}  # once per distinct beginning: 10^5 keys in a target
    return tuple(sorted(heads, key=lambda head: (int(LAYER_HEAD.match(head).group(1) or -1), head)))


def _head(key: str) -> str | None:
    """A key's decoder-layer prefix, if it has one (reads no further than its third dot)."""
    m = LAYER_HEAD.match(key)
    return m[0] if m else None


def detect_layout(keys, config: dict | None) -> Layout:
    """Tell the producer layout from tensor names and config.json."""
    keys = list(keys)
    prefixes = layer_prefixes(keys)
    evidence = []
    fmt = config_format(config)
    is_draft = any(map(str.endswith, keys, repeat(DRAFT_MARKERS)))
    n_prefixed = sum(map(str.startswith, keys, repeat("model.")))
    prefixed = bool(keys) and n_prefixed > len(keys) // 2
    if prefixed:
        evidence.append(f"{n_prefixed} of {len(keys)} keys start with 'model.'")
        name = PREFIXED_LAYOUT
    elif any(p.startswith("layers.") for p in prefixes):
        evidence.append(f"decoder layer keys under {', '.join(repr(p) for p in prefixes)}")
        name = SPECULATORS_LAYOUT
    elif "midlayer." in prefixes:
        evidence.append("decoder layer keys under 'midlayer.'")
        name = MIDLAYER_LAYOUT
    else:
        evidence.append("no decoder-layer keys ('layers.N.' or 'midlayer.') found")
        name = UNKNOWN_LAYOUT
    if fmt == SPECULATORS:
        evidence.append("config.json is speculators' nested format (speculators_model_type)")
        if name == UNKNOWN_LAYOUT:
            name = SPECULATORS_LAYOUT
    elif fmt == FLAT:
        arch = (config or {}).get("architectures") or []
        evidence.append(f"config.json is a flat config (architectures {arch})")
    else:
        evidence.append(f"config.json: {fmt}")
    if name == SPECULATORS_LAYOUT and "embed_tokens.weight" in keys:
        evidence.append("embed_tokens.weight is saved (speculators saves it; EAGLE/SpecForge do not)")
    if not is_draft:
        evidence.append("no fc.weight / d2t / t2d: this may not be an EAGLE-3 draft")
    return Layout(name=name, evidence=tuple(evidence), layer_prefixes=prefixes)


def is_training_only(key: str) -> bool:
    return any(p.match(key) for p in TRAINING_ONLY_KEYS)
