"""A generated toy language for the demo target: templated sentences with strong regularities.

Counting, weekday/month sequences, fixed facts (capitals, animal sounds) and little stories that
repeat their own names and colours. Greedy continuations are predictable from context (copying,
counting) but not trivial, which is what a draft needs to reach a high accept length.
"""

from __future__ import annotations

import random

NUMBERS = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
           "fifteen sixteen seventeen eighteen nineteen twenty").split()
DAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
MONTHS = ("january february march april may june july august september october november "
          "december").split()
NAMES = "tom anna ben lucy max nora sam eva leo mia".split()
ANIMALS = dict(cat="meow", dog="woof", bird="tweet", cow="moo", sheep="baa", duck="quack",
               frog="croak", bear="growl", horse="neigh", owl="hoot")
COLORS = "red blue green yellow black white brown pink".split()
CAPITALS = dict(france="paris", spain="madrid", italy="rome", japan="tokyo", egypt="cairo",
                peru="lima", kenya="nairobi", chile="santiago")
FUNCTION_WORDS = ("the a is are has likes says of after count from to and : . capital days "
                  "months").split()
SPECIALS = ("<unk>", "<s>", "</s>")


def vocabulary() -> list[str]:
    """Every word the generator can emit, specials first, in a fixed order."""
    words = (NUMBERS + DAYS + MONTHS + NAMES + list(ANIMALS) + list(ANIMALS.values()) + COLORS
             + list(CAPITALS) + list(CAPITALS.values()) + FUNCTION_WORDS)
    assert len(set(words)) == len(words), "duplicate word in the toy vocabulary"
    return list(SPECIALS) + words


def _cycle(seq: list[str], start: int, n: int) -> list[str]:
    return [seq[(start + i) % len(seq)] for i in range(n)]


def sentence(rng: random.Random) -> list[str]:
    """One random sentence of the toy language."""
    kind = rng.randrange(6)
    if kind == 0:
        a = rng.randrange(0, 14)
        b = a + rng.randrange(2, 7)
        return ["count", "from", NUMBERS[a], "to", NUMBERS[b], ":", *NUMBERS[a:b + 1], "."]
    if kind == 1:
        d = rng.randrange(7)
        return ["the", "days", "after", DAYS[d], "are", *_cycle(DAYS, d + 1, 3), "."]
    if kind == 2:
        m = rng.randrange(12)
        return ["the", "months", "after", MONTHS[m], "are", *_cycle(MONTHS, m + 1, 3), "."]
    if kind == 3:
        country = rng.choice(list(CAPITALS))
        return ["the", "capital", "of", country, "is", CAPITALS[country], "."]
    if kind == 4:
        animal = rng.choice(list(ANIMALS))
        return ["the", animal, "says", ANIMALS[animal], "."]
    name, color, animal = rng.choice(NAMES), rng.choice(COLORS), rng.choice(list(ANIMALS))
    return [name, "has", "a", color, animal, ".", "the", animal, "is", color, ".",
            name, "likes", "the", color, animal, ".", "the", animal, "says", ANIMALS[animal], "."]


def document(rng: random.Random, n_sentences: int) -> list[str]:
    return ["<s>"] + [w for _ in range(n_sentences) for w in sentence(rng)] + ["</s>"]


def prompts(rng: random.Random, n: int) -> list[str]:
    """Prompts that stop inside a sentence, so the continuation depends on the prompt."""
    out = []
    while len(out) < n:
        words = sentence(rng)
        cut = rng.randrange(3, len(words) - 1)
        lead = [w for _ in range(rng.randrange(0, 2)) for w in sentence(rng)]
        text = " ".join(lead + words[:cut])
        if text not in out:
            out.append(text)
    return out
