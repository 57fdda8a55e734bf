"""The target's side of a prediction: its own greedy continuation of a few prompts, and every hidden
state an engine would capture along it, from transformers.

Greedy verification accepts a draft token exactly when it equals the target's argmax after the tokens
before it, and the tokens committed are always the target's own greedy output. So one greedy
continuation per prompt, run once through the target with its hidden states recorded (teacher
forcing), holds everything the target would compute in every verify step of a speculative run: a
`Recorded` target answers the reference engine's calls by looking positions up
(`eagle.engine.speculative_generate` runs unchanged over it). The target runs in transformers, so
any architecture transformers builds works (Llama, Qwen3, DeepSeek and Kimi MLA, gpt-oss, ...), not
only the reference engine's own Llama; `tests/test_prediction.py` holds the two to each other.

Which hidden states: the *input* of decoder layer i (transformers' `hidden_states[i]`, what SGLang and
vLLM capture as aux state i), and for i = N, the last layer's output before the final norm (transformers'
`hidden_states[N]` has the norm applied: that one is taken from the last layer's forward hook).

Nothing is downloaded: the target is read from its folder (`local_files_only`), never with its own
code (`trust_remote_code=False`), and its size is estimated from its config, on the meta device, before
anything is loaded (`OverBudget` with the estimate when it does not fit the memory budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError
from ..resources import OverBudget, human, memory_budget


class TargetUnusable(UserError):
    """A target folder transformers cannot build or run (no weights, an unknown architecture)."""


@dataclass
class Recording:
    """One prompt and the target's greedy continuation of it, with what the target computes at every
    position of the whole sequence: its argmax (the next token) and the captured hidden states."""

    prompt: list[int]
    sequence: list[int]  # prompt + continuation
    argmax: torch.Tensor  # [len(sequence)] the target's next token after each position
    states: dict[int, torch.Tensor]  # layer i -> [len(sequence), hidden]: the input of layer i (i = N: last output)

    @property
    def continuation(self) -> list[int]:
        return self.sequence[len(self.prompt):]


class _Length:
    """The KV cache of a recorded target: only its length matters (what is committed)."""

    def __init__(self):
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def truncate(self, n: int) -> None:
        self.n = min(self.n, n)


@dataclass(frozen=True)
class _Shape:
    hidden: int


class Recorded:
    """A target that answers from a `Recording`, as `eagle.engine.speculative_generate` calls it:
    `forward(ids, cache, capture)` gives one-hot logits of the recorded argmax and the recorded states at
    the cache's next positions. Ids that leave the recorded sequence (a rejected draft token) are fine
    where nothing reads their outputs, as the engine reads the argmax only up to the first rejection;
    asked past the recording's end, it raises."""

    def __init__(self, recording: Recording, n_layers: int, hidden: int, vocab_size: int, dtype=torch.float32):
        self.recording, self.n_layers, self.vocab_size, self.dtype = recording, n_layers, vocab_size, dtype
        self.shape = _Shape(hidden)

    def new_cache(self) -> _Length:
        return _Length()

    def forward(self, ids: torch.Tensor, cache: _Length, capture: tuple[int, ...] = ()):
        start, end = cache.n, cache.n + len(ids)
        if end > len(self.recording.sequence):
            raise IndexError(f"positions {start}..{end - 1} are past the recorded {len(self.recording.sequence)}")
        cache.n = end
        logits = torch.nn.functional.one_hot(self.recording.argmax[start:end], self.vocab_size).to(self.dtype)
        return logits, [self.recording.states[i][start:end].to(self.dtype) for i in capture]


def config_of(target_dir: Path) -> dict:
    from ..checkpoint import read_json_file

    config = read_json_file(target_dir / "config.json")
    if not isinstance(config, dict):
        raise TargetUnusable(f"{target_dir / 'config.json'}: not a JSON object")
    return config


def estimate_bytes(target_dir: Path, dtype: torch.dtype, tokens: int) -> int:
    """What running the target takes: its parameters at `dtype` (counted by building the model from its
    config on the meta device, as transformers would build it), plus the hidden states of `tokens`
    positions for every layer and the logits, in float32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(target_dir, local_files_only=True, trust_remote_code=False)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as e:  # whatever its config's validators raise (a zero head count divides, an unknown dtype is
        # no attribute of torch, a string where a number goes fails huggingface_hub's check): the target's, said
        raise TargetUnusable(f"{target_dir}: transformers cannot build this target ({_first_line(e)})") from None
    params = sum(p.numel() for p in model.parameters())
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers, hidden, vocab = text.num_hidden_layers, text.hidden_size, text.vocab_size
    size = torch.finfo(dtype).bits // 8
    return params * size + 4 * tokens * (hidden * (layers + 2) + vocab)


def load_target(target_dir: Path, dtype: torch.dtype, device: str, tokens: int):
    """The target as a transformers model, on `device`, in `dtype`, in eval mode; refused with the
    estimate before loading when it does not fit the memory budget (on the CPU)."""
    from transformers import AutoModelForCausalLM

    need = estimate_bytes(target_dir, dtype, tokens)
    if device == "cpu" and need > memory_budget():
        raise OverBudget(f"{target_dir}: running this target for a prediction takes about {human(need)}, more than "
                         f"the memory budget of {human(memory_budget())} ($DRAFTDOCTOR_MEMORY_BUDGET): run it where it "
                         "fits (--device cuda), or pass --no-predict")
    from transformers.utils import logging

    kwargs = {"dtype": dtype, "local_files_only": True, "trust_remote_code": False}
    if device != "cpu":
        kwargs["device_map"] = "auto"  # transformers' and accelerate's placement over the devices there are
    logging.disable_progress_bar()  # its loading bar is not the kit's output
    try:
        model = AutoModelForCausalLM.from_pretrained(target_dir, **kwargs)
    except Exception as e:  # as estimate_bytes; also a generation_config.json nested past the parser
        raise TargetUnusable(f"{target_dir}: transformers cannot load this target ({_first_line(e)})") from None
    return model.eval()


def _first_line(e: BaseException) -> str:
    """An exception's message, its first line (at most 200 characters), or its class's name."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


