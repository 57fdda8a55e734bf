"""Run the five notebooks headless with papermill, in order, and write the investigation's report.

Each notebook gets the investigation's parameters that it declares (read with papermill's own
inspection) plus `out_dir`; each writes one JSON into the run folder (draftdoctor.runs) that later
steps and the report read. A failing cell (an error or a timeout) stops the run with a
`StepFailed` naming notebook, cell and message. A parameters file may list several checkpoints:
each gets its own folder and the batch a summary table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError
from .lazy import defer_iri_grammar
from .runs import among_inputs, fixed_checkpoint, safe_name
from .serving.bench import DraftMisfit
from .toolstate import NOTEBOOKS, keep_out_of_home

NOTEBOOKS_DIR = NOTEBOOKS  # package data: the same notebooks in a checkout and an installed kit
defer_iri_grammar()  # papermill's nbformat would build a grammar it never uses (draftdoctor.lazy)
KERNEL_LOG = "kernels.log"  # in the run folder: what the notebooks' kernels wrote to stderr
STEPS = ("01-dump-keys", "02-compare-names", "03-load-coverage", "04-apply-fix", "05-relaunch-and-chart")


class ParamsError(UserError, ValueError):
    """A parameters file that cannot be used."""


class StepFailed(RuntimeError):
    """A notebook cell that raised or timed out."""

    def __init__(self, notebook: str, cell: int | None, message: str, output: Path):
        self.notebook, self.cell, self.message, self.output = notebook, cell, message, output
        where = f"cell {cell}" if cell is not None else "a cell"
        super().__init__(f"{notebook}: {where} failed: {message} (executed notebook: {output})")


@dataclass
class RunResult:
    name: str
    out_dir: Path
    report: dict | None = None
    error: str | None = None
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)


def load_params(path) -> list[dict]:
    """The runs a parameters file (YAML or JSON) asks for: one per checkpoint, each named."""
    import yaml

    from .checkpoint import MAX_JSON_BYTES, CheckpointError, open_regular

    path = Path(path)
    try:
        with open_regular(path) as f:
            raw = f.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise ParamsError(f"{path}: larger than {MAX_JSON_BYTES >> 20} MB; not a parameters file")
        params = yaml.load(raw.decode("utf-8"), Loader=_no_alias_loader())
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such file") from None
    except (IsADirectoryError, CheckpointError):
        raise ParamsError(f"{path}: not a regular file") from None
    except UnicodeDecodeError as e:
        raise ParamsError(f"{path}: not valid UTF-8 (byte {e.start})") from None
    except (yaml.YAMLError, RecursionError, ValueError) as e:
        raise ParamsError(f"{path}: not valid YAML ({str(e)[:200]})") from None
    if not isinstance(params, dict):
        raise ParamsError(f"{path}: expected a mapping of parameter names to values")
    base = path.parent
    checkpoints = params.pop("checkpoints", None)
    if checkpoints is None:
        if "checkpoint" not in params:
            raise ParamsError(f"{path}: give `checkpoint: PATH` or `checkpoints: [PATH, ...]`")
        checkpoints = [params.pop("checkpoint")]
    if not isinstance(checkpoints, list) or not checkpoints:
        raise ParamsError(f"{path}: `checkpoints` must be a non-empty list")
    runs = []
    for item in checkpoints:
        entry = item if isinstance(item, dict) else {"checkpoint": item}
        if "checkpoint" not in entry:
            raise ParamsError(f"{path}: every entry of `checkpoints` needs a checkpoint path")
        run = {**params, **entry}
        _check_types(path, run)
        _read_old_names(path, run)
        for key in PATH_PARAMS:  # the notebooks run in the package's folder: a relative path would land there
            if isinstance(run.get(key), str) and run[key] and not Path(run[key]).is_absolute():
                run[key] = str((base / run[key]).resolve())
        run.setdefault("name", Path(run["checkpoint"]).name)
        if not safe_name(run["name"]):
            raise ParamsError(f"{path}: run name {run['name']!r} must be a plain folder name "
                              "(letters, digits, . _ -; not . or ..): runs are written under --out")
        runs.append(run)
    names = [r["name"] for r in runs]
    if len(set(names)) != len(names):
        raise ParamsError(f"{path}: run names must differ (got {names}); give each checkpoint a `name`")
    return runs


def _no_alias_loader():
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        """YAML without aliases: `*name` re-uses an anchored node, and nine levels of them expand a few
        lines into billions of values (papermill would expand them all); a parameters file needs none."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted in a parameters "
                                                  "file", event.start_mark)
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            """A key given twice is refused (YAML keeps the last without a word: a second `checkpoint:`
            further down had replaced the first)."""
            seen = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        raise yaml.constructor.ConstructorError(None, None, f"`{key.value}` is given twice",
                                                                key.start_mark)
                    seen.add(key.value)
            return super().construct_mapping(node, deep)

    return NoAliasLoader


