"""Set-up files agree with each other: environment.yml names pyproject's dependencies; `make test`'s two
pytest-xdist workers keep the tests that share a module's fixture together."""

import re
import subprocess
import sys
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


def test_tests_sharing_a_module_fixture_run_on_one_worker(tmp_path):
    """`make test` runs `-n 2 --dist loadgroup`; conftest.py groups a module's users of a module-scoped
    fixture (the browser tests drive one Lab, in order). A pytest or xdist that drops the groups fails here."""
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('kit_conftest', {str(ROOT / 'tests' / 'conftest.py')!r})\n"
        "kit = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(kit)\n"
        "pytest_collection_modifyitems = kit.pytest_collection_modifyitems\n")
    (tmp_path / "test_groups.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='module')\ndef shared():\n    return 1\n\n"
        "@pytest.mark.parametrize('i', range(6))\ndef test_shared(shared, i):\n    pass\n\n"
        "@pytest.mark.parametrize('i', range(6))\ndef test_alone(i):\n    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                          "-rA", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:]
    passed = [line for line in run.stdout.splitlines() if line.startswith("PASSED")]
    assert len(passed) == 12
    # the group's name is in a test's id exactly when xdist schedules it with its group
    assert all(("@test_groups" in line) == ("test_shared" in line) for line in passed), passed
