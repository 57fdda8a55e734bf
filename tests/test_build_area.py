"""The build area is trusted, so it is held to one rule (`toolstate.trusted`): every folder from the root
down to the one used is this user's (or root's) and no other user can write in it; else the command
refuses in one line naming the folder and its owner, before anything there is imported or run.

The attack: DRAFTDOCTOR_STATE (or an installed kit's cache folder) in a folder another local user made,
such as a shared /tmp folder of mode 0777, holding what its owner planted: a release marked installed
whose `transformers` is theirs, the torch view a pinned release's child imports torch from (its name is
predictable), IPython's startup folder the notebooks' kernels run. Each planted file, run, leaves a
marker; no command may leave one. Another user's folder needs root to make (chown); a folder of ours
that others can write in is refused as well, and is tested without root.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftdoctor import toolstate
from draftdoctor.toolstate import UntrustedFolder, trusted

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
CLI = Path(sys.executable).with_name("draftdoctor")
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making another user's folder needs root (chown)")
EVIL_CODE = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


def _plant(state: Path, markers: Path) -> None:
    """What another user leaves in a build area they made: code where each kind of use would run it."""
    def code(path: Path, name: str):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(EVIL_CODE.format(marker=str(markers / name)))

    release = state / "sglang" / "0.5.10"
    code(release / "transformers" / "__init__.py", "release")
    code(release / "sglang" / "__init__.py", "release-sglang")
    (release / ".installed").touch()
    from draftdoctor.realload.torchview import torch_view

    view = state / "state" / torch_view(markers.parent / "views").name  # the name a child would look for
    code(view / "torch" / "__init__.py", "torch-view")
    code(state / "state" / "ipython" / "profile_default" / "startup" / "00-evil.py", "ipython")
    code(state / "state" / "jupyter" / "config" / "jupyter_server_config.py", "jupyter")
    code(state / "llamacpp" / "src" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py",
         "llamacpp")


def _env(state: Path, home: Path, **more) -> dict:
    """The environment of a user whose build area is `state`: the tool folders the test session set for
    itself are left out, so the command chooses them under `state` as it would for that user."""
    names = {var for var, _ in toolstate.KIT_TOOLS + toolstate.CACHES}
    env = {k: v for k, v in os.environ.items() if k not in names and not k.startswith("DRAFTDOCTOR_")}
    return env | {"DRAFTDOCTOR_STATE": str(state), "HOME": str(home), "DRAFTDOCTOR_TEST_SESSION":
                  os.environ["DRAFTDOCTOR_TEST_SESSION"]} | more


@pytest.fixture
def shared(tmp_path):
    """A build area another user made (uid 65534, mode 0777) with code planted in it."""
    markers, home = tmp_path / "markers", tmp_path / "home"
    markers.mkdir()
    home.mkdir()
    state = tmp_path / "shared"
    _plant(state, markers)
    for folder, _, files in os.walk(state):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            os.chown(name, NOBODY, NOBODY)
    state.chmod(0o777)
    return state, markers, home


def _commands(tmp_path):
    out = str(tmp_path / "out")
    draft, target = str(DEMO / "draft-story"), str(DEMO / "target")
    return {
        "check": ["check", draft, "--engine", "sglang==0.5.10"],
        "check --loader real": ["check", draft, "--engine", "sglang==0.5.10", "--loader", "real"],
        "inspect": ["inspect", draft],
        "fix": ["fix", draft, "--engine", "sglang==0.5.10", "--out", out],
        "compare": ["compare", draft, draft],
        "bench": ["bench", "--target", target, "--draft", f"before={draft}", "--out", out, "--num-prompts", "1"],
        "serve": ["serve", "--model-path", target, "--speculative-draft-model-path", draft, "--dry-run"],
        "investigate": ["investigate", "--params", str(DEMO / "investigate.yaml"), "--out", out],
        "demo": ["demo", "--out", out],
        "loaders list": ["loaders", "list"],
        "loaders install": ["loaders", "install", "sglang==0.5.10"],
    }


@as_root
@pytest.mark.parametrize("command", list(_commands(Path("/"))))
def test_every_command_refuses_a_build_area_another_user_made(shared, tmp_path, command):
    state, markers, home = shared
    argv = _commands(tmp_path)[command]
    done = subprocess.run([str(CLI), *argv], capture_output=True, text=True, timeout=120, env=_env(state, home))
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"draftdoctor: error: {state}: owned by nobody (uid {NOBODY}), not by you"), lines[0]
    assert "DRAFTDOCTOR_STATE" in lines[0]
    assert not list(markers.iterdir()), f"planted code ran: {[m.name for m in markers.iterdir()]}"
    assert not (tmp_path / "out").exists() and not list(home.iterdir())


@as_root
def test_a_release_folder_named_by_its_variable_is_held_to_the_rule(shared, tmp_path):
    """DRAFTDOCTOR_SGLANG_DIR naming another user's folder: the release there is never imported, and the
    line names that variable; the planted torch view is not reached either, with a build area of our own."""
    state, markers, home = shared
    own = tmp_path / "own-state"
    done = subprocess.run([str(CLI), "check", str(DEMO / "draft-story"), "--engine", "sglang==0.5.10",
                           "--loader", "real"], capture_output=True, text=True, timeout=120,
                          env=_env(own, home, DRAFTDOCTOR_SGLANG_DIR=str(state / "sglang")))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{state}: owned by nobody (uid {NOBODY})" in done.stderr and "DRAFTDOCTOR_SGLANG_DIR" in done.stderr
    assert not list(markers.iterdir())


@as_root
def test_the_library_refuses_too(shared, monkeypatch):
    """A notebook calls the library, not the CLI: the release folder, the torch view's folder and the
    kernels' IPython folder are checked where they are used."""
    from draftdoctor import investigate, realload
    from draftdoctor.realload import childenv

    state, markers, _ = shared
    monkeypatch.setenv("DRAFTDOCTOR_SGLANG_DIR", str(state / "sglang"))
    with pytest.raises(UntrustedFolder, match="owned by nobody"):
        realload.release_env("0.5.10")
    with pytest.raises(UntrustedFolder, match="owned by nobody"):
        realload.installed_releases("sglang")
    monkeypatch.setattr(childenv, "STATE", state / "state")
    with pytest.raises(UntrustedFolder, match="owned by nobody"):
        childenv._child("sglang", "0.5.10", [], folder=DEMO)  # the torch view a pinned release's child imports
    monkeypatch.setenv("IPYTHONDIR", str(state / "state" / "ipython"))
    with pytest.raises(UntrustedFolder, match="IPYTHONDIR"):
        investigate.investigate_one({"name": "x", "checkpoint": str(DEMO / "draft-story")}, state.parent / "out")
    assert not list(markers.iterdir())


