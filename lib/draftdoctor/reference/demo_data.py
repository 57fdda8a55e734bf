"""Build data/demo/: a tiny Llama target, a speculators EAGLE-3 draft for it, and prompts.

Run as `python -m draftdoctor.reference.demo_data OUT_DIR` (what `make demo-data` does). Needs
transformers, tokenizers and speculators (requirements/speculators.txt); everything is trained on
CPU from a generated corpus (draftdoctor.reference.corpus) with fixed seeds, in a few minutes.

The draft is built, trained and saved by speculators' own Eagle3DraftModel, so its checkpoint has
exactly the layout the story broke on: `layers.0.*` keys, a nested speculators config, a reduced
draft vocabulary with `d2t`/`t2d`. A second draft, draft-speculators-nbr/, is trained the same way
(same seed, data and steps) with `norm_before_residual: true`, speculators' training default, which
SGLang cannot compute: the two differ only in that option.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from draftdoctor.reference import corpus

SEED = 1234
# head_dim 32 (2 heads of 64): vLLM's CPU attention kernels have no build for head_dim 16 (docs/engine-facts.md: "Real engines on these CPUs")
TARGET = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=6, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=512, rms_norm_eps=1e-5,
              tie_word_embeddings=False)
# speculators/vLLM convention: id k = input of target layer k. SGLang wants these minus one.
AUX_LAYER_IDS = [1, 3, 4]
DRAFT_VOCAB = 96  # of 114 words: covers about 97% of the corpus
SPECULATIVE_TOKENS = 4
# norm_before_residual per draft folder. speculators' training CLI defaults to true; SGLang has no
# equivalent, so the main demo draft is trained with the computation SGLang implements, and the
# nbr draft shows what the default costs there.
DRAFTS = {"draft-speculators": False, "draft-speculators-nbr": True}
N_PROMPTS = 40
# A second, wider pair (`--wide`): the value statistics (draftdoctor.values) must hold on trained
# matrices far larger than the demo's 64-wide ones, so one draft is trained at hidden 256 with another
# shape (4 heads of 64, an intermediate size that is no multiple of the hidden one, 4 target layers).
# Only the draft is committed (data/wide/draft, stored in bf16 as published drafts are); its target is
# the training's by-product.
WIDE_TARGET = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                   tie_word_embeddings=False)
WIDE_AUX_LAYER_IDS = [1, 2, 3]


def build_tokenizer(out: Path) -> dict[str, int]:
    """Word-level tokenizer over the toy vocabulary, saved as transformers tokenizer files."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(corpus.vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.save_pretrained(str(out))
    return vocab


