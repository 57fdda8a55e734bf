"""What the kit's own processes load on first use where a library would load it at import.

`nbformat` imports `jsonschema`, whose format checkers import `rfc3987_syntax` when it is installed (it
is: Jupyter's event schemas want it), and that module builds a parser grammar at import: 1.6 s of every
process that reads or runs a notebook (investigate, the tests), for a format no notebook schema uses
(nbformat validates without a format checker). `defer_iri_grammar` puts a stand-in in its place whose
one function, `is_valid_syntax`, imports the real module on its first call and asks it: jsonschema
registers the same checker, and an IRI checked through it gets the real module's answer.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

GRAMMAR_MODULE = "rfc3987_syntax"


def defer_iri_grammar() -> None:
    """Install the stand-in (see the module's text), unless the real module is loaded or not installed."""
    if GRAMMAR_MODULE in sys.modules or importlib.util.find_spec(GRAMMAR_MODULE) is None:
        return
    stand_in = types.ModuleType(GRAMMAR_MODULE)
    stand_in.__doc__ = "draftdoctor.lazy's stand-in: the real module is imported on the first check"

    def is_valid_syntax(*args, **kwargs):
        if sys.modules.get(GRAMMAR_MODULE) is stand_in:
            del sys.modules[GRAMMAR_MODULE]
        return importlib.import_module(GRAMMAR_MODULE).is_valid_syntax(*args, **kwargs)

    stand_in.is_valid_syntax = is_valid_syntax
    sys.modules[GRAMMAR_MODULE] = stand_in
