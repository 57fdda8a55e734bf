"""Shared fixtures: tiny synthetic drafts written by draftdoctor.synth into a temp folder.

Tool state (Jupyter, IPython, matplotlib, HF caches) goes to build/state, never the home directory,
also when pytest is run without make.
"""

import os
from pathlib import Path

import pytest

STATE = Path(__file__).resolve().parents[1] / "build" / "state"
for var, sub in (("JUPYTER_CONFIG_DIR", "jupyter/config"), ("JUPYTER_DATA_DIR", "jupyter/data"),
                 ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"), ("IPYTHONDIR", "ipython"),
                 ("MPLCONFIGDIR", "matplotlib"), ("HF_HOME", "hf"), ("XDG_CACHE_HOME", "cache")):
    os.environ.setdefault(var, str(STATE / sub))
    Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from draftdoctor.synth import DraftShape, write_draft


@pytest.fixture
def draft(tmp_path):
    """write a synthetic draft: draft("speculators", config="flat", ...) -> folder."""
    counter = iter(range(1000))

    def make(layout="speculators", shape=DraftShape(), **kwargs):
        return write_draft(tmp_path / f"{layout}-{next(counter)}", shape, layout=layout, **kwargs)

    return make


def require_release(release: str) -> None:
    """Skip unless SGLang `release` is installed for the real loader; in CI its absence is a failure."""
    from draftdoctor.realload import ReleaseNotInstalled, release_env

    try:
        release_env(release)
    except ReleaseNotInstalled as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must install the real loaders: {exc}")
        pytest.skip(str(exc))
