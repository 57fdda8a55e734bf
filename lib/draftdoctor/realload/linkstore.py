"""One copy on disk of each file the engine releases under build/ have in common.

Every release folder is a full `pip install --target` of its pin list, and most of it (transformers,
numpy, opencv, ...) is byte-identical between releases: CI's 16 folders hold 11.7 GB of which 4.5 GB
are distinct. `link(store, folder)` hard-links each file of a freshly installed folder to the entry of
its content in a content-addressed `store` (same file system), so a file shared by N releases is kept
once. Nothing writes into an installed release (Python's bytecode is written as new files), so a shared
inode is never changed through one release under another's feet.

Safe with concurrent installs (`make -j3`): store entries appear by atomic `link`, files are swapped for
links by atomic `rename`. Entries no release links to any more (a reinstalled or deleted release) are
pruned first. A file that is a store entry already (linked from a release in the store when installed:
realload.reuse) is known by its inode and not read again.

    python -m draftdoctor.realload.linkstore STORE FOLDER
"""

import argparse
import hashlib
import os
from pathlib import Path

def _entry(store: Path, path: Path, mode: int) -> Path:
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=20))
    name = f"{digest.hexdigest()}-{mode & 0o7777:o}"  # links share their mode: it is part of the identity
    return store / name[:2] / name


def prune(store: Path) -> int:
    """Remove store entries that no release links to (link count 1); returns how many."""
    removed = 0
    for entry in store.glob("*/*"):
        if entry.stat().st_nlink == 1:
            entry.unlink(missing_ok=True)
            removed += 1
    return removed


def _inodes(store: Path) -> set[tuple[int, int]]:
    """The store's entries as (device, inode): a file that is one of them is linked already (a rerun, or a
    file an install linked from a release in the store: realload.reuse)."""
    found = set()
    for entry in store.glob("*/*"):
        try:
            st = entry.lstat()
        except FileNotFoundError:  # pruned meanwhile
            continue
        found.add((st.st_dev, st.st_ino))
    return found


def link(store: Path, folder: Path) -> tuple[int, int]:
    """Replace each regular file under `folder` by a hard link to its store entry (adding the entry
    when the content is new); returns (files now shared with another release, bytes saved)."""
    shared = saved = 0
    entries = _inodes(store)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        st = path.lstat()
        if st.st_size == 0 or (st.st_dev, st.st_ino) in entries:  # empty, or a store entry already (not hashed)
            continue
        entry = _entry(store, path, st.st_mode)
        entry.parent.mkdir(parents=True, exist_ok=True)
        spare = path.with_name(f".{path.name}.linkstore")
        while True:
            try:
                os.link(path, entry)  # new content: this file becomes the entry
                break
            except FileExistsError:
                pass
            spare.unlink(missing_ok=True)
            try:
                os.link(entry, spare)
            except FileNotFoundError:  # pruned meanwhile: offer this file as the entry again
                continue
            if os.path.samefile(spare, path):  # linked already (a rerun)
                spare.unlink()
                break
            os.replace(spare, path)
            shared += 1
            saved += st.st_size
            break
    return shared, saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    args.store.mkdir(parents=True, exist_ok=True)
    pruned = prune(args.store)
    shared, saved = link(args.store, args.folder)
    print(f"{args.folder}: {shared} files shared with other releases ({saved / 1e9:.2f} GB saved); "
          f"{pruned} unused store entries pruned")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