# What each parameter the notebooks take must be (YAML gives whatever it reads): checked before anything
# runs, so a list where a path belongs is one line naming the field, not a traceback in a notebook.
# The parameters that name a file or folder: relative to the parameters file, made absolute when read.
PATH_PARAMS = ("checkpoint", "target", "prompts", "fixed_checkpoint")
PARAM_TYPES = {"checkpoint": str, "target": str, "prompts": str, "engine_name": str, "engine": str,
               "release": (str, int, float),
               "loader": str, "backend": str, "name": str, "compare_backend": str, "fixed_checkpoint": str,
               "num_prompts": int, "max_new_tokens": int, "num_steps": int, "allow_lossy": bool, "interactive": bool,
               "guard": bool}


def _check_types(path: Path, run: dict) -> None:
    """Each known parameter of `run` of its type (a release YAML read as a number becomes its text)."""
    for key, value in run.items():
        wanted = PARAM_TYPES.get(key)
        if wanted is None or value is None:
            continue
        if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
            names = "/".join(t.__name__ for t in (wanted if isinstance(wanted, tuple) else (wanted,)))
            raise ParamsError(f"{path}: `{key}` must be a {names}, got {type(value).__name__} {str(value)[:60]!r}")
        if wanted is int and value < 1:  # a count, as the command line's --num-prompts and the like take it
            raise ParamsError(f"{path}: `{key}` must be a whole number >= 1, got {value}")
    if "release" in run and not isinstance(run["release"], str) and run["release"] is not None:
        run["release"] = str(run["release"])


# Parameters renamed, read under their old name for one release: old name -> new name.
OLD_NAMES = {"engine": "engine_name"}


def _read_old_names(path: Path, run: dict) -> None:
    """A parameter given by its old name (`engine: sglang`) is read as its new one (`engine_name`); both
    given and different is one line naming the file."""
    for old, new in OLD_NAMES.items():
        if old in run:
            value = run.pop(old)
            if new in run and run[new] != value:
                raise ParamsError(f"{path}: `{old}` is the old name of `{new}`; give one of them "
                                  f"(got {old}: {str(value)[:60]!r} and {new}: {str(run[new])[:60]!r})")
            run[new] = value


def run_step(step: str, params: dict, out_dir: Path, cell_timeout: float, notebooks: Path = NOTEBOOKS_DIR) -> Path:
    """Execute one notebook with the parameters it declares; returns the executed notebook's path."""
    import logging

    import papermill as pm
    from nbclient.exceptions import CellTimeoutError

    # papermill logs a timeout or a failing cell itself ("Timeout waiting for execute reply"); the
    # StepFailed raised below says it once, naming notebook and cell
    logging.getLogger("papermill").addHandler(logging.NullHandler())
    logging.getLogger("papermill").propagate = False

    source = notebooks / f"{step}.ipynb"
    declared = pm.inspect_notebook(str(source))
    chosen = {k: v for k, v in params.items() if k in declared} | {"out_dir": str(out_dir)}
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / f"{step}.ipynb"
    try:
        pm.execute_notebook(str(source), str(output), parameters=chosen, kernel_name="python3",
                            cwd=str(notebooks), execution_timeout=cell_timeout, progress_bar=False,
                            kernel_manager_class=_kernel_manager(out_dir / KERNEL_LOG))
    except pm.PapermillExecutionError as e:
        raise StepFailed(f"{step}.ipynb", e.cell_index, f"{e.ename}: {e.evalue}", output) from None
    except CellTimeoutError:
        raise StepFailed(f"{step}.ipynb", _running_cell(output), f"timed out after {cell_timeout:.0f} s", output) from None
    return output


def _kernel_manager(log_path: Path):
    """nbclient's kernel manager, with the kernel's stderr in `log_path` instead of the user's terminal:
    the kernel's own warnings ("Kernel is running over TCP without encryption", once per notebook) and
    the tracebacks of a kernel stopped after a timeout are its tools' noise, not the kit's output.
    (`_async_launch_kernel` is jupyter_client's documented override point for launching differently.)"""
    from jupyter_client.manager import AsyncKernelManager

    class QuietKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            with open(log_path, "ab") as log:  # the kernel holds its own copy of the descriptor
                await super()._async_launch_kernel(kernel_cmd, **(kw | {"stderr": log}))

    return QuietKernelManager


