"""Reliability III, items 1-3: a checkpoint never runs code, another local user cannot forge a real
loader's verdict, and nothing the kit starts listens beyond loopback.

1. A draft or target folder can carry code: a tokenizer_config.json whose `auto_map` names a `.py`
   beside the weights (llama.cpp's converter loads tokenizers with `trust_remote_code=True`), or a
   file named like a module (`json.py`) that `python -m` would import when started in that folder.
   No loader, converter or tokenizer the kit runs executes either (`realload.nocode`, PYTHONSAFEPATH).
2. The warm workers' folder may be a predictable one in /tmp (a long checkout path): one another
   user made first, or a link planted there, is never used (the check runs cold); a socket answered
   by another user's process is never believed (SO_PEERCRED); links at the lock or pid paths are not
   followed; folders or links at the worker's own paths are cleared, not a traceback.
3. The real loaders' workers listen on nothing but loopback (the gloo group's store is a file).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import require_release

from draftdoctor import listeners, realload
from draftdoctor.realload import pool

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
CLI = Path(sys.executable).with_name("draftdoctor")  # the console script: its own folder on sys.path, not ours
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

# What a hostile folder carries: each file, run, leaves a marker named after it.
EVIL_CODE = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


def hostile(folder: Path, markers: Path) -> Path:
    """Add code to a model folder: a tokenizer that needs its own class (auto_map), its config naming
    code too, and `json.py` for a process started in the folder to import."""
    tokenizer = json.loads((DEMO / "target" / "tokenizer_config.json").read_text())
    # the one tokenizer class llama.cpp's converter loads with trust_remote_code=True for a Llama model
    tokenizer.update(tokenizer_class="HybridDNATokenizer",
                     auto_map={"AutoTokenizer": ["tokenization_evil.HybridDNATokenizer", None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    if not (folder / "tokenizer.json").exists():
        shutil.copy(DEMO / "target" / "tokenizer.json", folder / "tokenizer.json")
    for module in ("tokenization_evil", "configuration_evil", "json", "typing_extensions"):
        (folder / f"{module}.py").write_text(EVIL_CODE.format(marker=str(markers / module)))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _run(argv, cwd, home, timeout=600, **env):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, HOME=str(home), **env))


@pytest.fixture
def evil(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    draft = hostile(Path(shutil.copytree(DEMO / "draft-story", tmp_path / "draft")), markers)
    target = hostile(Path(shutil.copytree(DEMO / "target", tmp_path / "target")), markers)
    return draft, target, markers, home


def _llamacpp_built():
    require_release("0.3.36", "llamacpp")


@pytest.mark.parametrize("engine, folder", [("llamacpp==0.3.36", "target"), ("llamacpp==0.3.36", "draft"),
                                            ("sglang==0.5.10", "draft"), ("vllm==0.32.0", "draft")])
def test_a_real_check_runs_no_code_from_the_folder(evil, engine, folder):
    """`check DIR --loader real`, started inside the hostile folder, with the target's hostile config.
    The hostile target checked as a draft (a mistake users make) is what llama.cpp's converter reads
    as a plain Llama model, with that model's own tokenizer."""
    draft, target, markers, home = evil
    name, release = engine.split("==")
    if name == "llamacpp":
        _llamacpp_built()
    else:
        require_release(release, name)
    checked = target if folder == "target" else draft
    proc = _run([str(CLI), "check", ".", "--engine", engine, "--loader", "real", "--target", str(target),
                 "--format", "json"], cwd=checked, home=home)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["loader"] == "real", report["findings"]
    assert sorted(p.name for p in markers.iterdir()) == []
    assert not (home / ".cache").exists()


