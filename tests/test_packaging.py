"""Set-up files agree with each other: environment.yml names pyproject's dependencies."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _names(requirements):
    return {re.split(r"[<>=!~\[ ]", r.strip(), maxsplit=1)[0].lower() for r in requirements}


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | {r for reqs in project["optional-dependencies"].values() for r in reqs}
    listed = [line.strip()[2:] for line in (ROOT / "environment.yml").read_text().splitlines()
              if line.strip().startswith("- ") and not line.strip().startswith("- -e")]
    pip_section = {r for r in listed if not r.startswith(("python=", "pip", "conda"))}
    assert _names(pip_section) - {"torch"} == _names(wanted)
    assert set(pip_section) - {"torch==2.13.0"} == wanted  # same pins, too
    assert "torch==2.13.0" in pip_section
    assert "torch==2.13.0" in (ROOT / "Makefile").read_text()
