"""Record what an engine's own `load_weights` really did to a freshly built model (child process only).

Three independent observations, so that one can check another:
- every parameter is filled with a sentinel NaN bit pattern first; afterwards the elements that no
  longer carry it were written (CPU builds only; a `meta` build has no data);
- every weight loader the model's `load_weights` can reach (each parameter's `weight_loader` attribute
  and the `default_weight_loader` fallback in the function's globals) is wrapped to log which
  checkpoint key wrote which parameter, and which shard (q/k/v, 0/1) of a fused parameter;
- the model's plain attributes are compared before and after each key, which shows keys turned into
  attributes (`d2t` becomes `hot_token_id`).
"""

import hashlib

import torch

# NaN with a payload no checkpoint writer produces (canonical NaNs carry 0x7E00 / 0x7FC0 / 0x7FC00000).
_SENTINELS = {
    torch.float16: (torch.int16, 0x7E5A),
    torch.bfloat16: (torch.int16, 0x7FA5),
    torch.float32: (torch.int32, 0x7FC5A5A5),
    torch.float64: (torch.int64, 0x7FF8A5A5A5A5A5A5),
}
PENDING_BYTES = 1 << 30  # unconsumed keys kept for the fused-write check, at most
# Elements compared with the sentinel at a time: a whole 128k-vocabulary embedding at once made a bool
# tensor, and `.sum()` an int64 copy of it, 4.5 GB beside a 1 GB parameter.
_COUNT_CHUNK = 1 << 24
# Weight-loader names a model's load_weights falls back to when a parameter has no `weight_loader`.
_FALLBACK_LOADERS = ("default_weight_loader",)


def _dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


