"""Shared fixtures: tiny synthetic drafts written by draftdoctor.synth into a temp folder."""

import pytest

from draftdoctor.synth import DraftShape, write_draft


@pytest.fixture
def draft(tmp_path):
    """write a synthetic draft: draft("speculators", config="flat", ...) -> folder."""
    counter = iter(range(1000))

    def make(layout="speculators", shape=DraftShape(), **kwargs):
        return write_draft(tmp_path / f"{layout}-{next(counter)}", shape, layout=layout, **kwargs)

    return make
