"""Replay profiles against SGLang's own loaders: on a corpus of checkpoints they must agree on every
parameter's status and every finding code, for each supported release. Where they disagree, the
profile is wrong (issue 4). Needs `make sglang-loaders` (run by `make test`); fails in CI without it."""

import numpy as np
import pytest
from conftest import require_release

from draftdoctor.checkpoint import open_checkpoint
from draftdoctor.coverage import replay
from draftdoctor.synth import DraftShape

realload = pytest.importorskip("draftdoctor.realload")
from draftdoctor.realcheck import real_checks  # noqa: E402

H, I = 64, 128
CORPUS = {
    "speculators-layout": dict(layout="speculators", config="flat"),
    "midlayer-layout": dict(layout="midlayer"),
    "model-prefixed": dict(layout="prefixed"),
    "missing-lm-head": dict(layout="midlayer", drop=("lm_head.weight",)),
    "extra-fc-bias": dict(layout="midlayer", extra={"fc.bias": np.zeros(H, dtype=np.float16)}),
    "two-decoder-layers": dict(layout="speculators", config="flat", shape=DraftShape(num_layers=2)),
    "wrong-fc-shape": dict(layout="midlayer", extra={"fc.weight": np.zeros((H, 2 * H), dtype=np.float16)}),
    "narrow-down-proj": dict(layout="midlayer", extra={"midlayer.mlp.down_proj.weight": np.zeros((H, I - 32), dtype=np.float16)}),
    "speculators-nested-config": dict(layout="speculators"),
}


@pytest.mark.parametrize("release", realload.SUPPORTED_RELEASES)
def test_replay_and_real_loader_agree(draft, release):
    require_release(release)
    folders = {name: draft(**spec) for name, spec in CORPUS.items()}
    engine = f"sglang=={release}"
    reals = real_checks(list(folders.values()), engine)
    disagreements = []
    for (name, folder), real in zip(folders.items(), reals):
        played = replay(open_checkpoint(folder), engine)
        want = {p.name: p.status for p in played.params}
        got = {p.name: p.status for p in real.params}
        if want != got:
            diff = {n: (want.get(n), got.get(n)) for n in want.keys() | got.keys() if want.get(n) != got.get(n)}
            disagreements.append(f"{name}: parameter statuses (replay, real) differ: {diff}")
        codes_want = sorted({(f.code, f.severity) for f in played.findings})
        codes_got = sorted({(f.code, f.severity) for f in real.findings})
        if codes_want != codes_got:
            disagreements.append(f"{name}: findings replay {codes_want} != real {codes_got}\n"
                                 f"  real says: {[f.message for f in real.findings]}")
    assert not disagreements, "\n".join(disagreements)


def test_reference_backend_weights_are_the_same_with_the_real_loader():
    """`--loader real` and `--loader replay` hand the reference engine the very same draft."""
    from pathlib import Path

    torch = pytest.importorskip("torch")
    from draftdoctor.reference.llama import TargetModel
    from draftdoctor.reference.loading import load_for_engine

    require_release("0.5.10")
    demo = Path(__file__).resolve().parents[1] / "data" / "demo"
    target = TargetModel.from_dir(demo / "target")
    real = load_for_engine(demo / "draft-story", "sglang==0.5.10", target, loader="real")
    played = load_for_engine(demo / "draft-story", "sglang==0.5.10", target, loader="replay")
    assert real.written == played.written and len(real.written) == 4
    assert all(torch.equal(real.draft.params[k], played.draft.params[k]) for k in played.draft.params)
