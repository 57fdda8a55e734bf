"""The one rename type: how a loader (or a converter, or `fix`) turns one tensor name into another.

In the style of vLLM's `WeightsMapper`: ordered steps, each a substring or a prefix map, and a step
whose new name is None drops the key (vLLM maps `t2d` to None; SGLang `continue`s past it). Engine
rows use it for the renames their `load_weights` applies before it looks a name up (SGLang's
`midlayer` -> `layers.0`, llama.cpp's converter's GGUF names), and `draftdoctor.renames` for the
renames `fix` chooses between.
"""

from __future__ import annotations

from dataclasses import dataclass

SUBSTR, PREFIX = "substr", "prefix"


@dataclass(frozen=True)
class WeightsMapper:
    """Renames as data: `steps` of (where, old, new), where "substr" (every occurrence) or "prefix" (only at
    the start), applied in order to the evolving name; new None drops a name holding `old` there."""

    description: str = ""
    steps: tuple[tuple[str, str, str | None], ...] = ()

    @classmethod
    def of(cls, description: str = "", substr=(), prefix=(), drop=()) -> "WeightsMapper":
        """vLLM's spelling: substring maps, then prefix maps, then substrings whose keys are dropped."""
        return cls(description, (*((SUBSTR, old, new) for old, new in substr),
                                 *((PREFIX, old, new) for old, new in prefix),
                                 *((SUBSTR, old, None) for old in drop)))

    def apply(self, name: str) -> tuple[str, str | None]:
        """(the renamed name, the `old` of the first drop step it met, None when it met none)."""
        dropped = None
        for where, old, new in self.steps:
            hit = name.startswith(old) if where == PREFIX else old in name
            if not hit:
                continue
            if new is None:
                dropped = dropped or old
            elif where == PREFIX:
                name = new + name[len(old):]
            else:
                name = name.replace(old, new)
        return name, dropped

    def map(self, name: str) -> str | None:
        """The new name, None when a step drops it."""
        name, dropped = self.apply(name)
        return None if dropped else name

    @property
    def drops(self) -> tuple[str, ...]:
        """The substrings whose keys are dropped, in order."""
        return tuple(old for _, old, new in self.steps if new is None)

    def drops_only(self) -> "WeightsMapper":
        """The same drops without the renames (`fix` asks how a release loads a name natively)."""
        return WeightsMapper(f"{self.description}, drops only", tuple(s for s in self.steps if s[2] is None))

    def __add__(self, other: "WeightsMapper") -> "WeightsMapper":
        """This mapper, then `other`."""
        return WeightsMapper(f"{self.description}, then {other.description}", self.steps + other.steps)
