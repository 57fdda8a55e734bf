"""Shared fixtures: tiny synthetic drafts written by draftdoctor.synth into a temp folder.

Tool state (Jupyter, IPython, matplotlib, HF and XDG caches and config, Chromium's crash reports among
them) goes to build/state, never the home directory, also when pytest is run without make.
"""

import functools
import os
import re
import secrets
import shutil
import signal
import tempfile
import time
from itertools import zip_longest
from pathlib import Path

from draftdoctor.lazy import defer_iri_grammar
from draftdoctor.toolstate import keep_out_of_home

keep_out_of_home(isolate=True)  # before anything imports matplotlib, IPython, Jupyter or the browser
defer_iri_grammar()  # before any test module imports nbformat (draftdoctor.lazy)
# A suite started as a shell's background job inherits SIGINT ignored (POSIX shells without job control do
# that to `cmd &`), and every process it starts would too: the tests that press Ctrl-C on the kit would
# see it ignored. The session takes Python's own handler back, so what it starts gets the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402

from draftdoctor.synth import DraftShape, write_draft


@pytest.fixture
def draft(tmp_path):
    """write a synthetic draft: draft("speculators", config="flat", ...) -> folder."""
    counter = iter(range(1000))

    def make(layout="speculators", shape=DraftShape(), **kwargs):
        return write_draft(tmp_path / f"{layout}-{next(counter)}", shape, layout=layout, **kwargs)

    return make


def require_release(release: str, engine: str = "sglang") -> None:
    """Skip unless `engine` `release` is installed for the real loader; in CI its absence is a failure."""
    from draftdoctor.realload import ReleaseNotInstalled, release_env

    try:
        release_env(release, engine)
    except ReleaseNotInstalled as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must install the real loaders: {exc}")
        pytest.skip(str(exc))


def releases_under_test(engine: str = "sglang") -> list[str]:
    """The releases a real-loader test runs on: the ones CI installs (`realload/ci_releases.txt`, one per
    profile row); with DRAFTDOCTOR_TEST_RELEASES=installed also every other installed here (the release
    sweep, `make sglang-loaders RELEASES=all`, covers them all faster)."""
    from draftdoctor.engines import parse_version
    from draftdoctor.realload import REAL_LOADERS, installed_releases

    extra = installed_releases(engine) if os.environ.get("DRAFTDOCTOR_TEST_RELEASES") == "installed" else []
    return sorted(set(REAL_LOADERS[engine].ci_releases) | set(extra), key=parse_version)


# Every process a test starts carries this (and, under pytest-xdist, its worker's id): what is still
# running at the end of the session is found by it, wherever it was reparented.
SESSION = os.environ.setdefault("DRAFTDOCTOR_TEST_SESSION", secrets.token_hex(8))
# Every temporary file the session's processes make (the kit's scratch folders, converters', servers',
# browsers') goes under one short folder per test process, which the session proves empty at its end
# (pytest's own tmp_path folders, pytest-of-*, aside) and the controlling process then removes.
TEST_TMP = Path(os.environ.setdefault("DRAFTDOCTOR_TEST_TMP", str(Path(tempfile.gettempdir()) / f"ddt-{SESSION[:8]}")))
PROCESS_TMP = TEST_TMP / os.environ.get("PYTEST_XDIST_WORKER", "main")
PROCESS_TMP.mkdir(mode=0o700, parents=True, exist_ok=True)
os.environ["TMPDIR"] = tempfile.tempdir = str(PROCESS_TMP)


def session_processes() -> list[tuple[int, str]]:
    """(pid, command line) of the live processes this test process's session started (not zombies)."""
    wanted = {f"DRAFTDOCTOR_TEST_SESSION={SESSION}".encode()}
    if os.environ.get("PYTEST_XDIST_WORKER"):
        wanted.add(f"PYTEST_XDIST_WORKER={os.environ['PYTEST_XDIST_WORKER']}".encode())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if not wanted <= set((entry / "environ").read_bytes().split(b"\0")):
                continue
            stat = (entry / "stat").read_text()
            if stat[stat.rfind(")") + 2] == "Z":
                continue
            found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:
            continue
    return found


@pytest.fixture(scope="session", autouse=True)
def _stop_real_loader_workers(tmp_path_factory):
    """The session's warm real-loader workers live apart from anyone else's (the CLI processes the
    tests start inherit the place) and end with the session (none outlives `make test`). Then the
    session proves it left nothing running: no process it started (servers, workers, kernels,
    browsers, whatever they started in turn) and no socket of its own listening beyond loopback."""
    state = os.environ["DRAFTDOCTOR_REALLOAD_STATE"] = str(tmp_path_factory.mktemp("realload"))
    yield
    from draftdoctor import listeners
    from draftdoctor.realload import stop_workers
    from draftdoctor.serving.processes import sweep_server_scratch

    stop_workers()
    deadline = time.monotonic() + 15  # what was just stopped may take a moment to go
    while session_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = session_processes()
    wide = [l for l in listeners.tcp_listeners() if l.inode in listeners.socket_inodes([os.getpid()]) and not l.loopback]
    assert not left and not wide, (f"the test session left processes running: {left}" if left else
                                   f"the test process listens beyond loopback: {wide}")
    sweep_server_scratch()  # what a server's next start removes (its owner killed by a test) is not a leftover
    leftovers = sorted(p.name for p in PROCESS_TMP.iterdir() if not p.name.startswith("pytest-of-"))
    # the kit's own scratch folders (realload.scratch_folder: KIND-PID-...): one whose owner still runs
    # was not removed when its work ended (a killed owner's is removed by the next, by design)
    leftovers += sorted(p.name for p in Path(state).glob("*-*-*")
                        if p.name.split("-")[1].isdigit() and Path(f"/proc/{p.name.split('-')[1]}").exists())
    assert not leftovers, f"the test session left temporary files in {PROCESS_TMP}: {leftovers}"


