"""Speculative decoding on CPU the way SGLang's EAGLE worker does it (topk 1, greedy).

One request at a time:
- prefill: the target runs the prompt, capturing aux hidden states; its argmax is the first
  output token (counted in completion_tokens, as SGLang does, but not a verify step);
- draft extend: the draft runs over the committed positions p with (aux state at p, token p+1)
  at position p, filling its KV cache; the last position gives the first draft token;
- draft decode: num_steps - 1 more chain steps on the draft's own hidden state, step i at rope
  position committed_len + chain_offset + i (`ServedDraft.chain_position_offset`: SGLang up to 0.5.11 1; from 0.5.12, vLLM and llama.cpp 0);
  these KV entries are dropped afterwards;
- verify: the target runs [pending token, d1..dS] (S + 1 = speculative_num_draft_tokens) and
  accepts the longest prefix of drafts equal to its own argmax, plus one bonus token; rejected
  KV entries are dropped; then the draft extends over the accepted positions.

Accepted drafts are counted three ways, one per engine's counters: as emitted (a stop, EOS or the
token budget, cuts the last step short: SGLang's log line and /server_info); as the target accepted
them, stop or not (vLLM's counters, scheduler.py `num_accepted` before its stop check; SGLang's
per-request meta_info counts, eagle_info.py `accepted_draft_tokens` from the row before the finish
cut); and those before an accepted EOS (llama.cpp: `common_sampler_sample_and_accept_n` stops at an
end-of-generation draft and counts it as the target's own token, except the step's last draft, which
it keeps as accepted). `ServedDraft.counts_accepted` says which.

Aux hidden states: the caller passes the target layers whose input the emulated release captures
(`AuxCapture.captured_layers`, from `draftdoctor.auxids`). Each layer is captured once, so on a 6-layer
target SGLang's default [2, 3, 3] gives two aux states where the draft's fc needs three:
`CaptureMismatch`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftdoctor.eagle.draft import EagleDraft
from draftdoctor.eagle.llama import TargetModel


@dataclass
class GenerateResult:
    """Tokens and speculative-decoding counters of one request (SGLang's meta_info fields)."""

    output_ids: list[int]
    spec_verify_ct: int
    accepted_per_position: list[int]  # verify steps whose draft token i was accepted and emitted
    num_steps: int
    accepted_before_stop: list[int]  # verify steps whose draft token i the target accepted, stop or not
    # ... and was not an accepted EOS, nor after one, but for the step's last draft (llama.cpp's count)
    accepted_before_eos: list[int]

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def accepted_drafts(self) -> int:
        return sum(self.accepted_per_position)

    @property
    def accept_length(self) -> float:
        """SGLang's meta_info spec_accept_length: completion_tokens / spec_verify_ct.

        It counts the prefill token too, so a dead draft scores 1 + 1/spec_verify_ct."""
        return self.completion_tokens / self.spec_verify_ct if self.spec_verify_ct else 0.0

    def counted(self, how: str) -> list[int]:
        """Accepted drafts per position as an engine's counters count them (`ServedDraft.counts_accepted`)."""
        return {"before_stop": self.accepted_before_stop, "before_eos": self.accepted_before_eos,
                "emitted": self.accepted_per_position}[how]

    @property
    def accepted_drafts_before_stop(self) -> int:
        return sum(self.accepted_before_stop)

    @property
    def step_accept_length(self) -> float:
        """Tokens per verify step, as the "Decode batch" log line and /server_info count them:
        (accepted drafts + one bonus per step) / steps; exactly 1.00 for a dead draft."""
        return (self.accepted_drafts + self.spec_verify_ct) / self.spec_verify_ct \
            if self.spec_verify_ct else 0.0

    @property
    def strict_accept_rate(self) -> float:
        """Accepted draft tokens / proposed draft tokens (SGLang's per-request spec_accept_rate)."""
        proposed = self.spec_verify_ct * self.num_steps
        return self.accepted_drafts / proposed if proposed else 0.0


class CaptureMismatch(ValueError):
    """The target layers captured do not give the draft's fc the number of aux states it needs;
    SGLang gets a matrix-shape error the first time the draft runs."""


def _stop(tokens: list[int], budget: int, eos: int | None) -> tuple[list[int], bool]:
    """Cut new tokens at the remaining budget or just after EOS; say whether generation ends."""
    kept = tokens[:budget]
    if eos is not None and eos in kept:
        return kept[:kept.index(eos) + 1], True
    return kept, len(kept) == budget


def greedy_generate(target: TargetModel, prompt_ids: list[int], max_new_tokens: int,
                    eos_token_id: int | None = None) -> list[int]:
    """Plain greedy decoding with the target alone, one token per forward."""
    cache = target.new_cache()
    logits, _ = target.forward(torch.tensor(prompt_ids), cache)
    out: list[int] = []
    while True:
        new, done = _stop([int(logits[-1].argmax())], max_new_tokens - len(out), eos_token_id)
        out += new
        if done:
            return out
        logits, _ = target.forward(torch.tensor(new), cache)


def speculative_generate(target: TargetModel, draft: EagleDraft, capture: tuple[int, ...],
                         prompt_ids: list[int], max_new_tokens: int, num_steps: int,
                         eos_token_id: int | None = None, *, chain_offset: int,
                         drafts_within_budget: bool = False, aux_repeats: bool = False) -> GenerateResult:
    """Greedy EAGLE-3 chain speculation (topk 1, num_steps drafts + 1 per verify); `chain_offset`:
    the emulated engine's `ServedDraft.chain_position_offset`; `drafts_within_budget`: its
    `ServedDraft.drafts_within_budget` (a step drafts no more than the token budget has room for);
    `aux_repeats`: its `AuxCapture.aux_repeats` (a layer named twice is captured twice, in the ids' order)."""
    if num_steps < 1:
        raise ValueError("num_steps must be at least 1")
    # SGLang tests `i in layers_to_capture` while looping over its layers: each layer once, in order;
    # llama.cpp copies the state of each id it was given, a repeated one again
    layers = tuple(sorted({i for i in capture if 0 <= i < target.n_layers}))
    order = sorted(i for i in capture if 0 <= i < target.n_layers) if aux_repeats else list(layers)
    if len(order) * target.shape.hidden != draft.shape.fc_in:
        raise CaptureMismatch(f"capturing the input of target layers {list(capture)} gives {len(order)} "
                              f"{'' if aux_repeats else 'distinct '}aux states, the draft's fc needs "
                              f"{draft.shape.fc_in // target.shape.hidden}")
    picks = [layers.index(i) for i in order]  # the captured states, in the order fc takes them
    capture = layers
    tcache, dcache = target.new_cache(), draft.new_cache()
    prompt = torch.tensor(prompt_ids)
    logits, aux = target.forward(prompt, tcache, capture)
    aux = [aux[i] for i in picks]
    out, done = _stop([int(logits[-1].argmax())], max_new_tokens, eos_token_id)
    verify_ct, accepted, accepted_before_stop, accepted_before_eos = 0, [0] * num_steps, [0] * num_steps, [0] * num_steps
    # draft extend over the prompt: position p gets (aux at p, token p + 1)
    ext_ids, ext_hidden, ext_start = torch.cat([prompt[1:], torch.tensor(out[-1:])]), aux, 0
    while not done:
        k = min(num_steps, max_new_tokens - len(out) - 1) if drafts_within_budget else num_steps
        if k < 1:  # no room for a draft: the target decodes the last token alone, no verify step
            logits, _ = target.forward(torch.tensor(out[-1:]), tcache, capture)
            new, done = _stop([int(logits[-1].argmax())], max_new_tokens - len(out), eos_token_id)
            out += new
            continue
        dlogits, dhidden = draft.forward(ext_ids, torch.cat(ext_hidden, dim=-1),
                                         torch.arange(ext_start, ext_start + len(ext_ids)), dcache)
        committed = len(tcache)
        drafts = [draft.to_target_ids(dlogits[-1].argmax())]
        hidden = dhidden[-1:]
        for i in range(k - 1):
            dlogits, dhidden = draft.forward(drafts[-1].view(1), hidden,
                                             torch.tensor([committed + chain_offset + i]), dcache)
            drafts.append(draft.to_target_ids(dlogits[-1].argmax()))
            hidden = dhidden[-1:]
        dcache.truncate(committed)

        verify = torch.stack([torch.tensor(out[-1]), *drafts])
        logits, aux = target.forward(verify, tcache, capture)
        aux = [aux[i] for i in picks]
        pred = logits.argmax(dim=-1).tolist()
        n_acc = 0
        while n_acc < k and int(drafts[n_acc]) == pred[n_acc]:
            n_acc += 1
        new, done = _stop(pred[:n_acc + 1], max_new_tokens - len(out), eos_token_id)
        verify_ct += 1
        drafted = [int(d) for d in drafts[:n_acc]]
        eos_at = drafted.index(eos_token_id) if eos_token_id in drafted else None
        before_eos = n_acc if eos_at is None or eos_at == k - 1 else eos_at
        for i in range(n_acc):
            accepted_before_stop[i] += 1
            accepted[i] += i < len(new)
            accepted_before_eos[i] += i < before_eos
        out += new
        tcache.truncate(committed + n_acc + 1)
        # draft extend over the accepted positions: (aux at t, token t + 1)
        ext_ids = torch.tensor(pred[:n_acc + 1])
        ext_hidden = [a[:n_acc + 1] for a in aux]
        ext_start = committed
    return GenerateResult(out, verify_ct, accepted, num_steps, accepted_before_stop, accepted_before_eos)
