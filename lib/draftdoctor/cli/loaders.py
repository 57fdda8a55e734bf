"""`draftdoctor loaders`: `list` every release with a real loader, installed or not; `install E==R ...`
installs some (pinned, self-checked)."""

from __future__ import annotations

import sys

from ..errors import UserError
from ..exits import EXIT_FINDINGS, EXIT_OK
from ..realload.install import InstallFailed, install, pin_list, waiting_note
from ..realload.registry import REAL_LOADERS, installed_releases
from .render import safe, table


def arguments(p) -> None:
    p.add_argument("action", choices=["list", "install"])
    p.add_argument("specs", nargs="*", metavar="ENGINE==RELEASE", help="install: e.g. sglang==0.5.10 vllm==0.32.0")


def run(args, out) -> int:
    if args.action == "list":
        rows = []
        for name, row in REAL_LOADERS.items():
            installed, ci = set(installed_releases(name)), set(row.ci_releases)
            rows += [(name, release, "yes" if release in installed else "no", "yes" if release in ci else "",
                      row.folder(release)) for release in row.releases]
        table(rows, ["engine", "release", "installed", "ci", "folder"], out)
        return EXIT_OK
    specs = []
    for spec in args.specs:
        engine, _, release = (part.strip() for part in spec.partition("=="))
        if not release:
            raise UserError(f"{spec}: name a release, e.g. sglang==0.5.10 (`draftdoctor loaders list` lists them)")
        pin_list(engine.lower(), release)  # every spec checked before anything is installed
        specs.append((engine.lower(), release))
    if not specs:
        raise UserError("loaders install: name at least one release, e.g. sglang==0.5.10")
    for engine, release in specs:
        sys.stderr.write(f"[loaders] installing {engine} {release} (pip, then its self-check)\n")
        try:
            folder, fresh = install(engine, release, waiting=lambda: sys.stderr.write(
                f"[loaders] {waiting_note(engine, release)}\n"))
        except InstallFailed as e:
            out.write(f"{engine} {release}: FAILED: {safe(e)}\n")
            return EXIT_FINDINGS
        out.write(f"{engine} {release}: {'installed' if fresh else 'already installed'} and self-checked in {folder}\n")
    return EXIT_OK
