"""The aux-layer-id convention, defined once (draftdoctor.auxids) and read through each engine's profile."""

from draftdoctor import auxids
from draftdoctor.engines import resolve_engine

SGLANG_STYLE = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}}
SPECULATORS_STYLE = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}


def test_places_and_conventions():
    assert auxids.find(SGLANG_STYLE) == ([0, 2, 3], auxids.EAGLE_CONFIG)
    assert auxids.find(SPECULATORS_STYLE) == ([1, 3, 4], auxids.TOP_LEVEL)
    assert auxids.find({"eagle_config": []}) == (None, None)
    # both name the inputs of target layers 1, 3 and 4
    assert auxids.trained_layers([0, 2, 3], auxids.EAGLE_CONFIG) == auxids.trained_layers([1, 3, 4], auxids.TOP_LEVEL)
    assert auxids.convert([1, 3, 4], auxids.TOP_LEVEL, auxids.EAGLE_CONFIG) == [0, 2, 3]
    assert auxids.convert([0, 2, 3], auxids.EAGLE_CONFIG, auxids.TOP_LEVEL) == [1, 3, 4]
    assert auxids.default_layers(32) == (2, 16, 29)


def test_each_engine_captures_by_its_profile():
    sglang = resolve_engine("sglang==0.5.10").profile.aux
    vllm = resolve_engine("vllm==0.32.0").profile.aux
    vllm_v1 = resolve_engine("vllm==0.22.0").profile.aux
    # SGLang reads only eagle_config and adds 1; a top-level list is ignored for its defaults
    assert sglang.captured_layers(SGLANG_STYLE, 6) == (1, 3, 4)
    assert sglang.captured_layers(SPECULATORS_STYLE, 32) == (2, 16, 29)
    # vLLM's default runner reads only the top level, as-is
    assert vllm.captured_layers(SPECULATORS_STYLE, 6) == (1, 3, 4)
    assert vllm.captured_layers(SGLANG_STYLE, 32) == (2, 16, 29)
    # 0.22's V1 runner falls back to eagle_config's, as-is: one layer below SGLang's reading
    assert vllm_v1.captured_layers(SGLANG_STYLE, 6) == (0, 2, 3)
