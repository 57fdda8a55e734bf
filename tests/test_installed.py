"""The kit installed as a package, not run from its checkout: the wheel built from the checkout, installed
into a fresh venv, runs inspect, check, fix, bench (reference) and the demo's investigation from another
folder, under an empty HOME, with no traceback; tool state goes to the user cache folder, nothing into the
venv or HOME.

The fresh venv gets what a user's gets: torch first (this venv's torch and what it requires, as links, on
a path line: README's `pip install torch` before the kit), then the wheel with its declared dependencies
resolved by pip, offline, from wheels of this venv's installed distributions (tests/wheelhouse.py). A
module the kit imports that the wheel does not declare is missing there, as on a user's machine (it had
reached this venv's whole site-packages through a path line, so `tokenizers`, which bench imports and
pyproject did not declare, went unnoticed); and every third-party module lib/ imports is checked against
the wheel's declared dependencies.
"""

import ast
import email
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from wheelhouse import NotInstalled, wheelhouse

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lib" / "draftdoctor"

# Modules lib/ imports that the wheel does not declare: each only in the files named (a path ending in /
# is a folder), which run where it is installed another way.
ELSEWHERE = {
    # installed first (README, make setup), never declared: pip would resolve a CUDA build
    "torch": ("",),
    # the engines' own code: a release's folder, in the real loader's child, or the engine's server process
    "sglang": ("realload/child.py", "realload/adapters/", "guard/sglang.py"),
    "vllm": ("realload/vllm_child.py", "realload/vllm_compat.py", "guard/vllm.py"),
    # llama.cpp's converter, vendored in the build (make llamacpp), and its requirements/llamacpp.txt
    "gguf": ("realload/llamacpp_child.py",),
    "conversion": ("realload/llamacpp_child.py",),
    "convert_hf_to_gguf": ("realload/llamacpp_child.py",),
    "sentencepiece": ("realload/llamacpp_child.py", "reference/demo_data.py"),
    # building the demo's data in a checkout (make demo-data: requirements/speculators.txt)
    "speculators": ("reference/demo_data.py",),
}


def third_party_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every top-level module the package's Python files import (inside functions too), less the standard
    library and the package itself: module -> the files (relative to the package) that import it."""
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "draftdoctor":
                    found.setdefault(top, set()).add(path.relative_to(package).as_posix())
    return found


def _requirements(wheel: Path) -> list[str]:
    """The wheel's own Requires-Dist, without extras' (its METADATA, as pip reads it)."""
    with zipfile.ZipFile(wheel) as z:
        [metadata] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        lines = email.message_from_bytes(z.read(metadata)).get_all("Requires-Dist") or []
    return [line for line in lines if Requirement(line).marker is None
            or Requirement(line).marker.evaluate({"extra": ""})]


def _pip_env() -> dict[str, str]:
    """pip with no configuration but the command line's: no index, no other find-links, no cache in HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    return dict(env, PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")
            if "__pycache__" not in p.parts and not p.name.endswith(".pyc")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("installed")
    source = work / "source"  # a copy: an in-tree build would write build/ and egg-info into the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "lib", source / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheels = work / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    from draftdoctor.realload.torchview import closure as torch_closure, torch_view

    (site / "torch-first.pth").write_text(f"{torch_view(work / 'torch')}\n")  # torch and what it requires, only
    wheel = next(wheels.glob("draftdoctor-*.whl"))
    requirements = _requirements(wheel)
    try:
        wheelhouse(requirements, work / "wheelhouse",
                   provided={canonicalize_name(d.metadata["Name"]) for d in torch_closure()})
    except NotInstalled as e:
        pytest.fail(f"this venv lacks what the kit's declared dependencies need, so they cannot be resolved offline: "
                    f"{e}; `make setup` installs them")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
                           "--no-index", "--find-links", str(work / "wheelhouse"), str(wheel)],
                          capture_output=True, text=True, timeout=900, env=_pip_env())
    assert done.returncode == 0, done.stderr[-3000:]
    home, cache, elsewhere = work / "home", work / "user-cache", work / "elsewhere"
    for folder in (home, cache, elsewhere):
        folder.mkdir()
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin", "HOME": str(home), "XDG_CACHE_HOME": str(cache),
           "TMPDIR": os.environ.get("TMPDIR", "/tmp"), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1"}
    before = _files(venv)

    def run(*args, timeout=600):
        return subprocess.run(["draftdoctor", *map(str, args)], capture_output=True, text=True, cwd=elsewhere,
                              env=env, timeout=timeout)
    demo = Path(subprocess.run([str(python), "-c", "from draftdoctor.toolstate import DEMO; print(DEMO)"],
                               capture_output=True, text=True, env=env, cwd=elsewhere, check=True).stdout.strip())
    return {"run": run, "venv": venv, "site": site, "home": home, "cache": cache, "elsewhere": elsewhere,
            "demo": demo, "before": before, "python": python, "requirements": requirements}