def pytest_unconfigure(config):
    """The controlling process (not an xdist worker) removes the session's temporary folder."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        shutil.rmtree(TEST_TMP, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """`make test` runs two pytest-xdist workers (`--dist loadgroup`): the tests that share a module- or
    class-scoped fixture (a served engine, a trained draft) go to one worker, so it is built once; the
    others are handed out one by one."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info and any(defs[-1].scope in ("module", "class", "package")
                        for defs in info.name2fixturedefs.values() if defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        mark_tier(item)
    items[:] = by_release(items)


# an engine release named in a test's parameters: "0.5.10", "sglang==0.5.10", "vllm-0.32.0", "auto-sglang==0.5.23"
RELEASE_PARAM = re.compile(r"(?<![\d.])(\d+\.\d+(?:\.\d+)?(?:\.?post\d+|rc\d+)?)(?![\d.])")


def by_release(items: list) -> list:
    """The engine tests parametrized by a release, moved together where the first of them stood and
    ordered by release (collection order within one), in two interleaved streams of alternate releases:
    a release's real-loader worker (at most three stay warm, the least recently used goes) then serves
    every test of that release while the other xdist worker works through another release's, instead
    of being started again for each test function that walks the releases. Tests held to one xdist
    worker by a shared fixture stay where they are."""
    from draftdoctor.engines import parse_version

    def release(item):
        if "engine" not in item.keywords or item.get_closest_marker("xdist_group") is not None:
            return None
        params = getattr(getattr(item, "callspec", None), "params", {})
        found = [m.group(1) for v in params.values() if isinstance(v, str) for m in [RELEASE_PARAM.search(v)] if m]
        return found[0] if found else None

    releases = [release(item) for item in items]
    moved = [i for i, r in enumerate(releases) if r is not None]
    if not moved:
        return items
    order = sorted({releases[i] for i in moved}, key=parse_version)
    streams = [[items[i] for i in sorted(moved, key=lambda i: (parse_version(releases[i]), i))
                if order.index(releases[i]) % 2 == s] for s in (0, 1)]
    block = [item for pair in zip_longest(*streams) for item in pair if item is not None]
    rest = [item for item, r in zip(items, releases) if r is None]
    first = sum(1 for r in releases[:moved[0]] if r is None)
    return rest[:first] + block + rest[first:]


# What needs an engine release installed (`make test` installs them) or the browser: the rest is
# `make test-fast`, which needs nothing beyond the venv.
ENGINE_CALLS = ("require_release(", "releases_under_test(")


def mark_tier(item) -> None:
    """Mark `item` `engine` when it, a fixture it uses, or a helper of its module asks for an engine
    release, and `browser` when it drives the browser."""
    import inspect

    module = item.module
    helpers = getattr(module, "_engine_helpers", None)
    if helpers is None:
        helpers = module._engine_helpers = {  # its own functions that ask, and other names for the askers
            name for name, value in vars(module).items() if inspect.isfunction(value)
            and (value.__module__ == module.__name__ and any(c in _source(value) for c in ENGINE_CALLS)
                 or f"{value.__name__}(" in ENGINE_CALLS)}
    info = getattr(item, "_fixtureinfo", None)
    fixtures = info.name2fixturedefs if info else {}
    sources = [_source(getattr(item, "function", None))] + [_source(defs[-1].func) for defs in fixtures.values() if defs]
    if "browser" in fixtures:
        item.add_marker(pytest.mark.browser)
    if any(c in text for text in sources for c in ENGINE_CALLS + tuple(f"{h}(" for h in helpers)):
        item.add_marker(pytest.mark.engine)


@functools.cache  # a fixture's source is asked for by every test that uses it
def _source(function) -> str:
    import inspect

    try:
        return inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return ""


# --- the suite's time per tier, printed at its end ------------------------------------------------
TIERS = ("engine", "browser", "story")
_TIER_SECONDS: dict = {}


def pytest_runtest_logreport(report):
    """Each test's setup, call and teardown time, by its tier (the controlling process sees the workers' too)."""
    tier = next((t for t in TIERS if t in report.keywords), "the rest")
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """What each tier of the suite cost (test time summed over the workers): the budget, visible."""
    if hasattr(terminalreporter.config, "workerinput") or not _TIER_SECONDS:  # an xdist worker: its controller says
        return
    parts = [f"{tier} {_TIER_SECONDS[tier]:.0f} s" for tier in (*TIERS, "the rest") if tier in _TIER_SECONDS]
    terminalreporter.write_line(f"time per tier (test time summed over workers): {', '.join(parts)}; "
                                f"in all {sum(_TIER_SECONDS.values()):.0f} s")