def test_a_build_area_others_can_write_in_is_refused(tmp_path):
    """Without root: a build area of ours that anyone may write in could hold anyone's code."""
    state, home = tmp_path / "state", tmp_path / "home"
    state.mkdir()
    home.mkdir()
    state.chmod(0o777)
    done = subprocess.run([str(CLI), "check", str(DEMO / "draft-story"), "--engine", "sglang==0.5.10"],
                          capture_output=True, text=True, timeout=120, env=_env(state, home))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"{state}: writable by other users (mode drwxrwxrwx)" in done.stderr
    assert list(state.iterdir()) == [], "nothing is made in it"


def test_the_rule(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o755)
    assert trusted(ours / "not" / "made" / "yet") == ours / "not" / "made" / "yet"  # parts not made: not judged
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: others may add names, not replace ours
    (sticky / "mine").mkdir(mode=0o700)
    assert trusted(sticky / "mine")
    with pytest.raises(UntrustedFolder, match="writable by other users"):
        trusted(sticky)  # the folder used itself may not be
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o757)
    (loose / "inner").mkdir()
    with pytest.raises(UntrustedFolder, match=f"{loose}: writable by other users"):
        trusted(loose / "inner")  # a folder above, without the sticky bit: ours could be replaced
    (tmp_path / "link").symlink_to(loose / "inner")
    with pytest.raises(UntrustedFolder, match=f"{loose}: writable"):
        trusted(tmp_path / "link")  # judged where the link leads, too


@as_root
def test_the_rule_for_other_users(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UntrustedFolder, match=f"{theirs}: owned by nobody \\(uid {NOBODY}\\), not by you"):
        trusted(theirs / "state")
    ours = tmp_path / "ours"
    ours.mkdir()
    link = tmp_path / "sticky"
    link.mkdir(mode=0o755)
    link.chmod(0o1777)
    (link / "state").symlink_to(ours)
    os.lchown(link / "state", NOBODY, NOBODY)  # another user's link to our folder: they may point it elsewhere
    with pytest.raises(UntrustedFolder, match="owned by nobody"):
        trusted(link / "state")
    group = tmp_path / "group"
    group.mkdir()
    os.chown(group, 0, NOBODY)
    group.chmod(0o775)
    with pytest.raises(UntrustedFolder, match="writable by other users"):
        trusted(group)