def test_every_module_the_kit_imports_is_a_declared_dependency(installed):
    """Reliability IV item 14: each third-party module lib/ imports is installed in the fresh venv by a
    distribution the wheel declares (or is one of ELSEWHERE's, imported only where that holds)."""
    imports = third_party_imports()
    strays = {module: sorted(f for f in files if not f.startswith(ELSEWHERE[module]))
              for module, files in imports.items() if module in ELSEWHERE}
    assert {m: f for m, f in strays.items() if f} == {}, "imported outside the files where it is installed"
    wanted = sorted(set(imports) - set(ELSEWHERE))
    said = subprocess.run([str(installed["python"]), "-c", "import importlib.metadata as m, json, sys; "
                           "found = m.packages_distributions(); "
                           "print(json.dumps({name: found.get(name, []) for name in json.loads(sys.argv[1])}))",
                           json.dumps(wanted)], capture_output=True, text=True, check=True, cwd=installed["elsewhere"],
                          env={"PATH": "/usr/bin:/bin", "HOME": str(installed["home"])})
    providers = json.loads(said.stdout)
    declared = {canonicalize_name(Requirement(r).name) for r in installed["requirements"]}
    undeclared = {module: providers[module] for module in wanted
                  if not {canonicalize_name(d) for d in providers[module]} & declared}
    assert undeclared == {}, f"imported by {({m: sorted(imports[m]) for m in undeclared})}, not declared"


def test_the_installed_kit_benches(installed):
    """Reliability IV item 14: `bench` counts prompt tokens with `tokenizers` and the reference server reads
    weights with `safetensors`; installed with its declared dependencies only, it measures, no traceback."""
    run, demo, out = installed["run"], installed["demo"], installed["elsewhere"]
    done = run("bench", "--backend", "reference", "--target", demo / "target", "--draft",
               f"d={demo / 'draft-story'}", "--num-prompts", 2, "--max-new-tokens", 16, "--out", out / "bench-alone")
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    assert done.returncode == 0 and (out / "bench-alone" / "results.json").is_file(), done.stderr[-3000:]


@pytest.mark.story
def test_the_installed_kit_runs_the_story_from_another_folder(installed):
    run, demo, out = installed["run"], installed["demo"], installed["elsewhere"]
    assert demo.is_relative_to(installed["site"]) and (demo / "draft-story" / "model.safetensors").is_file()

    results = {
        "inspect": run("inspect", demo / "draft-story"),
        "check": run("check", demo / "draft-story", "--engine", "sglang==0.5.10", "--target", demo / "target"),
        "fix": run("fix", demo / "draft-story", "--engine", "sglang==0.5.10", "--target", demo / "target",
                   "--out", out / "fixed"),
    }
    results["bench"] = run("bench", "--backend", "reference", "--engine", "sglang==0.5.10", "--target",
                           demo / "target", "--draft", f"before={demo / 'draft-story'}", "--draft",
                           f"after={out / 'fixed'}", "--num-prompts", 4, "--out", out / "bench")
    results["demo"] = run("demo", "--out", out / "demo")
    for name, done in results.items():
        assert "Traceback" not in done.stderr + done.stdout, (name, done.stderr[-3000:])
    assert results["inspect"].returncode == 0 and "layers.0.self_attn" in results["inspect"].stdout
    assert results["check"].returncode == 1 and "dropped-keys" in results["check"].stdout  # the story's finding
    assert results["fix"].returncode == 0, results["fix"].stderr
    assert results["bench"].returncode == 0, results["bench"].stderr
    assert (out / "bench" / "results.json").is_file()  # the default prompts are package data too
    assert results["demo"].returncode == 0, results["demo"].stderr[-3000:]
    assert f"demo data (read only): {demo}" in results["demo"].stdout
    assert (out / "demo" / "report.md").is_file() and f"report: {out / 'demo'}/report.md" in results["demo"].stdout

    assert _files(installed["venv"]) == installed["before"], "the kit wrote into its venv"
    assert not any(installed["home"].iterdir()), "the kit wrote into HOME"
    state = installed["cache"] / "draftdoctor" / "state"
    assert (state / "matplotlib").is_dir() and (state / "jupyter").is_dir()  # its tool state: the user cache


