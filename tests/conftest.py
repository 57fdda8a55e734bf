"""Shared fixtures: tiny synthetic drafts written by draftdoctor.synth into a temp folder.

Tool state (Jupyter, IPython, matplotlib, HF and XDG caches and config, Chromium's crash reports among
them) goes to build/state, never the home directory, also when pytest is run without make.
"""

import os

from draftdoctor.toolstate import keep_out_of_home

keep_out_of_home(isolate=True)  # before anything imports matplotlib, IPython, Jupyter or the browser

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
    from draftdoctor.realload import LOADERS, installed_releases

    extra = installed_releases(engine) if os.environ.get("DRAFTDOCTOR_TEST_RELEASES") == "installed" else []
    return sorted(set(LOADERS[engine].ci_releases) | set(extra), key=parse_version)


@pytest.fixture(scope="session", autouse=True)
def _stop_real_loader_workers(tmp_path_factory):
    """The session's warm real-loader workers live apart from anyone else's (the CLI processes the
    tests start inherit the place) and end with the session (none outlives `make test`)."""
    os.environ["DRAFTDOCTOR_REALLOAD_STATE"] = str(tmp_path_factory.mktemp("realload"))
    yield
    from draftdoctor.realload import stop_workers

    stop_workers()


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
