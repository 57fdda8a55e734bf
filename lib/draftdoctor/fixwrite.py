"""`fix` carried out: a plan written to DST, verified, and only then put in place.

`apply_fix` writes without loading a tensor, through `rewriter` (which knows nothing of engines): each
shard gets a new header and its data bytes are copied by the kernel (`copy_file_range`, else
`sendfile`, else a bounded buffer) into a temporary folder beside DST, 4 MB at a time, while a second
thread reads each copied chunk back from SRC and DST and compares the two, close behind the copy so
both are usually still in the CPU cache. Then DST's headers are re-read and checked against the plan
and diagnosed again as `check` would; only a verified result is renamed into place. SRC is only ever
opened for reading, and on any failure or interrupt everything written is removed.

Why compare chunks in the cache rather than hash: copying 1.9 GB from the page cache is bound by
memory bandwidth (`cp` 0.5 s here). Hashing SRC and DST afterwards reads 3.8 GB more from memory
and took 2-3x `cp`; CRC-32 alone costs 1.3 CPU-seconds and SHA-256 about 4. Reading a chunk back
while it is cache-hot costs a cache-speed copy, on the other core, and the check is exact.
Why one writer: threads writing one file contend for its inode lock (the kernel spins on it), and
`pwrite` from a user buffer measured far slower than the kernel's own page-to-page copy.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import rewriter
from .checkpoint import CONFIG_NAME, INDEX_NAME, CheckpointError, in_hf_cache_blobs, open_checkpoint
from .coverage import CoverageReport
from .fixplan import LOSS_CODES, FixError, FixPlan
from .rewriter import RewriteError, WrittenTensor

MARKER = ".draftdoctor-fix.json"  # in every folder fix writes: the files it wrote, so --force replaces only those


@dataclass
class Verification:
    """What was checked on DST before it was put in place."""

    tensors_checked: int
    bytes_checked: int
    mismatched: list[str]  # tensors whose bytes in DST differ from SRC
    header_problems: list[str]  # DST's re-read headers, config and index against the plan
    coverage: CoverageReport | None = field(repr=False, default=None)  # `check` on DST, with the plan's target
    accepted_losses: tuple[str, ...] = ()  # LOSS_CODES the user accepted (--allow-lossy)

    @property
    def problems(self) -> list[str]:
        out = self.header_problems + [f"{name}: bytes in DST differ from SRC" for name in self.mismatched]
        if self.coverage is None:
            out.append("DST could not be re-read")
        else:
            out += [f.brief() for f in self.coverage.errors if f.code not in self.accepted_losses]
        return out

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class FixResult:
    """What `apply_fix` did and how it was verified."""

    plan: FixPlan = field(repr=False)
    dst: Path
    written: bool  # DST is in place (only after verification passed)
    tensors_renamed: int
    tensors_copied: int
    tensors_omitted: int
    bytes_copied: int
    files_copied: int
    seconds: float
    copy_method: str
    verification: Verification

    @property
    def ok(self) -> bool:
        return self.written and self.verification.ok

    def to_dict(self) -> dict:
        cov = self.verification.coverage
        return {
            "src": str(self.plan.src), "dst": str(self.dst), "engine": self.plan.engine.spec, "ok": self.ok,
            "changes_nothing": self.plan.changes_nothing,
            "written": self.written, "tensors_renamed": self.tensors_renamed, "tensors_copied": self.tensors_copied,
            "tensors_omitted": self.tensors_omitted, "bytes_copied": self.bytes_copied,
            "files_copied": self.files_copied, "seconds": round(self.seconds, 3), "copy_method": self.copy_method,
            "config_changes": [asdict(c) for c in self.plan.config.changes],
            "verification": {
                "ok": self.verification.ok, "tensors_checked": self.verification.tensors_checked,
                "bytes_checked": self.verification.bytes_checked, "method": "byte comparison with SRC",
                "problems": self.verification.problems,
                "coverage_verdict": cov.verdict if cov else None,
            },
        }


def check_destination(plan: FixPlan, dst: Path, force: bool) -> None:
    """Refuse destinations that are unsafe: existing (without force), inside SRC, holding SRC."""
    src_folder = plan.checkpoint.folder.resolve()
    target = dst.resolve()
    if target == src_folder or target.is_relative_to(src_folder):
        raise FixError(f"{dst}: inside the source checkpoint folder {plan.checkpoint.folder}; choose another --out")
    if src_folder.is_relative_to(target):
        raise FixError(f"{dst}: contains the source checkpoint {plan.checkpoint.folder}; choose another --out")
    if not target.parent.is_dir():
        raise FixError(f"{dst}: parent {dst.parent} is not an existing folder")
    for path in [s.path for s in plan.checkpoint.shards] + [plan.checkpoint.folder / f.name for f in plan.files if f.copy]:
        if path.resolve().is_relative_to(target):
            raise FixError(f"{path}: resolves to a file inside {dst}, which fix would replace; choose another --out")
    if os.path.lexists(dst):
        if not force:
            raise FixError(f"{dst}: already exists; pass --force to replace it (after the new one is verified)")
        _check_replaceable(dst)


def _check_room(plan: FixPlan, dst: Path) -> None:
    """Refuse before writing a copy its file system has no room for: the copy takes about what SRC's files
    say they hold, and a sparse SRC holds that on no disk (a 12 kB draft claiming 296 MB had been written
    out whole; claiming a terabyte, it would fill the disk for everyone before failing)."""
    from .resources import human

    sources = [s.path for s in plan.checkpoint.shards] + [plan.checkpoint.folder / f.name for f in plan.files if f.copy]
    need = sum(os.stat(path).st_size for path in sources)
    fs = os.statvfs(dst.parent)
    free = fs.f_bavail * fs.f_frsize
    if need > free:
        raise FixError(f"{dst}: No space left on device: the fixed copy takes about {human(need)}, more than the "
                       f"{human(free)} free on its file system; make room or choose another --out")


def _check_replaceable(dst: Path) -> None:
    """--force replaces an empty folder, or one `fix` wrote (its MARKER lists every file) holding
    nothing else; anything else stands in the way and is named."""
    if not dst.is_dir() or dst.is_symlink():
        raise FixError(f"{dst}: --force replaces only an empty folder or one draftdoctor fix wrote; this is not a folder")
    entries = sorted(os.listdir(dst))
    if not entries:
        return
    try:
        written = set(json.loads((dst / MARKER).read_text())["files"]) if not (dst / MARKER).is_symlink() else set()
    except (OSError, ValueError, KeyError, TypeError):
        written = set()
    foreign = [e for e in entries if e != MARKER and (e not in written or not (dst / e).is_file() or (dst / e).is_symlink())]
    if foreign or not written:
        named = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise FixError(f"{dst}: --force replaces only an empty folder or one draftdoctor fix wrote; "
                       + (f"{named} {'was' if len(foreign) == 1 else 'were'} not written by it" if written
                          else f"it holds {named}, and no {MARKER} says fix wrote them"))


def apply_fix(plan: FixPlan, dst, force: bool = False, allow_lossy: bool = False, progress=None) -> FixResult:
    """Write the planned checkpoint to `dst`, verify it, and only then put it in place.

    `progress(nbytes)` is called as tensor bytes are copied. Raises FixError before writing
    anything if the plan is blocked (or lossy without `allow_lossy`) or DST is unsafe; a result
    whose verification failed has `written` False and leaves DST as it was (absent, or the old
    folder under `force`). A plan not judged yet (`plan_fix(judge=False)`) is judged while its
    shards are written in a thread of their own, in the hidden folder beside DST: refused, the
    copy stops and that folder is removed, so nothing is written either.
    """
    dst = Path(dst)
    if plan.judging is None:
        refused = plan.refusal(allow_lossy)
        if refused:
            raise refused
    try:
        check_destination(plan, dst, force)
        rewriter.sweep_killed_runs(dst)
        try:
            tmp = rewriter.new_folder(dst.parent, rewriter.temp_prefix(dst, os.getpid()))
        except OSError as e:
            raise FixError(f"{dst.parent}: cannot create a folder there ({e.strerror})") from None
    except FixError as e:
        refused = plan.judge().refusal(allow_lossy)  # a refusal is what to say, when there is one
        raise (refused or e) from None
    start = time.perf_counter()
    try:
        _check_room(plan, dst)  # once the folder beside DST is made: a place that takes no folder says so first
        names = {m.old: m.new for m in plan.tensors}
        copier = rewriter.Copier()

        def write(stop=None):
            return [rewriter.write_shard(shard, names, tmp, copier, progress, stop) for shard in plan.checkpoint.shards]

        if plan.judging is None:
            written = write()
            loader = _chosen_loader(plan)
        else:  # the plan's value scan, replay and prediction take their time beside the copy, not before it
            with rewriter.Background(write) as writing:
                refused = plan.judge().refusal(allow_lossy)
                if refused:
                    raise refused
                loader = _chosen_loader(plan)  # as is the choice of DST's loader
                written = writing.result()
        planned = [tensors for tensors, _ in written]
        mismatched = {name for _, names in written for name in names}
        _write_index(plan, tmp, planned)
        (tmp / CONFIG_NAME).write_text(json.dumps(plan.config.config, indent=2) + "\n", encoding="utf-8")
        copied = [f for f in plan.files if f.copy]
        for f in copied:
            source = plan.checkpoint.folder / f.name
            if source.is_symlink() and in_hf_cache_blobs(plan.checkpoint.folder, source):
                source = source.resolve()
            rewriter.copy_regular_file(source, tmp / f.name)
        files = sorted(os.listdir(tmp))
        (tmp / MARKER).write_text(json.dumps({"written_by": "draftdoctor fix", "engine": plan.engine.spec,
                                              "files": files}, indent=1) + "\n", encoding="utf-8")
        verification = _verify(plan, tmp, planned, mismatched, allow_lossy, loader)
        result = FixResult(plan, dst, False, len(plan.renamed), sum(len(p) for p in planned), len(plan.omitted),
                           sum(t.nbytes for p in planned for t in p), len(copied), 0.0, copier.method, verification)
        if verification.ok:
            if force and os.path.lexists(dst):
                _check_replaceable(dst)  # again: it may have changed while this run wrote
            rewriter.put_in_place(tmp, dst, replace=force)
            result.written = True
            verification.coverage.path = str(dst)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        result.seconds = time.perf_counter() - start
        return result
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, RewriteError):
            raise FixError(str(e)) from None
        if isinstance(e, OSError):
            raise FixError(f"{e.filename or dst}: {e.strerror or e}") from None
        raise


def _write_index(plan: FixPlan, folder: Path, planned: list[list[WrittenTensor]]) -> None:
    index = plan.checkpoint.index
    if index is None:
        return
    weight_map = {p.name: p.dst.name for shard in planned for p in shard}
    total = sum(p.nbytes for shard in planned for p in shard)
    new = {**index, "metadata": {**(index.get("metadata") or {}), "total_size": total}, "weight_map": weight_map}
    (folder / INDEX_NAME).write_text(json.dumps(new, indent=2) + "\n", encoding="utf-8")


def _chosen_loader(plan: FixPlan) -> str:
    """The loader that verifies DST ("real" or "replay"): `--loader auto` asks whether the release is
    installed here, which reads every release folder's trust (about 10 ms), so `apply_fix` asks while
    the copy is written rather than after it."""
    from .diagnose import chosen_loader

    return chosen_loader(plan.engine, plan.loader)


def _verify(plan: FixPlan, folder: Path, planned: list[list[WrittenTensor]], mismatched: set[str],
            allow_lossy: bool, loader: str | None = None) -> Verification:
    """Re-read DST's headers and check them against the plan and the byte comparison; diagnose DST as
    `check` does (with the plan's target), with `loader` (`_chosen_loader`) when it was chosen already."""
    flat = [p for shard in planned for p in shard]
    mismatched = sorted(mismatched)
    problems = []
    try:
        written = open_checkpoint(folder)
    except CheckpointError as e:
        return Verification(len(flat), 0, mismatched, [f"re-reading DST: {e}"], None)
    for p in flat:
        t = written.tensors.get(p.name)
        if t is None:
            problems.append(f"{p.name}: missing from DST's headers")
        elif (t.dtype, t.shape, t.file.name, t.begin, t.nbytes) != (p.dtype, p.shape, p.dst.name, p.dst_begin, p.nbytes):
            problems.append(f"{p.name}: DST header says {t.dtype} {list(t.shape)} at {t.file.name}:{t.begin}, "
                            f"planned {p.dtype} {list(p.shape)} at {p.dst.name}:{p.dst_begin}")
    extra = set(written.tensors) - {p.name for p in flat}
    problems += [f"{name}: in DST's headers but not planned" for name in sorted(extra)]
    if written.config != plan.config.config:
        problems.append(f"{CONFIG_NAME}: re-read config differs from the planned one")
    from .diagnose import diagnose

    # the same names, dtypes, shapes and config over bytes compared equal: the plan's value scan is DST's
    same = not (problems or mismatched)
    coverage = diagnose(written, plan.engine, plan.loader, target_config=plan.target_config,
                        prediction=plan.prediction, values=plan.value_hits if same else None, chosen=loader)
    return Verification(len(flat), sum(p.nbytes for p in flat), mismatched, problems, coverage,
                        LOSS_CODES if allow_lossy else ())
