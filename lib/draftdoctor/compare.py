"""Compare two checkpoints: which tensors differ and how, and whether their configs mean the same.

Typical pairs: the training output against the copy a converter wrote (did the values survive?), a
draft against its target (is the embedding the target's?). Tensors are paired, in order:

1. by name, once both sides' names are read the way the engines' rename rules read them (`model.`
   stripped, `midlayer.` as `layers.0.`: `renames.py`'s mappers). Names the rules read as one (a side
   holding both `layers.0.X` and `midlayer.X`) are a *name collision*: every one of them is kept, paired
   within its group (the same bytes first, then the same name) and reported, none silently dropped;
2. by parts: a fused `qkv_proj`/`gate_up_proj` on one side against its q/k/v or gate/up parts on
   the other (the engines' own stacking, `engines.STACKED`), the parts' bytes taken in order;
3. by content: a tensor left unpaired is paired with one of the other side holding the same bytes,
   whatever either is called (a renamed or moved tensor).

Each pair is one of `STATUSES`: same bytes (dtype and shape too: identical); same values in another
dtype; same values in another shape; different values, with how they differ (`relations.py`: the same
bytes read as another dtype, non-finite values introduced, rounded to another dtype, scaled by k,
transposed, rows permuted, unrelated or a fresh initialisation, else the numbers); a name collision;
only in A; only in B. Only identical tensors are the same: the same bytes under another dtype or
shape are a difference. The configs are compared by meaning (`meanings.py`).

Reads stay bounded. A pair's bytes are compared as read, a chunk of each side at a time (as `cmp`
does); a pair whose bytes differ is read again by value, in chunks (differences, the sums behind the
correlation and the scale, non-finite counts), then sampled (`SAMPLE_VALUES` per side: a contiguous
block of rows and runs of random rows) for what needs positions (rounding, transposition, noise);
rows are hashed, in chunks, only for a pair whose sums allow a permutation; of the tensors left
unpaired by name, only those of a size the other side also has are hashed. numpy only.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field

from .checkpoint import open_checkpoint
from .engines.profile import STACKED
from .frames import frame
from .engines import resolve_engine
from .meanings import ConfigComparison, compare_configs, target_layers
from .renames import MIDLAYER_TO_LAYERS, STRIP_MODEL
from .tensorbytes import _dtype, _Reader, _shape
from .tensordiff import COLLISION, ONLY_A, ONLY_B, SAME_BYTES, STATUSES, Pair, _judge

CANONICAL = STRIP_MODEL + MIDLAYER_TO_LAYERS  # names as every engine's rename rules read them


@dataclass
class Comparison:
    """Every tensor of A and B, paired (or not), how each pair compares, and the configs by meaning."""

    a: str
    b: str
    pairs: list[Pair] = field(default_factory=list)
    configs: ConfigComparison = field(default_factory=ConfigComparison)

    @property
    def same_tensors(self) -> bool:
        """Whether every tensor of each side has a partner with the same bytes, dtype and shape."""
        return all(p.status == SAME_BYTES for p in self.pairs)

    @property
    def same(self) -> bool:
        """Identical tensors, and configs that mean the same (or were not compared)."""
        return self.same_tensors and self.configs.same is not False

    def counts(self) -> dict[str, int]:
        return {s: sum(p.status == s for p in self.pairs) for s in STATUSES}

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "same": self.same, "same_tensors": self.same_tensors, "counts": self.counts(),
                "pairs": [asdict(p) for p in self.pairs], "configs": self.configs.to_dict()}

    def frame(self):
        return frame([asdict(p) for p in self.pairs])


def _fused_groups(names: dict[str, list]) -> dict[str, list[str]]:
    """{fused canonical name: its parts' canonical names, in stacking order} for parts present here."""
    groups: dict[str, list[tuple[object, str]]] = {}
    for name in names:
        for part, fused, shard in STACKED:
            marker = part + "."
            if marker in name:
                groups.setdefault(name.replace(marker, fused + ".", 1), []).append((shard, name))
    order = {}
    for part, fused, shard in STACKED:
        order.setdefault(fused, []).append(shard)
    out = {}
    for fused_name, found in groups.items():
        fused = next(f for _, f, _ in STACKED if f + "." in fused_name)
        if len(found) == len(order[fused]):
            out[fused_name] = [n for _, n in sorted(found, key=lambda item: order[fused].index(item[0]))]
    return out


def _groups(tensors: dict) -> dict[str, list]:
    """{canonical name: the tensors whose names the rename rules read as it}."""
    groups: dict[str, list] = {}
    for name, t in tensors.items():
        groups.setdefault(CANONICAL.map(name), []).append(t)
    return groups


def _pair_group(reader: _Reader, mine: list, theirs: list):
    """Pairs within one colliding name group: the same bytes first, then the same name, then the last
    one of each side; returns (pairs, A's left, B's left)."""
    mine, theirs, pairs = list(mine), list(theirs), []
    for same in (lambda t, u: t.nbytes == u.nbytes and reader.same_bytes([t], [u]), lambda t, u: t.name == u.name):
        for t in list(mine):
            match = next((u for u in theirs if same(t, u)), None)
            if match is not None:
                pairs.append(([t], [match], "name"))
                mine.remove(t)
                theirs.remove(match)
    if len(mine) == 1 and len(theirs) == 1:
        pairs.append(([mine.pop()], [theirs.pop()], "name"))
    return pairs, mine, theirs


def _by_content(reader: _Reader, rest_a: list, rest_b: list):
    """Pairs of leftovers holding the same bytes; only sizes both sides have are hashed."""
    sizes_a = {sum(t.nbytes for t in parts) for parts in rest_a}
    digests_b: dict[str, list[int]] = {}
    for j, parts in enumerate(rest_b):
        if sum(t.nbytes for t in parts) in sizes_a:
            digests_b.setdefault(reader.digest(parts), []).append(j)
    sizes_b = {sum(t.nbytes for t in rest_b[j]) for js in digests_b.values() for j in js}
    pairs, left_a, used = [], [], set()
    for parts in rest_a:
        found = digests_b.get(reader.digest(parts)) if sum(t.nbytes for t in parts) in sizes_b else None
        if found:
            j = found.pop(0)
            used.add(j)
            pairs.append((parts, rest_b[j], "content"))
        else:
            left_a.append(parts)
    return pairs, left_a, [parts for j, parts in enumerate(rest_b) if j not in used]


def _mark_collisions(pairs: list[Pair], groups_a: dict, groups_b: dict, colliding: set) -> None:
    """Name every pair one of whose tensors shares its canonical name with another on its side; a
    collision that is not the same on both sides (the same names) is the pair's status."""
    names = {side: {t.name: c for c, ts in groups.items() if c in colliding for t in ts}
             for side, groups in (("A", groups_a), ("B", groups_b))}
    for pair in pairs:
        c = names["A"].get(pair.a) or names["B"].get(pair.b)
        if c is None:
            continue
        held = {side: sorted(t.name for t in groups.get(c, ())) for side, groups in (("A", groups_a), ("B", groups_b))}
        pair.collision = "; ".join(f"{side} holds {', '.join(ns)}" for side, ns in held.items() if len(ns) > 1) \
            + f" (one name to the engines' rename rules: {c})"
        if held["A"] != held["B"]:
            was = pair.status if pair.status not in (ONLY_A, ONLY_B) else f"no partner in {'B' if pair.b is None else 'A'}"
            pair.detail = f"{was}; {pair.detail}" if pair.detail else was
            pair.status = COLLISION


def _tensor_pairs(ca, cb) -> list[Pair]:
    groups_a, groups_b = _groups(ca.tensors), _groups(cb.tensors)
    colliding = {c for groups in (groups_a, groups_b) for c, ts in groups.items() if len(ts) > 1}
    side_a = {c: ts for c, ts in groups_a.items() if c not in colliding}
    side_b = {c: ts for c, ts in groups_b.items() if c not in colliding}
    reader = _Reader()
    try:
        found: list[tuple[list, list, str]] = []
        loose_a, loose_b = [], []
        for c in dict.fromkeys([*groups_a, *groups_b]):
            if c in colliding:
                within, left_a, left_b = _pair_group(reader, groups_a.get(c, []), groups_b.get(c, []))
                found += within
                loose_a += [[t] for t in left_a]
                loose_b += [[t] for t in left_b]
        for name in [n for n in side_a if n in side_b]:
            found.append((side_a.pop(name), side_b.pop(name), "name"))
        for mine, theirs, flip in ((side_a, side_b, False), (side_b, side_a, True)):
            for fused, parts in _fused_groups(mine).items():
                if fused in theirs and all(p in mine for p in parts):
                    joined = [mine.pop(p)[0] for p in parts]
                    other = theirs.pop(fused)
                    found.append((other, joined, "parts") if flip else (joined, other, "parts"))
        moved, left_a, left_b = _by_content(reader, [*side_a.values(), *loose_a], [*side_b.values(), *loose_b])
        found += moved
        pairs = []
        for a_parts, b_parts, how in found:
            pair = Pair("", "+".join(t.name for t in a_parts), "+".join(t.name for t in b_parts), how,
                        _dtype(a_parts), _dtype(b_parts), _shape(a_parts), _shape(b_parts))
            seed = zlib.crc32(f"{pair.a}\0{pair.b}".encode())
            _judge(reader, a_parts, b_parts, pair, how == "content" or reader.same_bytes(a_parts, b_parts), seed)
            pairs.append(pair)
        pairs += [Pair(ONLY_A, t.name, None, "", t.dtype, None, tuple(t.shape)) for [t] in left_a]
        pairs += [Pair(ONLY_B, None, t.name, "", None, t.dtype, None, tuple(t.shape)) for [t] in left_b]
    finally:
        reader.close()
    _mark_collisions(pairs, groups_a, groups_b, colliding)
    return pairs


def compare(a, b, engines=None, target=None) -> Comparison:
    """Pair every tensor of checkpoint `a` with one of `b` (see the module docstring), say how each
    pair compares, and compare the configs by meaning on `engines` (EngineRelease values or specs such as
    "sglang==0.5.10": an edge, which a notebook calls with them; default: every release whose engine reads both) for the target model at
    `target` (its folder or config.json; None: its layer count unknown). Raises CheckpointError for
    a path that is not a readable checkpoint, or a target without a layer count."""
    engines = None if engines is None else [resolve_engine(e) for e in engines]
    n_layers = None if target is None else target_layers(target)
    ca, cb = open_checkpoint(a), open_checkpoint(b)
    configs = compare_configs(ca, cb, engines, n_layers)
    return Comparison(str(a), str(b), _tensor_pairs(ca, cb), configs)