def test_llamacpp_conversion_of_a_hostile_target_runs_none_of_its_code(evil, tmp_path):
    """`bench --backend llamacpp` converts the target with llama.cpp's converter, which asks for the
    target's tokenizer with trust_remote_code=True: refused, by name, and nothing ran."""
    _llamacpp_built()
    draft, target, markers, home = evil
    proc = _run([str(CLI), "bench", "--backend", "llamacpp", "--target", str(target), "--draft",
                 f"d={DEMO / 'draft-speculators'}", "--out", str(tmp_path / "bench"), "--num-prompts", "1"],
                cwd=target, home=home)
    assert sorted(p.name for p in markers.iterdir()) == []
    assert not (home / ".cache").exists()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "own code" in proc.stderr and "never runs code from a model folder" in proc.stderr


def test_the_guard_refuses_a_file_outside_the_installed_software(tmp_path):
    """The audit-hook layer alone: a module loaded straight from a model folder's file is refused."""
    (tmp_path / "evil.py").write_text(EVIL_CODE.format(marker=str(tmp_path / "ran")))
    code = ("from draftdoctor.realload import nocode; nocode.install()\n"
            "import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('evil', {str(tmp_path / 'evil.py')!r})\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "try:\n    spec.loader.exec_module(module)\nexcept nocode.CodeRefused as e:\n    print('refused:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert "refused:" in proc.stdout and "evil.py" in proc.stdout, proc.stderr
    assert not (tmp_path / "ran").exists()


# --- 2. the workers' folder --------------------------------------------------------------------

RELEASE = "0.5.10"
STORY_VERDICT = "decoder layer left at initial values"


def _as_nobody():
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _forger(sock: Path, drop_before_listen: bool, log: Path) -> subprocess.Popen:
    """A process of another user answering on `sock` with a forged verdict (every parameter written)."""
    code = f"""
import json, os, socket
s = socket.socket(socket.AF_UNIX)
s.bind({str(sock)!r})
os.chmod({str(sock)!r}, 0o777)
if {drop_before_listen}:
    os.setgid({NOBODY}); os.setuid({NOBODY})
s.listen()
while True:
    c, _ = s.accept()
    open({str(log)!r}, "a").write("asked\\n")
    c.recv(1 << 20)
    c.sendall(json.dumps({{"reports": []}}).encode() + b"\\n")
    c.close()
"""
    # the system's Python: the venv's may sit under a folder another user cannot enter
    return subprocess.Popen([SYSTEM_PYTHON, "-c", code], preexec_fn=None if drop_before_listen else _as_nobody)


@pytest.fixture
def long_state(tmp_path, monkeypatch):
    """A worker state folder whose socket paths are too long: the workers' folder is the /tmp one."""
    require_release(RELEASE)
    if os.getuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("acting as another local user needs root (CI runs as root) and the system's python3")
    state = tmp_path / ("state-" + "x" * 90)
    state.mkdir()
    monkeypatch.setenv("DRAFTDOCTOR_REALLOAD_STATE", str(state))
    folder, stem = pool._worker_folder("sglang", RELEASE, state)
    assert folder.parent == Path("/tmp")
    shutil.rmtree(folder, ignore_errors=True)
    yield state, folder, stem
    realload.stop_workers()
    shutil.rmtree(folder, ignore_errors=True)


def _check_story(state):
    return subprocess.run([str(CLI), "check", str(DEMO / "draft-story"), "--engine", f"sglang=={RELEASE}", "--loader",
                           "real"], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, DRAFTDOCTOR_REALLOAD_STATE=str(state)))


def test_a_workers_folder_another_user_made_is_never_used(long_state, tmp_path):
    """Another user made the predictable /tmp folder first, planted links at the lock and pid paths
    and listens on the socket path with a forged verdict: the check runs cold and says the truth, the
    forger is never asked, and the files the links point at are untouched."""
    state, folder, stem = long_state
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    os.chown(folder, NOBODY, NOBODY)
    victim = tmp_path / "precious.txt"
    victim.write_text("precious")
    for suffix in (".lock", ".pid"):
        (folder / f"{stem}{suffix}").symlink_to(victim)
    asked = tmp_path / "asked.log"
    forger = _forger(folder / f"{stem}.sock", drop_before_listen=False, log=asked)
    try:
        proc = _check_story(state)
    finally:
        forger.kill()
        forger.wait()
    assert proc.returncode == 1 and STORY_VERDICT in proc.stdout, proc.stdout + proc.stderr
    assert "real loader" in proc.stdout and not asked.exists()
    assert victim.read_text() == "precious"


def test_a_socket_another_user_answers_is_never_believed(long_state, tmp_path):
    """A socket in a folder of ours, answered by a process running as another user (it bound the
    socket, then dropped to that user before listening): the kernel names the peer, the worker is not
    used, the check runs cold."""
    state, folder, stem = long_state
    folder.mkdir(mode=0o700)
    asked = tmp_path / "asked.log"
    forger = _forger(folder / f"{stem}.sock", drop_before_listen=True, log=asked)
    try:
        for _ in range(100):
            if (folder / f"{stem}.sock").exists():
                break
            threading.Event().wait(0.05)
        with pytest.raises(realload.WorkerPlaceUnsafe, match="another user"):
            pool._connect(folder / f"{stem}.sock", 5.0)
        proc = _check_story(state)
    finally:
        forger.kill()
        forger.wait()
    assert proc.returncode == 1 and STORY_VERDICT in proc.stdout, proc.stdout + proc.stderr


def test_folders_and_links_at_a_workers_paths_are_cleared(tmp_path, monkeypatch):
    """In the user's own workers' folder, a folder at the socket path, a link at the scratch path and
    a folder at the lock path (left by anything) do not stop the worker: no traceback, the true verdict."""
    require_release(RELEASE)
    state = tmp_path / "state"
    monkeypatch.setenv("DRAFTDOCTOR_REALLOAD_STATE", str(state))
    realload.stop_worker("sglang", RELEASE)
    sock, pid_file, _ = pool._worker_paths("sglang", RELEASE)
    sock.mkdir()
    (sock / "inside").write_text("x")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "sentinel").write_text("kept")
    sock.with_suffix(".tmp").symlink_to(tmp_path / "kept")
    sock.with_suffix(".lock").mkdir()
    try:
        proc = _check_story(state)
    finally:
        realload.stop_worker("sglang", RELEASE)
    assert proc.returncode == 1 and STORY_VERDICT in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "kept" / "sentinel").read_text() == "kept"  # the link was removed, not followed
    assert oct(os.stat(state).st_mode & 0o777) == "0o700"


