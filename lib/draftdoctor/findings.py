"""The registry of finding codes: stable names, severities, and what each means for a user.

Codes are part of the kit's interface (README, `--format json`, tests): never rename one. Each entry
says how bad it is, what it means in words a new engineer understands, and what `fix` can do.
"""

from __future__ import annotations

from dataclasses import dataclass

ERROR, WARNING, INFO = "error", "warning", "info"


@dataclass(frozen=True)
class Code:
    """A registered finding code: its severity (error, warning or info), its meaning, its remedy."""

    severity: str
    meaning: str
    remedy: str


CODES = {
    "dropped-keys": Code(
        ERROR,
        "checkpoint tensors that the engine's loader matches to no parameter and discards; the weights "
        "they carry never reach the model",
        "`draftdoctor fix` renames keys to the engine's names",
    ),
    "uninitialized-params": Code(
        ERROR,
        "engine parameters that no checkpoint tensor writes; they keep their initial (random or "
        "constant) values, so the draft runs but predicts noise and acceptance collapses",
        "`draftdoctor fix` when the weights are present under other names; otherwise retrain or re-export",
    ),
    "shape-mismatch": Code(
        ERROR,
        "a tensor whose shape does not fit the parameter it loads into; the engine stops with an "
        "assertion while loading",
        "check the draft config (hidden size, heads, vocab sizes, aux layer count) against the checkpoint",
    ),
    "loader-crash": Code(
        ERROR,
        "the engine's loader raises while building or loading the draft: the server does not start",
        "see the message; `draftdoctor fix` handles naming and config causes",
    ),
    "config-unreadable": Code(
        ERROR,
        "the engine cannot read the draft's config.json (wrong format, architecture or missing fields); "
        "the server does not start",
        "`draftdoctor fix` writes the config format the engine reads",
    ),
    "lossy-config": Code(
        ERROR,
        "the draft's config sets an option the engine does not implement (e.g. norm_before_residual in "
        "SGLang); served there, the draft computes differently than it was trained",
        "serve it with an engine that implements the option, or `draftdoctor fix --allow-lossy` to accept the loss",
    ),
    "config-defaulted": Code(
        WARNING,
        "the config `fix` wrote needs a value the source config does not have; a documented default was used",
        "check the value in the written config.json and correct it if you know better",
    ),
    "dims-from-tensors": Code(
        WARNING,
        "a field the draft's dimensions are read from (hidden size, heads, intermediate size, vocabulary, layer "
        "count) is missing from config.json or null, so the kit took the dimensions from the tensors' shapes "
        "(head_dim guessed unless a q norm gives it); the engine builds from the config, so what it does may differ",
        "write the field into config.json with the value the draft was trained with",
    ),
    "rename-collision": Code(
        ERROR,
        "two checkpoint tensors would get the same name; one would overwrite the other",
        "remove the duplicate tensor from the source checkpoint",
    ),
    "written-twice": Code(
        ERROR,
        "two checkpoint tensors load into the same parameter (or the same shard of it); the engine serves "
        "whichever it reads last, and no error is raised",
        "keep one of them: `draftdoctor compare` shows whether their values differ; remove the other from the "
        "source checkpoint",
    ),
    "class-unregistered": Code(
        ERROR,
        "the engine release registers no EAGLE-3 draft class for this draft's architecture (e.g. MLA, or Qwen3 "
        "with q/k norms, in a release without such a class): no renaming makes it load as it was trained",
        "serve it with an engine release that registers the class (the finding names them, from the profile rows)",
    ),
    "replay-not-modelled": Code(
        WARNING,
        "the engine builds a draft class (MLA, Qwen3 with q/k norms) whose loading the replay does not model: "
        "nothing about the weights was checked",
        "`draftdoctor check --loader real`: the engine release's own loader, run here",
    ),
    # --- what the loaded draft does (draftdoctor.predict) ---
    "predicted-acceptance": Code(
        INFO,
        "the accept length the draft is predicted to get, loaded as the engine release loads it and run on the "
        "target's own greedy continuations of a few prompts (teacher-forced), with its sampling error; a warning "
        "while that error does not place it clear of the bound under which it is an error",
        "nothing to do; compare it with what `draftdoctor bench` measures (a warning: more prompts tell)",
    ),
    "no-acceptance-predicted": Code(
        ERROR,
        "loaded as the engine release loads it and run on the target's own greedy continuations, the draft "
        "predicts essentially nothing: an accept length a draft without a trained decoder layer reaches. Its "
        "names may all load; its values carry no training the engine can use (re-drawn, transposed, "
        "non-finite, a permuted vocabulary map, the wrong aux layers, ...)",
        "compare it with the training output (`draftdoctor compare TRAINED THIS` names the tensors that differ "
        "and how) and re-export from it; no rewrite of names or config restores values",
    ),
    # --- beyond names (draftdoctor.checks) ---
    "not-checked": Code(
        INFO,
        "checks that need the target's config were not run (no --target): the draft's fit to the target "
        "(hidden size, vocabulary) and whether its aux layer ids are layers the engine can capture",
        "give --target TARGET (its folder or config.json)",
    ),
    "aux-layer-ids": Code(
        ERROR,
        "aux hidden-state layer ids where the engine does not read them, in the other engine's convention "
        "(SGLang captures id + 1), or outside the target's layers: the draft sees other layers than it was trained on",
        "`draftdoctor fix` moves and converts them for the engine",
    ),
    "aux-layer-uncapturable": Code(
        ERROR,
        "aux layer ids naming target layers the engine cannot capture (SGLang cannot capture the input of layer 0, "
        "no engine a layer beyond the target's), or fewer distinct layers than fc was trained on: the server "
        "starts, then the first draft step fails",
        "ids the engine ignores: `draftdoctor fix` moves them where it reads them; ids it reads: no rewrite can "
        "fix it, serve on an engine that captures those layers (vLLM captures layer 0's input) or retrain with "
        "other aux layer ids",
    ),
    "norm-before-residual": Code(
        ERROR,
        "trained with norm_before_residual: true (speculators' default), which the engine cannot compute",
        "serve with an engine that implements it (vLLM), or retrain with norm_before_residual: false",
    ),
    "qk-norm-unsupported": Code(
        ERROR, "q/k norms (qwen3-style drafts) that the engine's Llama EAGLE-3 draft does not apply",
        "serve with an engine release whose draft class has q/k norms (the finding names them, from the profile rows)",
    ),
    "fc-norm-unsupported": Code(
        ERROR, "per-aux-layer norms before fc (fc_norm) that this engine release does not apply",
        "serve with an engine release that applies it (the finding names them, from the profile rows)",
    ),
    "input-norm-unsupported": Code(
        ERROR, "a norm over the concatenated aux states (norm_before_fc) that this engine release does not apply",
        "serve with an engine release that applies it (the finding names them, from the profile rows)",
    ),
    "norm-output-unsupported": Code(
        ERROR, "trained to feed its post-norm state back to the next step (norm_output, EAGLE 3.1), which this "
               "engine release does not do: it feeds the pre-norm state back",
        "serve with an engine release that applies it (the finding names them, from the profile rows)",
    ),
    "norm-flag-missing": Code(
        ERROR, "the checkpoint holds a norm's tensors (fc_norm, input_norm) but the config does not set the flag that "
               "makes the engine build that norm: its keys are skipped, or refused, and the draft computes without it",
        "`draftdoctor fix` sets the flag where the engine reads it",
    ),
    "norm-output-ambiguous": Code(
        WARNING, "norm_output: true in SpecForge's export, whose meaning SpecForge changed in 2026-09: the checkpoint "
                 "does not say whether the draft expects the pre-norm or the post-norm state fed back",
        "measure acceptance (`draftdoctor bench`), also with norm_output: false where the release reads it",
    ),
    "vocab-map-missing": Code(
        ERROR, "a reduced draft vocabulary without d2t: draft ids are read as target ids",
        "re-export the draft with its d2t/t2d tensors",
    ),
    "vocab-map-invalid": Code(
        ERROR, "d2t/t2d that do not form a valid draft-to-target map (length, range, order, agreement)",
        "rebuild the vocabulary map from the training data",
    ),
    "lm-head-missing": Code(
        ERROR, "draft_vocab_size declared but no lm_head: the engine's head stays at initial values",
        "export lm_head.weight; or, if the draft was trained with the target's own head and its vocabulary is the "
        "target's, `draftdoctor fix --head-from-target` writes draft_vocab_size: null so the engine takes the target's",
    ),
    "embed-missing": Code(
        INFO, "no embedding in the checkpoint; fine where the engine uses the target's",
        "nothing, unless the draft's hidden size differs from the target's",
    ),
    "target-mismatch": Code(
        ERROR, "a draft whose shapes or limits do not fit the target it is served with",
        "check that the draft was trained for this target",
    ),
    "algorithm-mismatch": Code(
        ERROR, "an EAGLE-3 draft launched with --speculative-algorithm EAGLE: fc is skipped, accept length is 1.00",
        "launch with --speculative-algorithm EAGLE3",
    ),
    "nan-weights": Code(
        ERROR, "tensors holding a NaN or an infinity anywhere in what is read (or all zero: a warning): one "
               "non-finite value spreads to every prediction",
        "load the verifier's weights before saving (speculators: load_verifier_weights), then save again",
    ),
    "dtype-mislabelled": Code(
        ERROR, "a matrix whose bytes are the other 16-bit float type's than its header says (bf16 bytes labelled F16, "
               "or fp16 bytes labelled BF16): the engine reads every value wrong",
        "write the header's dtype as the type the bytes were saved in (the bytes are right)",
    ),
    "weights-at-init": Code(
        ERROR,
        "tensors the engine serves with that hold no training: a matrix indistinguishable from i.i.d. noise or "
        "orthogonal (whatever its initialiser), a constant matrix, an identity vocabulary map for a reduced "
        "vocabulary; a norm of one constant alone is a warning (it costs little, as measured); info when the "
        "engine replaces the tensor with the target's",
        "`draftdoctor compare` the training output with this copy: re-export from the trained weights, "
        "with strict name matching in the converter",
    ),
}


@dataclass(frozen=True)
class Finding:
    """One thing a check found: a registered `code` (see CODES), its `severity` (error | warning |
    info), and a message naming the file, tensor or field concerned."""

    code: str
    severity: str
    message: str

    def line(self, escape=str) -> str:
        """The finding as every command and notebook prints it: "ERROR   code: message" (`escape`: how
        the message is made safe for where it goes)."""
        return f"{self.severity.upper():7} {self.brief(escape)}"

    def brief(self, escape=str) -> str:
        """"code: message", where the severity is already said (a refusal lists its errors)."""
        return f"{self.code}: {escape(self.message)}"


def finding(code: str, message: str, severity: str | None = None) -> Finding:
    """A finding of a registered code, with the code's severity unless overridden."""
    return Finding(code, severity or CODES[code].severity, message)