# A target this small runs faster on one thread: its operations are tiny, and on 2 cores a second thread
# spends more on synchronising than it computes (the demo's target: 2.6 ms a step on two threads against
# 0.2 ms on one, measured). Larger targets get torch's threads.
ONE_THREAD_BELOW = 50_000_000  # parameters


def threads_for(model) -> int | None:
    """1 for a small target (see ONE_THREAD_BELOW), None (torch's choice) otherwise."""
    return 1 if sum(p.numel() for p in model.parameters()) < ONE_THREAD_BELOW else None


def tokenize(target_dir: Path, prompts: list[str]) -> list[list[int]]:
    """The prompts as the target's tokenizer encodes them for a completion request (special tokens as
    its post-processor adds them, as the servers do)."""
    tokenizer_file = target_dir / "tokenizer.json"
    if tokenizer_file.is_file():
        from tokenizers import Tokenizer

        from ..headers import open_regular

        with open_regular(tokenizer_file) as f:  # read bounded: tokenizers reads a whole file, any size
            raw = f.read(MAX_TOKENIZER_BYTES + 1)
        if len(raw) > MAX_TOKENIZER_BYTES:
            raise TargetUnusable(f"{tokenizer_file}: larger than {MAX_TOKENIZER_BYTES >> 20} MB; not a tokenizer")
        try:
            tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot read
            raise TargetUnusable(f"{tokenizer_file}: tokenizers cannot read it ({_first_line(e)})") from None
        return [tokenizer.encode(p).ids for p in prompts]
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True, trust_remote_code=False)
    except Exception as e:
        raise TargetUnusable(f"{target_dir}: transformers cannot read its tokenizer ({_first_line(e)})") from None
    return [tokenizer(p)["input_ids"] for p in prompts]


MAX_TOKENIZER_BYTES = 128 << 20  # a tokenizer.json, read whole: real ones hold tens of megabytes at most


def _decoder_layers(model):
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise TargetUnusable(f"{type(model).__name__}: its decoder has no `layers`, whose states an engine captures")
    return layers


BATCH = 16  # prompts decoded together: a step per token for a batch, not per token and prompt; memory bounded


@torch.no_grad()
def continuations(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Each prompt followed by the target's greedy continuation of it (`new_tokens` tokens, on past an
    end-of-sequence token: the engine replayed stops there), BATCH prompts decoded together, padded on
    the left."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(prompts), BATCH):
        batch = prompts[start:start + BATCH]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                   do_sample=False, eos_token_id=None, pad_token_id=0)
        out += [p + row[width:].tolist() for p, row in zip(batch, generated)]
    return out


@torch.no_grad()
def record(model, prompt: list[int], sequence: list[int], capture: tuple[int, ...]) -> Recording:
    """One forward over `sequence` (`prompt` and its continuation) recording the argmax and the states of
    `capture` at every position. Where that forward's argmax and the continuation part ways (a near tie
    decoded otherwise in the batch), the recording ends there, so that every recorded state follows from
    the recorded tokens."""
    device = next(model.parameters()).device
    sequence = torch.tensor(sequence, device=device)
    layers = _decoder_layers(model)
    last = {}
    hook = layers[-1].register_forward_hook(lambda module, args, output: last.__setitem__(
        "out", output[0] if isinstance(output, tuple) else output))
    try:
        out = model(sequence[None], output_hidden_states=True)
    finally:
        hook.remove()
    argmax = out.logits[0].float().argmax(-1).cpu()
    n = len(layers)
    states = {i: (out.hidden_states[i][0] if i < n else last["out"].reshape(len(sequence), -1)).float().cpu()
              for i in capture}
    agree = argmax[len(prompt) - 1:-1] == sequence[len(prompt):].cpu()
    kept = len(prompt) + (int(agree.long().argmin()) if not agree.all() else len(agree))
    return Recording(prompt, sequence[:kept].tolist(), argmax[:kept], {i: s[:kept] for i, s in states.items()})


def text_config(model) -> tuple[int, int, int]:
    """(layers, hidden size, vocabulary) of the target's text model."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return config.num_hidden_layers, config.hidden_size, config.vocab_size


def eos_of(target_dir: Path, model) -> int | None:
    """The end-of-sequence token the servers stop at (the generation config's, else the config's)."""
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if isinstance(eos, int):
            return eos
    return None


def fingerprint(target_dir: Path) -> str:
    """What a recording depends on in the target folder: its files' names, sizes and times."""
    import hashlib

    h = hashlib.sha256(str(target_dir.resolve()).encode())
    for f in sorted(p for p in target_dir.iterdir() if p.is_file()):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]