def write_sentencepiece_model(target_dir: Path) -> Path:
    """tokenizer.model beside the word-level tokenizer.json: a SentencePiece WORD model whose pieces are
    exactly that vocabulary, in id order (unknown, control specials, the rest normal), so llama.cpp's
    converter takes its sentencepiece path (it cannot convert a WordLevel tokenizer: "BPE pre-tokenizer
    was not recognized"). Same tokenizer.json, same bytes. llama.cpp cannot tokenize text with it (no
    byte pieces): the kit sends it token ids, so every backend sees the same tokens."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    tok = json.loads((target_dir / "tokenizer.json").read_text())
    config = json.loads((target_dir / "config.json").read_text())
    vocab = tok["model"]["vocab"]
    by_id = {i: piece for piece, i in vocab.items()}
    if sorted(by_id) != list(range(config["vocab_size"])):
        raise ValueError(f"{target_dir}: tokenizer ids are not 0..vocab_size-1")
    unk, special = vocab[tok["model"]["unk_token"]], {a["id"] for a in tok.get("added_tokens", []) if a.get("special")}
    model = pb.ModelProto()
    for i in sorted(by_id):
        piece = model.pieces.add()
        piece.piece, piece.score = by_id[i], 0.0 if i in special else -float(i)
        piece.type = (pb.ModelProto.SentencePiece.UNKNOWN if i == unk else pb.ModelProto.SentencePiece.CONTROL
                      if i in special else pb.ModelProto.SentencePiece.NORMAL)
    spec = model.trainer_spec
    spec.model_type, spec.vocab_size = pb.TrainerSpec.WORD, len(by_id)
    spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = unk, config["bos_token_id"], config["eos_token_id"], -1
    spec.unk_piece, spec.bos_piece, spec.eos_piece = by_id[unk], by_id[spec.bos_id], by_id[spec.eos_id]
    model.normalizer_spec.name, model.normalizer_spec.add_dummy_prefix = "identity", False
    out = target_dir / "tokenizer.model"
    out.write_bytes(model.SerializeToString(deterministic=True))
    return out


def token_stream(vocab: dict[str, int], n_docs: int, seed: int) -> torch.Tensor:
    rng = random.Random(seed)
    ids = [vocab[w] for _ in range(n_docs) for w in corpus.document(rng, rng.randrange(2, 6))]
    return torch.tensor(ids)


def batches(stream: torch.Tensor, seq_len: int, batch: int, steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - seq_len, (batch,), generator=g)
        yield torch.stack([stream[s:s + seq_len] for s in starts.tolist()])


def train_target(out: Path, vocab: dict[str, int], log, shape: dict = TARGET) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=len(vocab), bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"],
                         **shape)
    model = LlamaForCausalLM(config)
    stream = token_stream(vocab, 4000, SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    steps = 1200
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    model.train()
    for step, x in enumerate(batches(stream, 64, 32, steps, SEED)):
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 250 == 0 or step == steps - 1:
            log(f"target step {step} loss {loss.item():.3f}")
    model.eval()
    model.save_pretrained(str(out))


def vocab_mapping(stream: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """speculators' t2d (bool [V]) and d2t (int64 [Vd], target id - draft id) for the most
    frequent DRAFT_VOCAB tokens of the corpus, in target-id order."""
    counts = Counter(stream.tolist())
    keep = sorted(t for t, _ in counts.most_common(DRAFT_VOCAB))
    if len(keep) < DRAFT_VOCAB:
        raise RuntimeError(f"corpus has only {len(keep)} distinct tokens, need {DRAFT_VOCAB}")
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[keep] = True
    d2t = torch.tensor(keep) - torch.arange(DRAFT_VOCAB)
    return t2d, d2t


def draft_examples(target_dir: Path, stream: torch.Tensor, n: int, seq_len: int,
                   aux_layer_ids=AUX_LAYER_IDS) -> list[dict]:
    """Target hidden states for n windows of the corpus, aligned by speculators' own shift_batch
    (token i + 1 with the aux states at i and the verifier's final state at i + 1)."""
    from speculators.models.eagle3.data import shift_batch

    from draftdoctor.eagle.llama import TargetModel

    target = TargetModel.from_dir(target_dir)
    capture = (*aux_layer_ids, target.n_layers)
    out = []
    for x in batches(stream, seq_len, 1, n, SEED + 1):
        _, states = target.forward(x[0], target.new_cache(), capture)
        out.append(shift_batch({
            "input_ids": x[0], "hidden_states": torch.cat(states[:-1], dim=-1),
            "verifier_last_hidden_states": states[-1], "loss_mask": torch.ones(seq_len),
            "lengths": torch.tensor([seq_len]), "position_ids": torch.arange(seq_len)}))
    return out


def train_draft(out: Path, target_dir: Path, verifier_name: str, vocab: dict[str, int], log,
                norm_before_residual: bool, aux_layer_ids=AUX_LAYER_IDS) -> None:
    """Build, train and save an EAGLE-3 draft with speculators' own Eagle3DraftModel."""
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.losses import resolve_loss_config
    from speculators.models import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    torch.manual_seed(SEED)
    layer_config = LlamaConfig.from_pretrained(str(target_dir))
    layer_config.num_hidden_layers = 1
    layer_config._attn_implementation = "sdpa"  # flex attention (the default) is GPU-oriented
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=norm_before_residual,
        eagle_aux_hidden_state_layer_ids=list(aux_layer_ids),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=SPECULATIVE_TOKENS)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(str(target_dir)),
        ),
    )
    model = Eagle3DraftModel(config)
    stream = token_stream(vocab, 2000, SEED + 2)
    t2d, d2t = vocab_mapping(stream, len(vocab))
    model.load_vocab_mappings(t2d, d2t)
    model.load_verifier_weights()

    seq_len, pack, steps = 64, 8, 1000
    examples = draft_examples(target_dir, stream, 800, seq_len, aux_layer_ids)
    log(f"{out.name}: {len(examples)} target hidden-state windows")
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=2e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    loss_config = resolve_loss_config("kl_div", "eager")  # the fused kernels need triton
    g = torch.Generator().manual_seed(SEED + 3)
    model.train()
    for step in range(steps):
        pick = torch.randint(0, len(examples), (pack,), generator=g).tolist()
        batch = {k: torch.cat([examples[i][k] for i in pick])[None]
                 for k in ("input_ids", "hidden_states", "verifier_last_hidden_states",
                           "position_ids")}
        docs = torch.arange(pack).repeat_interleave(seq_len - 1)[None]
        _, loss, metrics = model(
            hidden_states=batch["hidden_states"], input_ids=batch["input_ids"], document_ids=docs,
            position_ids=batch["position_ids"],
            verifier_last_hidden_states=batch["verifier_last_hidden_states"],
            ttt_steps=SPECULATIVE_TOKENS, loss_config=loss_config)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            accs = [metrics[f"full_acc_{k}_sum"] / metrics[f"full_acc_{k}_total"]
                    for k in range(SPECULATIVE_TOKENS)]
            log(f"{out.name} step {step} loss {loss.item():.3f} acc " +
                " ".join(f"{float(a):.2f}" for a in accs))
    model.eval()
    # The checkpoint names its verifier as a path relative to the repository, not this machine.
    model.config.speculators_config.verifier.name_or_path = verifier_name
    model.save_pretrained(str(out))
    # save_pretrained also copies speculators' own config-class source (config.py, for
    # trust_remote_code); it is third-party code, not checkpoint data, so it is not kept.
    (out / "config.py").unlink()