# --- 3. loopback only ------------------------------------------------------------------------

@pytest.mark.parametrize("engine, release", [("sglang", "0.5.10"), ("vllm", "0.32.0")])
def test_a_warm_worker_listens_on_loopback_only(engine, release, tmp_path):
    require_release(release, engine)
    from draftdoctor.synth import write_draft

    realload.run_real_loader(write_draft(tmp_path / "d", layout="midlayer", config="flat"), release, engine_name=engine)
    pid = int(pool._worker_paths(engine, release)[1].read_text())
    found = listeners.group_listeners(pid)
    assert found, "a gloo group listens on loopback: the test must see it"
    assert [(l.address, l.port) for l in found if not l.loopback] == []


def test_listeners_are_read_as_the_kernel_sees_them():
    """The reader itself: a socket listening on loopback, and one on every interface, as they are."""
    with socket.socket() as local, socket.socket(socket.AF_INET6) as wide:
        local.bind(("127.0.0.1", 0))
        local.listen()
        wide.bind(("::", 0))
        wide.listen()
        mine = {l.port: l for l in listeners.group_listeners(os.getpgid(0))}
        assert mine[local.getsockname()[1]].loopback and mine[local.getsockname()[1]].address == "127.0.0.1"
        assert not mine[wide.getsockname()[1]].loopback and mine[wide.getsockname()[1]].address == "::"
