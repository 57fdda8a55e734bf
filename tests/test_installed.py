"""The kit installed as a package, not run from its checkout: the wheel built from the checkout, installed
into a fresh venv, runs inspect, check, fix, bench (reference) and the demo's investigation from another
folder, under an empty HOME, with no traceback; tool state goes to the user cache folder, nothing into the
venv or HOME.

The fresh venv reaches the kit's dependencies through one path line to this venv's site-packages (no
download; the editable install there is not active through it), so what runs is the wheel's draftdoctor.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
    (site / "kit-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("draftdoctor-*.whl"))
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True, timeout=600)
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
            "demo": demo, "before": before}


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