class LoadRecorder:
    """Instruments one model for one `load_weights` call; `report()` returns the observations."""

    def __init__(self, model, fused_shards, loader_modules=(), hold_tensors=False, digests=True):
        """`fused_shards(module)` returns the shard ids a fused module expects, or None;
        `loader_modules`: modules besides the model classes' own whose fallback loaders
        `load_weights` reaches (vLLM's AutoWeightsLoader lives in `models/utils`);
        `hold_tensors`: attribute a write to the key whose tensor it writes, for a `load_weights`
        that reads every key before writing any (vLLM's EAGLE-3 does; it holds them all anyway);
        `digests`: a sha256 of each parameter in the report (the guard, on a served draft, skips them)."""
        self.model = model
        self.digests = digests
        self.hold_tensors = hold_tensors
        self.loader_modules = tuple(loader_modules)
        self.params = dict(model.named_parameters())
        self.real = all(p.device.type != "meta" for p in self.params.values())
        self.writes = {name: [] for name in self.params}
        self.expected_shards = {}
        for name in self.params:
            owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            shards = fused_shards(owner)
            if shards is not None:
                self.expected_shards[name] = [str(s) for s in shards]
        self.keys = []
        self.exhausted = False
        self._current = None
        self._attrs_before = None
        self._name_of = {id(p): n for n, p in self.params.items()}
        self._by_tensor = {}  # id of a yielded tensor -> its key's entry
        self._pending, self._pending_bytes = [], 0  # unconsumed keys' (entry, tensor), for fused writes
        self._saved = []  # (module globals, {name: original loader})

    # -- instrumentation -------------------------------------------------------------------------
    def prepare(self, keep_initial_bytes=0):
        """Fill parameters with the sentinel and wrap every weight loader. `keep_initial_bytes`: keep
        the initial values of parameters up to that size, for `restore_unwritten` (a served model)."""
        self._initial = {}
        if self.real:
            with torch.no_grad():
                for name, p in self.params.items():
                    if p.dtype in _SENTINELS and p.numel() * p.element_size() <= keep_initial_bytes:
                        self._initial[name] = p.data.clone()
                    if p.dtype in _SENTINELS:
                        int_dtype, bits = _SENTINELS[p.dtype]
                        p.data.view(int_dtype).fill_(bits)
        for name, p in self.params.items():
            loader = getattr(p, "weight_loader", None)
            if loader is not None:
                p.weight_loader = self._wrap(loader, fixed_name=name)
        # Every load_weights in the class hierarchy: a subclass may hand keys to its base class's loader.
        places = [getattr(cls.__dict__.get("load_weights"), "__globals__", None) for cls in type(self.model).__mro__]
        for module_globals in places + [vars(m) for m in self.loader_modules]:
            if module_globals is None or any(g is module_globals for g, _ in self._saved):
                continue
            saved = {name: module_globals[name] for name in _FALLBACK_LOADERS if name in module_globals}
            self._saved.append((module_globals, saved))
            for name, loader in saved.items():
                module_globals[name] = self._wrap(loader)

    def restore_unwritten(self):
        """Give the elements no load wrote back their initial values (kept by `prepare`), so that a model
        served after recording computes what it would have without it (a vocabulary map whose initial
        value is right). Returns the names of parameters still holding the sentinel somewhere."""
        left = []
        with torch.no_grad():
            for name, p in self.params.items():
                if p.device.type == "meta" or p.dtype not in _SENTINELS:
                    continue
                int_dtype, bits = _SENTINELS[p.dtype]
                flat = p.data.view(int_dtype).reshape(-1)
                if not any(bool((chunk == bits).any()) for chunk in flat.split(_COUNT_CHUNK)):
                    continue
                if name in self._initial:  # small: a mask of it is small too
                    unwritten = p.data.view(int_dtype) == bits
                    p.data[unwritten] = self._initial[name][unwritten]
                else:
                    left.append(name)
        self._initial = {}
        return left

    def restore(self):
        """Put the module-level fallback loaders and the parameters' own loaders back (the next
        checkpoint gets a fresh recorder; a served model keeps no reference to this one)."""
        for module_globals, saved in self._saved:
            module_globals.update(saved)
        for p in self.params.values():
            loader = getattr(p, "weight_loader", None)
            if getattr(loader, "__self_recorder__", None) is self:
                p.weight_loader = loader.__wrapped__

    def _wrap(self, loader, fixed_name=None):
        def recorded(param, loaded_weight, *args, **kwargs):
            name = fixed_name or self._name_of.get(id(param), "<not a parameter of the model>")
            shard = args[0] if args else next(iter(kwargs.values()), None)
            # the key whose tensor this is: vLLM's EAGLE-3 load_weights collects every key before
            # loading any, so the key being iterated is not the one being written
            entry = self._by_tensor.get(id(loaded_weight), self._current)
            write = {"key": entry["key"] if entry else None, "shard": None if shard is None else str(shard), "ok": False}
            self.writes.setdefault(name, []).append(write)
            loader(param, loaded_weight, *args, **kwargs)
            write["ok"] = True
            if entry is not None:  # only a write that succeeded consumes the key
                entry["targets"].append(name)
            for earlier in self._parts_of(loaded_weight, entry):
                earlier["targets"].append(name)
                self.writes[name].append({"key": earlier["key"], "shard": None, "ok": True})

        recorded.__wrapped__ = loader
        recorded.__self_recorder__ = self
        return recorded

    def around_load_weights(self, call):
        """Run `call()` (the engine's loader step that calls `model.load_weights(weights)`) with that
        iterator tracked; returns what `call` returns."""
        load_weights = self.model.load_weights
        self.model.load_weights = lambda weights, *args, **kwargs: load_weights(self.track(weights), *args, **kwargs)
        try:
            return call()
        finally:
            del self.model.load_weights

    def track(self, weights):
        """Wrap the production weights iterator: remember which key is being processed."""
        for name, tensor in weights:
            self._finish_key()
            self._current = {"key": name, "shape": list(tensor.shape), "dtype": _dtype_name(tensor.dtype),
                             "targets": [], "attributes": []}
            self.keys.append(self._current)
            self._current["held"] = tensor  # until the key is done (see _finish_key)
            if self.hold_tensors:
                self._by_tensor[id(tensor)] = self._current
                self._current["tensor"] = tensor  # kept alive, so that its id names only it
            self._attrs_before = self._attribute_ids()
            yield name, tensor
        self._finish_key()
        self.exhausted = True

    def _attribute_ids(self):
        """Tensor attributes only: a key that becomes an attribute carries its data (SGLang's d2t becomes
        `hot_token_id`); flags a loader sets while reading names (vLLM's `has_own_lm_head`) are not keys' data."""
        return {k: id(v) for k, v in vars(self.model).items() if not k.startswith("_") and isinstance(v, torch.Tensor)}

    def _finish_key(self):
        """Called when the model asks for the next key: the previous one is done. A key nothing consumed
        is kept aside (up to PENDING_BYTES), in case a later write carries it fused with another key."""
        if self._current is None:
            return
        after = self._attribute_ids()
        self._current["attributes"] = sorted(k for k, i in after.items() if self._attrs_before.get(k) != i)
        tensor = self._current.pop("held", None)
        if not self._current["targets"] and not self._current["attributes"] and tensor is not None:
            if self._pending_bytes + tensor.nbytes <= PENDING_BYTES:
                self._pending.append((self._current, tensor))
                self._pending_bytes += tensor.nbytes
        self._current = None

    def _parts_of(self, written, entry):
        """Earlier, unconsumed keys whose tensor is a block of rows at the start or end of `written`: a
        loader that concatenates two keys before writing (SGLang's MLA fuses q_a_proj and
        kv_a_proj_with_mqa) has written both, told by their bytes."""
        found = []
        if not isinstance(written, torch.Tensor) or written.dim() == 0:
            return found
        own = (entry or {}).get("held", (entry or {}).get("tensor"))
        if own is None or written is own or own.shape[1:] != written.shape[1:]:
            return found  # the key's own tensor, as it is (or narrowed): no other key in it
        for pending in list(self._pending):
            other, tensor = pending
            if other is entry or tensor.dim() != written.dim() or tensor.shape[1:] != written.shape[1:]:
                continue
            n = tensor.shape[0]
            # exactly the two blocks, told by their bytes (a parameter of zeros must not claim every zero key)
            if n + own.shape[0] == written.shape[0] and any(torch.equal(block, tensor) for block in (written[:n], written[-n:])):
                found.append(other)
                self._pending.remove(pending)
                self._pending_bytes -= tensor.nbytes
        return found

    def abort(self):
        """The model's load_weights raised: close the key it was processing and return that key."""
        key = self._current["key"] if self._current else None
        self._finish_key()
        return key

    # -- results ---------------------------------------------------------------------------------
    def report(self):
        keys = []
        for k in self.keys:
            targets = sorted(set(k["targets"]))
            consumed_as = "parameter" if targets else "attribute" if k["attributes"] else None
            keys.append({"key": k["key"], "shape": k["shape"], "dtype": k["dtype"], "consumed": consumed_as is not None,
                         "consumed_as": consumed_as, "parameters": targets, "attributes": k["attributes"]})
        params = [self._param_report(n, p) for n, p in self.params.items()]
        attributes = {}
        for k in keys:
            for attr in k["attributes"]:
                value = getattr(self.model, attr, None)
                attributes[attr] = {"from_key": k["key"], "type": type(value).__name__,
                                    "shape": list(value.shape) if isinstance(value, torch.Tensor) else None,
                                    "dtype": _dtype_name(value.dtype) if isinstance(value, torch.Tensor) else None}
        return {"parameters": params, "keys": keys, "all_keys_seen": self.exhausted, "attributes": attributes}

    def _param_report(self, name, p):
        writes = self.writes[name]
        ok = [w for w in writes if w["ok"]]
        written = None
        if self.real and p.dtype in _SENTINELS:
            int_dtype, bits = _SENTINELS[p.dtype]
            flat = p.data.view(int_dtype).reshape(-1)
            still = sum(int(torch.count_nonzero(chunk == bits)) for chunk in flat.split(_COUNT_CHUNK))
            written = p.numel() - still
        expected = self.expected_shards.get(name)
        shards_written = sorted({w["shard"] for w in ok if w["shard"] is not None}) if expected else None
        if written is not None:
            status = "untouched" if written == 0 else "written" if written == p.numel() else "partial"
        elif not ok:
            status = "untouched"
        else:
            status = "written" if not expected or set(expected) <= set(shards_written) else "partial"
        return {
            "name": name, "shape": list(p.shape), "dtype": _dtype_name(p.dtype), "numel": p.numel(),
            "status": status, "elements_written": written, "writes": writes,
            "shards_expected": expected, "shards_written": shards_written,
            # A sentinel change no wrapped loader accounts for means the instrumentation missed a path.
            "unattributed_write": bool(written) and not ok,
            "sha256": hashlib.sha256(p.data.detach().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()
            if self.digests and self.real and p.dtype.is_floating_point else None,
        }
