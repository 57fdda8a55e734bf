"""The package's shape: no import circle among its modules (imports inside functions included)."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lib" / "draftdoctor"


def module_imports() -> dict[str, set[str]]:
    """{module: the package's modules it imports anywhere in its text}."""
    files = {".".join(("draftdoctor", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): p
             for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    deps.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in files else module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    graph = module_imports()
    assert "draftdoctor.diagnose" in graph and graph["draftdoctor.diagnose"] >= {"draftdoctor.coverage",
                                                                                 "draftdoctor.realcheck"}
    assert circles(graph) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_code_cites_only_what_the_repository_holds():
    """Engine facts are cited from docs/engine-facts.md, whose headings the citations name; nothing in
    lib/ points at notes outside the repository."""
    import re

    root = Path(__file__).resolve().parents[1]
    headings = re.findall(r"^## (.+)$", (root / "docs" / "engine-facts.md").read_text(), re.MULTILINE)
    outside, unknown = [], []
    for path in (root / "lib").rglob("*"):
        if not path.is_file() or path.suffix not in (".py", ".txt", ".mk"):
            continue
        text = path.read_text()
        if re.search(r"field.notes|\.\./shared", text, re.IGNORECASE):
            outside.append(str(path.relative_to(root)))
        for cited in re.findall(r'docs/engine-facts\.md[:,]\s*((?:"[^"]+"(?:,\s*)?)+)', text):
            unknown += [f"{path.name}: {name}" for name in re.findall(r'"([^"]+)"', cited)
                        if not any(h.startswith(name) for h in headings)]
    assert outside == [] and unknown == []


def test_no_file_names_a_path_of_the_machine_it_was_written_on():
    """What the repository holds says where things are relative to it: no home, work or mount folder of
    the machine a file was written on, and no data file naming a temporary folder (the demo drafts' configs
    named the target they were trained beside as /tmp/...)."""
    import re
    import subprocess

    root = Path(__file__).resolve().parents[1]
    files = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True).stdout
    found = []
    for name in filter(None, files.split("\0")):
        path = root / name
        if path.suffix not in (".py", ".md", ".json", ".jsonl", ".yaml", ".txt", ".mk", ".ipynb", ".toml", ".cfg", ".sh") \
                or not path.is_file() or path.stat().st_size > 5_000_000:
            continue
        text = path.read_text(errors="replace")
        if re.search(r"(^|[^\w.~-])/(work|home|root|Users|mnt)/", text) or (path.suffix == ".json" and "/tmp/" in text):
            found.append(name)
    assert found == []


def test_notebooks_and_widgets_ask_the_one_verdict():
    """The notebooks and the widgets show what every command shows: `diagnose`, never the replay alone
    (which skips the checks beyond names and the values)."""
    root = Path(__file__).resolve().parents[1] / "lib" / "draftdoctor"
    for path in [*sorted((root / "notebooks").glob("*.ipynb")), root / "widgets.py"]:
        text = path.read_text()
        assert "import replay" not in text and "coverage.replay" not in text, path.name


def test_what_a_checkpoint_says_reaches_the_browser_as_text():
    """The places where text could become markup in a notebook are few and guarded, so a new one cannot
    slip in: DataFrames are made by `frames.frame` (MathJax off; pandas escapes cells), the one HTML
    widget holds `widgets._as_text` (escaped, MathJax off), and nothing renders HTML or Markdown built
    from a string. tests/test_lab_browser.py shows each guard holding in a real browser."""
    import re

    root = Path(__file__).resolve().parents[1] / "lib" / "draftdoctor"
    sinks = re.compile(r"import pandas|pd\.(DataFrame|Series)\(|\.to_html\(|escape=False|\bHTML\(|Markdown\(|"
                       r"Latex\(|Javascript\(|\.style\b|_repr_html_|description_allow_html")
    found = {}
    for path in [*root.rglob("*.py"), *sorted((root / "notebooks").glob("*.ipynb"))]:
        hits = [m.group(0) for m in sinks.finditer(path.read_text())]
        if hits:
            found[str(path.relative_to(root))] = set(hits)
    assert found == {"frames.py": {"import pandas", "pd.DataFrame("}, "widgets.py": {"HTML("}}, found
    widgets = (root / "widgets.py").read_text()
    assert re.findall(r"\w+\.value = .*", widgets) == ['count.value = f"{len(shown)} of {len(table)} rows"',
                                                         'verdict.value = _as_text("verdict:", report.verdict)  '
                                                         '# the verdict quotes tensor names']


# What a cloner cannot follow: notes kept outside the repository, a branch of another checkout, paths of one
# machine, and the numbers of an issue tracker the repository does not carry. Built from pieces, so this file
# does not name them itself. An issue of another project, named with it ("SGLang issue #27829",
# "sgl-project/sglang issue #27829"), is public and stays.
UNFOLLOWABLE = re.compile("|".join((r"field[ -]notes", "sglang" + "-sweep", r"(?<![\w.$}])/" + "work/")), re.IGNORECASE)
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")
PUBLIC_TRACKER = re.compile(r"(SGLang|sglang|vLLM|vllm|speculators|TorchSpec|AngelSlim|llama\.cpp|[\w.-]+/[\w.-]+) $")


def unfollowable(text: str) -> list[str]:
    """The citations in `text` a cloner of the repository cannot follow."""
    hits = [m.group(0) for m in UNFOLLOWABLE.finditer(text)]
    return hits + [m.group(0) for m in ISSUE.finditer(text) if not PUBLIC_TRACKER.search(text[max(0, m.start() - 60):m.start()])]


def tracked_files(root: Path) -> list[Path]:
    """The repository's files (git's list; outside a git checkout, every file but build output)."""
    import subprocess

    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout.decode().split("\0")
        return [root / n for n in names if n]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build", ".venv", "__pycache__"}
        return [p for p in root.rglob("*") if p.is_file() and not skip & set(p.relative_to(root).parts)]


def test_the_finder_of_unfollowable_citations_finds_each_kind():
    notes, sweep, work, issue = "fi\x65ld", "sglang\x2dsweep", "/w\x6frk/", "\x69ssue"
    assert unfollowable(f"as the {notes} notes §3 say; the {notes}-notes file") == [f"{notes} notes", f"{notes}-notes"]
    assert unfollowable(f"the {sweep} branch; {work}shared/x.md") == [sweep, work]
    assert unfollowable(f"({issue} 8 codes); I{issue[1:]} 5's; {issue}s 3 and 4; {issue} #12") == [
        f"{issue} 8", f"I{issue[1:]} 5", f"{issue}s 3", f"{issue} #12"]
    assert unfollowable(f"SGLang {issue} #27829; sgl-project/sglang {issue} #1; speculators {issue} #1114; $HOME{work}x") == []


def test_the_repository_cites_only_what_a_cloner_can_follow():
    """No file the repository carries cites notes outside it, another checkout's branch, a machine's paths or
    its own tracker's issue numbers: each says what it means, or points at a file inside the repository."""
    root = Path(__file__).resolve().parents[1]
    found = {}
    for path in tracked_files(root):
        try:
            text = path.read_bytes()[:2_000_000].decode()
        except (OSError, UnicodeDecodeError):
            continue  # binary (images, weights) or a link to a folder
        hits = unfollowable(text)
        if hits:
            found[str(path.relative_to(root))] = sorted(set(hits))
    assert found == {}, found


MAX_MODULE_LINES = 450


def test_no_module_is_longer_than_one_idea_fits():
    """Every module of the kit stays under MAX_MODULE_LINES lines: past that, a module has grown a second idea,
    and it is split by idea (the module table in docs/architecture.md has a row for each)."""
    lib = Path(__file__).resolve().parents[1] / "lib" / "draftdoctor"
    long = {str(p.relative_to(lib)): n for p in sorted(lib.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, long


def test_engine_releases_are_typed_below_the_edges():
    """An engine release is an `EngineRelease` below the edges: no parameter is a bare `engine: str`, and
    `resolve_engine(` is called only where the user's words enter (the CLI, notebook parameters, widgets, the
    entry points a notebook calls with a spec, a process's own command line, the engines package)."""
    import re

    lib = Path(__file__).resolve().parents[1] / "lib" / "draftdoctor"
    text = {str(p.relative_to(lib)): p.read_text() for p in sorted(lib.rglob("*.py"))}
    notebooks = {str(p.relative_to(lib)): p.read_text() for p in sorted(lib.rglob("*.ipynb"))}
    # a notebook's parameter that names only the program is `engine_name`, as everywhere else
    assert [name for name, t in (text | notebooks).items() if "engine: str" in t] == []
    edges = {"cli/arguments.py", "engines/__init__.py", "widgets.py", "diagnose.py", "fix.py", "compare.py",
             "serving/bench.py", "serving/sglang.py", "serving/vllm.py", "serving/llamacpp.py", "serving/reference.py",
             "reference/server.py", "reference/value_costs.py", "guard/__init__.py"}
    calls = {name for name, t in text.items() if re.search(r"(?<!def )resolve_engine\(", t)}
    assert calls <= edges, calls - edges