def _running_cell(executed: Path) -> int | None:
    """The index of the last cell papermill started (where a timeout struck; later cells are pending)."""
    import nbformat

    try:
        book = nbformat.read(executed, as_version=4)
    except (OSError, ValueError):
        return None
    started = [i for i, cell in enumerate(book.cells) if cell.get("metadata", {}).get("papermill", {}).get("start_time")]
    return started[-1] if started else None


def preflight(params: dict) -> None:
    """Before any notebook kernel or server starts: the checkpoint must fit the target on the engine
    (serving.bench.preflight, the same diagnosis as `check --target`); else DraftMisfit."""
    from .engines import from_parameters
    from .serving.bench import preflight as bench_preflight

    if params.get("target"):
        bench_preflight(params["target"], [(params["name"], params["checkpoint"])],
                        from_parameters(params.get("engine_name", "sglang"), params.get("release")))


def investigate_one(params: dict, out_dir: Path, steps=None, cell_timeout: float = 900.0, progress=None) -> RunResult:
    """Run the notebooks for one checkpoint into `out_dir` and write report.json / report.md."""
    from .report import write_report

    keep_out_of_home()  # the kernels' IPython and Jupyter folders: trusted before a kernel reads them
    out_dir = Path(out_dir).resolve()  # notebooks run in notebooks/: relative paths would land there
    out_dir.mkdir(parents=True, exist_ok=True)
    result = RunResult(params["name"], out_dir)
    start = time.perf_counter()
    try:
        preflight(params)
        for step in steps or STEPS:
            if progress:
                progress(f"{params['name']}: {step}")
            run_step(step, params, out_dir, cell_timeout)
            result.steps.append(step)
            if step == "04-apply-fix":  # step 05 serves what step 04 wrote
                params = {**params, "fixed_checkpoint": fixed_checkpoint(out_dir)}
    except (StepFailed, DraftMisfit) as e:
        result.error = str(e)
    result.seconds = time.perf_counter() - start
    result.report = write_report(out_dir, params, result.error)
    return result


def investigate(params_file, out, cell_timeout: float = 900.0, progress=None, override: dict | None = None) -> list[RunResult]:
    """Every run of a parameters file (`override`: parameters set in place of the file's); a batch gets one
    folder per checkpoint and summary.md."""
    from .engines import EngineSpecError, from_parameters
    from .report import write_summary

    runs = [run | (override or {}) for run in load_params(params_file)]
    out = Path(out)
    for run in runs:
        inside = among_inputs(out, [(f"the {key}", run[key]) for key in ("checkpoint", "target") if run.get(key)])
        if inside:
            raise UserError(f"--out {out}: {inside}")
        try:  # an engine or release no row knows: said now, not by notebook 02 after 01 ran (exit 1)
            from_parameters(run.get("engine_name") or "sglang", run.get("release"))
        except EngineSpecError as e:
            raise ParamsError(f"{params_file}: {e}") from None
    if len(runs) == 1:
        return [investigate_one(runs[0], out, cell_timeout=cell_timeout, progress=progress)]
    results = [investigate_one(r, out / r["name"], cell_timeout=cell_timeout, progress=progress) for r in runs]
    write_summary(out, results)
    return results


@dataclass(frozen=True)
class DemoRun:
    """The bundled demo's investigation as `draftdoctor demo` runs it: its parameters file, what is run in
    place of the file's parameters, and the note saying why."""

    params: Path
    override: dict | None = None
    note: str | None = None


def demo_run() -> DemoRun:
    """The demo's parameters (package data). Where they ask for a release's own loader that is not installed
    here, the drafts are loaded as the kit's replay of it says, and the note says so and how to install it."""
    from .realload.registry import REAL_LOADERS, installed_releases
    from .toolstate import DEMO

    path = DEMO / "investigate.yaml"
    [params] = load_params(path)
    engine_name = params["engine_name"]
    if params.get("loader") == "real" and params["release"] not in installed_releases(engine_name):
        spec, hint = f"{engine_name}=={params['release']}", REAL_LOADERS[engine_name].install_hint(params["release"])
        return DemoRun(path, {"loader": "replay"}, f"{spec}'s own loader is not installed here ({hint} installs it, about "
                                                   "a minute): the drafts are loaded as the kit's replay of it says")
    return DemoRun(path)