def write_story_draft(demo: Path) -> Path:
    """draft-story/: the speculators draft as the story's team served it in SGLang 0.5.10.

    SGLang cannot read speculators' nested config, so the team wrote the flat Llama config by
    hand (aux ids converted correctly) and kept the tensors as speculators saved them, with the
    `layers.0.*` names that 0.4.9-0.5.11 silently drop.
    """
    from draftdoctor.configrewrite import RECORD_KEY, rewrite_config
    from draftdoctor.engines import EngineRelease

    src, out = demo / "draft-speculators", demo / "draft-story"
    out.mkdir(exist_ok=True)
    shutil.copyfile(src / "model.safetensors", out / "model.safetensors")
    flat = rewrite_config(json.loads((src / "config.json").read_text()), EngineRelease.of("sglang", "0.5.10").profile).config
    flat.pop(RECORD_KEY, None)  # a hand-written config has no conversion record
    (out / "config.json").write_text(json.dumps(flat, indent=2) + "\n")
    return out


def to_bf16(folder: Path) -> None:
    """Rewrite folder/model.safetensors with every float32 tensor rounded to bfloat16, and the config's
    dtype fields (top level and the layer config's) so, as published drafts are stored. Idempotent."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = {k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    for part in (config, config.get("transformer_layer_config") or {}):
        for key in ("dtype", "torch_dtype"):
            if key in part:
                part[key] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_wide(out: Path, log) -> Path:
    """out/draft: a speculators draft of hidden 256 trained (as the demo's) against a hidden-256 target
    trained first under out/target; the target folder is removed afterwards (it is not committed)."""
    target_dir, draft_dir = out / "target", out / "draft"
    for folder in (target_dir, draft_dir):
        shutil.rmtree(folder, ignore_errors=True)
    target_dir.mkdir(parents=True)
    vocab = build_tokenizer(target_dir)
    train_target(target_dir, vocab, log, WIDE_TARGET)
    train_draft(draft_dir, target_dir, "target", vocab, log, False, WIDE_AUX_LAYER_IDS)
    to_bf16(draft_dir)
    shutil.rmtree(target_dir)
    return draft_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="output folder (the folders and files this writes are replaced; "
                                           "others, such as investigate.yaml, are kept)")
    ap.add_argument("--wide", action="store_true", help="write only the hidden-256 draft (WIDE_TARGET) to OUT/draft")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # tiny ops: a second thread only adds overhead
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    if args.wide:
        log(f"wrote {write_wide(args.out, log)}")
        return 0

    out: Path = args.out
    for name in ("target", *DRAFTS, "draft-story"):
        shutil.rmtree(out / name, ignore_errors=True)
    target_dir = out / "target"
    target_dir.mkdir(parents=True)
    vocab = build_tokenizer(target_dir)
    train_target(target_dir, vocab, log)
    write_sentencepiece_model(target_dir)
    for name, norm_before_residual in DRAFTS.items():
        train_draft(out / name, target_dir, "target", vocab, log, norm_before_residual)  # the demo folder's target
    write_story_draft(out)
    rng = random.Random(SEED)
    lines = [json.dumps({"prompt": p}) for p in corpus.prompts(rng, N_PROMPTS)]
    (out / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