def test_the_state_variable_moves_everything(installed, tmp_path):
    """$DRAFTDOCTOR_STATE overrides the user cache folder, and `--help` names it."""
    python = installed["venv"] / "bin" / "python"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(installed["home"]), "DRAFTDOCTOR_STATE": str(tmp_path / "kit")}
    said = subprocess.run([str(python), "-c", "from draftdoctor import toolstate, realload; "
                           "print(toolstate.BUILD, toolstate.STATE, realload.releases_dir('vllm'))"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout.split()
    assert said == [str(tmp_path / "kit"), str(tmp_path / "kit" / "state"), str(tmp_path / "kit" / "vllm")]
    unset = subprocess.run([str(python), "-c", "from draftdoctor import toolstate; print(toolstate.BUILD)"],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home"},
                           cwd=tmp_path, check=True).stdout.strip()
    assert unset == "/nonexistent-home/.cache/draftdoctor"  # the platform's user cache folder
    helped = subprocess.run([str(installed["venv"] / "bin" / "draftdoctor"), "--help"], capture_output=True,
                            text=True, env=env, cwd=tmp_path)
    assert helped.returncode == 0 and "$DRAFTDOCTOR_STATE" in helped.stdout


def test_the_installed_package_carries_the_guard(installed, tmp_path):
    """vLLM finds the guard through the installed package's entry point; the launcher's start-up hook is
    package data (a folder without __init__.py), so `python -m draftdoctor.guard` works from the wheel."""
    python = installed["venv"] / "bin" / "python"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(installed["home"])}
    said = subprocess.run([str(python), "-c", "import importlib.metadata as m; from draftdoctor.guard.__main__ import "
                           "STARTUP; print([e.value for e in m.entry_points(group='vllm.general_plugins')], "
                           "(STARTUP / 'sitecustomize.py').is_file())"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout.strip()
    assert said == "['draftdoctor.guard.vllm:register'] True"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    [declared] = site.glob("draftdoctor-*.dist-info/entry_points.txt")  # the wheel's own, not the checkout's
    assert "draftdoctor_guard = draftdoctor.guard.vllm:register" in declared.read_text()
    hooked = subprocess.run([str(python), "-m", "draftdoctor.guard", "--", str(python), "-c",
                             "from draftdoctor.guard import sglang; print(sglang._STATE['installed'])"],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert hooked.stdout.strip() == "True", hooked.stderr


def test_the_venv_holds_only_what_requirements_venv_pins():
    """make setup installs under requirements/venv.txt's pins: every distribution in .venv is pinned there at
    the version installed, so a fresh machine (CI) builds this venv, not whatever PyPI published since. An
    unpinned newer transformers once brought `kernels` into CI's venv, and the SGLang releases' own
    transformers imported it and failed; this venv had never held it."""
    from importlib import metadata

    pins = {}
    for line in (ROOT / "requirements" / "venv.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = str(req.specifier)
    installed = {canonicalize_name(d.metadata["Name"]): d.version.split("+")[0] for d in metadata.distributions()}
    unpinned = {n: v for n, v in installed.items() if n not in pins and n not in {"draftdoctor", "pip", "setuptools"}}
    moved = {n: (v, pins[n]) for n, v in installed.items() if n in pins and pins[n] != f"=={v}"}
    assert not unpinned and not moved, f"not pinned: {unpinned}; pinned otherwise: {moved}"
