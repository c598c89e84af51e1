"""The target model: forward passes over new tokens on top of a KV cache."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import BadInputError
from ..kvcache import KVCache
from . import architectures, drafting, early_layers, lean_model, pricing
from .blocks import BlockWeight
from .compiled import CompiledStep, KernelStep, choose
from .fastpath import FastDecoder
from .passes import PREFILL_CHUNK, STEP_PREFILL_TOKENS, prefill_pieces, tree_mask
from .pricing import PassCosts
from .step import EagerStep

log = logging.getLogger(__name__)

#: ``--compile`` choices.
COMPILE_MODES = ("auto", "off", "on", "background")
#: ``--packed-weights`` choices.
PACK_CHOICES = ("auto", "on", "off")
#: Positions a cache holds from the start when CUDA graphs replay over it.
STATIC_CAPACITY = 4096


@dataclass
class ForwardOut:
    logits: torch.Tensor  # [T, V]
    hidden: torch.Tensor | None = None  # [T, H], the last hidden states after the final norm


class Target(drafting.DrafterWeights):
    """A causal LM served by the engine: a Hugging Face model, or a Llama-style checkpoint
    loaded without transformers (:mod:`.lean_model`), which runs the lean forward always.
    What a drafter's own layers read of it: :class:`.drafting.DrafterWeights`.

    ``forward`` runs the model over new tokens, appending their keys and values to the given
    cache. A token tree is fed as its nodes in order with ``parents`` (index into the fed
    tokens, -1 for a node that follows the cached sequence); each node then attends only to
    the cache and its own ancestors.
    """

    def __init__(
        self, model: Any, tokenizer: Any, *, name: str = "model", fast: bool | None = None
    ) -> None:
        if fast is None:
            fast = os.environ.get("SPECD_FASTPATH", "1") != "0"
        if not fast:  # a model loaded without transformers has no forward of its own
            model = lean_model.transformers_model(model)
        # Hugging Face models carry their configuration and helpers as dynamic attributes.
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.config = self.model.config
        params = next(model.parameters())
        self.device = params.device
        self.dtype = params.dtype
        out_emb = self.model.get_output_embeddings()
        self.vocab_size = (
            int(out_emb.weight.shape[0]) if out_emb is not None else int(self.config.vocab_size)
        )
        text_cfg = self.config.get_text_config(decoder=True)
        self.num_layers = int(text_cfg.num_hidden_layers)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        fwd = inspect.signature(model.forward).parameters
        self._cache_kw = "past_key_values" if "past_key_values" in fwd else "cache"
        # The lean forward (specd.fastpath) for Llama-style models, unless turned off with
        # fast=False or SPECD_FASTPATH=0; other models run their own forward.
        self.fast = FastDecoder(model) if fast and architectures.supports(model) else None
        #: the compiled decode and verify step (:meth:`compile`), None while eager
        self.compiled: CompiledStep | None = None
        #: the lean forward prefill runs in another dtype (:meth:`set_prefill_dtype`)
        self.prefill_fast: FastDecoder | None = None
        #: what a new cache stores keys and values as (:func:`.weights.choose_kv_dtype`)
        self.kv_dtype: torch.dtype = self.dtype

    def hf_model(self) -> Any:
        """The served model as a transformers model, for what needs transformers itself (its
        ``generate``): the model, or one built on first use that shares the weights of a model
        loaded without transformers (:func:`specd.forward.lean_model.transformers_model`)."""
        return lean_model.transformers_model(self.model)

    def new_cache(self, capacity: int = 256) -> KVCache:
        if self.compiled is not None and self.compiled.backend == "cudagraph":
            # A captured graph replays only until its cache outgrows the buffer it holds.
            capacity = max(capacity, min(STATIC_CAPACITY, self.max_positions))
        return KVCache(self.num_layers, capacity=capacity, dtype=self.kv_dtype)

    def set_prefill_dtype(self, dtype: torch.dtype | None) -> None:
        """Run prefill in ``dtype`` (e.g. bfloat16, on CPUs with bfloat16 instructions) while
        decoding stays in the model's dtype: the prompt's keys and values are computed in
        ``dtype`` and stored in the model's. Faster prompts, not token-identical to plain
        decoding in the model's dtype; the rate is measured in docs/benchmarks.md.

        :param dtype: None or the model's dtype: prefill as the model runs.
        """
        if dtype is None or dtype == self.dtype:
            self.prefill_fast = None
            return
        if self.fast is None:
            raise BadInputError(
                f"a prefill dtype needs the lean forward, which {type(self.model).__name__} "
                "does not have; leave --prefill-dtype unset"
            )
        self.prefill_fast = FastDecoder(self.model, dtype=dtype)

    def pack_weights(self, mode: str = "auto") -> bool:
        """Prepacked weights for verify passes of a few tokens (:meth:`FastDecoder.pack`):
        ``on``, ``auto`` (where measured faster) or ``off``. :returns: whether in use."""
        if mode not in PACK_CHOICES:
            raise BadInputError(f"packed weights: expected one of {PACK_CHOICES}, got {mode!r}")
        return self.fast is not None and self.fast.pack(mode)

    def remembered(self, kind: str, compute: Callable[[], str]) -> str:
        """``compute()``, a string that depends on this target's weights alone, kept across
        starts (the cache directory, :func:`.pricing.keep`) under what tells the weights
        apart cheaply: the model's name, its size as stored and a few of its weights
        (:func:`.pricing.fingerprint`); computed every time without the lean forward."""
        if self.fast is None:
            return compute()
        key = {
            "kind": kind, "model": self.name, "weight_bytes": self.weight_bytes(),
            "vocab": self.vocab_size, "weights": pricing.fingerprint(self.fast),
        }  # fmt: skip
        known = pricing.kept(key, "remembered")
        if known is not None and isinstance(known.get("value"), str):
            return known["value"]
        value = compute()
        pricing.keep(key, "remembered", {"value": value})
        return value

    @property
    def max_positions(self) -> int:
        cfg = self.config.get_text_config(decoder=True)
        return int(getattr(cfg, "max_position_embeddings", 0) or 1 << 20)

    def compile(self, mode: str = "on", backend: str | None = None) -> CompiledStep | None:
        """The decode and verify step: its backend chosen once (:func:`.compiled.choose`),
        then built and checked once (:class:`.compiled.CompiledStep`).

        :param mode: ``on`` (prepare it now; the first passes wait for it), ``background``
            (in a thread while passes run eager), ``off``, or ``auto``: ``on`` but never
            ``torch.compile`` on a CPU, where compiling takes minutes (docs/benchmarks.md):
            CUDA graphs on CUDA, the step kernel where it takes the model, eager elsewhere.
        :param backend: a name from :data:`.compiled.BACKENDS` (default: chosen by device,
            dtype and host).
        :returns: the compiled step (later calls return the same one), or None where passes
            run eager (``off``, nothing better here, or a model without a lean forward).
        """
        if mode not in COMPILE_MODES:
            raise BadInputError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
        if mode == "off" or self.fast is None:
            if mode in ("on", "background"):
                log.warning("compiled step off: %s has no lean forward", type(self.model).__name__)
            self.compiled = None
            return None
        if self.compiled is None:
            chosen = choose(self.fast, backend, slow=mode != "auto")
            if isinstance(chosen, EagerStep):
                return None
            if isinstance(chosen, KernelStep):
                chosen.verdict = {
                    **pricing.key(self, "kernel"),  # the kernel's library among them
                    "weights": pricing.fingerprint(self.fast),
                }
            self.compiled = CompiledStep(self.fast, chosen)
            self.compiled.prepare(self.new_cache, background=mode == "background")
        return self.compiled

    #: what verify passes cost on this host (:meth:`price_passes`), None until priced
    pass_costs: PassCosts | None = None

    def pass_cost(self, n: int) -> float:
        """The time of a pass of ``n`` tokens relative to a one-token step on this host
        (:mod:`specd.forward.pricing`); 1.0 for every ``n`` until :meth:`price_passes`."""
        return (self.pass_costs or pricing.FLAT)(n)

    def price_passes(self) -> PassCosts:
        """Price passes of :data:`pricing.PRICE_TOKENS` tokens with the step that serves them
        (the compiled one once ready, else eager) on a scratch cache, once per serving step:
        after a background compile is ready or the step turns itself off, or where a busy
        host's table was marked (``PassCosts.reprice``), the next call prices them again."""
        step = self.compiled
        serving = step.backend if step is not None and step.ready else "eager"
        if (
            self.pass_costs is not None
            and self.pass_costs.backend == serving
            and not self.pass_costs.reprice
        ):
            return self.pass_costs
        key = pricing.key(self, serving)
        costs = pricing.saved(key)
        if costs is None:
            context = min(pricing.PRICE_CONTEXT, self.max_positions - 2 * pricing.PRICE_TOKENS[-1])
            cache = self.new_cache(capacity=context + 2 * pricing.PRICE_TOKENS[-1])
            gen = torch.Generator().manual_seed(0)
            seed = min(context, pricing.PRICE_SEED)
            self.prefill(cache, torch.randint(0, self.vocab_size, (seed,), generator=gen).tolist())
            pricing.fill(cache, context)
            costs = pricing.measure(self.forward, cache, self.vocab_size, backend=serving)
            pricing.keep_measured(key, costs)
        else:
            log.info("verify passes priced (saved): %s", costs)
        self.pass_costs = costs
        return costs

    def weight_bytes(self) -> int:
        """Bytes of weights read by one forward step as they are stored: the parameters and
        the weights kept as blocks (:mod:`.blocks`), tied weights counted once."""
        stored = {p.data_ptr(): p.numel() * p.element_size() for p in self.model.parameters()}
        for module in self.model.modules():
            for value in vars(module).values():
                if isinstance(value, BlockWeight):
                    stored[value.data_ptr()] = value.nbytes
        return sum(stored.values())

    @torch.inference_mode()
    def prefill(
        self,
        cache: KVCache,
        tokens: Sequence[int],
        stop: Callable[[], str] | None = None,
        hidden: list[torch.Tensor] | None = None,
        hidden_rows: int | None = None,
    ) -> str:
        """Append ``tokens`` to the cache without computing their logits, in the passes
        :func:`prefill_pieces` gives.

        :param stop: checked before each chunk; a non-empty answer ends the prefill there.
        :param hidden: when given, each chunk's last hidden states ``[T, H]`` are appended.
        :param hidden_rows: with ``hidden``, only those of the last this many tokens (what a
            drafter reads): the passes before them fill the cache alone, and the pass that
            holds them runs its last layer for their rows only. The passes and the keys and
            values they write are the same either way.
        :returns: ``stop``'s answer when it ended the prefill early, else "".
        """
        # One allocation for the prompt and a first stretch of decoding.
        cache.reserve(cache.length + len(tokens) + PREFILL_CHUNK)
        stepped = self._prefill_steps(len(tokens))
        chunk = self.compiled.max_tokens if stepped and self.compiled else PREFILL_CHUNK
        wanted_from = len(tokens) - (len(tokens) if hidden_rows is None else hidden_rows)
        for start, end in prefill_pieces(cache.length, len(tokens), chunk, first=stepped):
            why = stop() if stop is not None else ""
            if why:
                return why
            piece = list(tokens[start:end])
            # rows of this piece whose features are asked for
            rows = 0 if hidden is None else max(0, end - max(start, wanted_from))
            if stepped:
                out = self._run(cache, piece, None, keep=0, hidden=rows > 0)
            else:
                out = self._run(
                    cache, piece, None, keep=1, hidden=rows > 0, logits=False, hidden_rows=rows
                )
            if hidden is not None and rows and out.hidden is not None:
                hidden.append(out.hidden[-rows:])
        return ""

    def _prefill_steps(self, n: int) -> bool:
        """Whether a prefill of ``n`` tokens runs as passes of the step kernel: where the
        weights are blocks and the prompt fits one pass, or is short
        (:data:`STEP_PREFILL_TOKENS`) and the lean forward's passes multiply by a float32
        copy of every weight, made for that pass. Where they multiply by the int8 products
        instead (:meth:`~.weight_products.WeightProducts._prefill_product`), the lean
        forward's passes took 0.72-0.95x the step kernel's time from 32 tokens up on the Zen
        3 EPYC of docs/benchmarks.md."""
        if not (
            self.fast is not None
            and self.fast.quantized
            and self.compiled is not None
            and self.compiled.ready
            and self.compiled.backend == "kernel"
        ):
            return False
        if n <= self.compiled.max_tokens:
            return True
        return n <= STEP_PREFILL_TOKENS and self.fast._prefill_product() != "int8"

    @torch.inference_mode()
    def forward(
        self,
        cache: KVCache,
        tokens: Sequence[int],
        parents: Sequence[int] | None = None,
        *,
        hidden: bool = False,
        eager: bool = False,
    ) -> ForwardOut:
        """Run the model over ``tokens`` (a chain, or a tree when ``parents`` is given).

        :param eager: never the compiled step (to compare against it).
        :returns: logits ``[T, V]`` for every fed token, and the last hidden states when asked.
        """
        return self._run(cache, list(tokens), parents, keep=0, hidden=hidden, eager=eager)

    @torch.inference_mode()
    def forward_early(self, cache: KVCache, tokens: Sequence[int], layers: int) -> torch.Tensor:
        """Run only the first ``layers`` decoder layers, then the final norm and LM head.

        Keys and values are appended to the cache's first ``layers`` layers only, which
        are exactly what the full model would compute there; roll back with ``crop``.
        :returns: logits ``[T, V]``.
        """
        if not 1 <= layers <= self.num_layers:
            raise ValueError(f"exit layer must be in [1, {self.num_layers}], got {layers}")
        if self.fast is not None:
            ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
            pos = torch.arange(
                cache.length, cache.length + len(tokens), device=self.device
            ).unsqueeze(0)
            return self.fast.forward(cache, ids, pos, None, layers=layers)[0]
        return early_layers.forward(self.model, cache, tokens, layers)

    def _run(
        self,
        cache: KVCache,
        tokens: list[int],
        parents: Sequence[int] | None,
        *,
        keep: int,
        hidden: bool = False,
        eager: bool = False,
        logits: bool = True,
        hidden_rows: int | None = None,
    ) -> ForwardOut:
        past = cache.length
        n = len(tokens)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)  # [1, T]
        mask = None
        if parents is not None and any(p != i - 1 for i, p in enumerate(parents)):
            depth, mask = tree_mask(parents, past, self.dtype, self.device)
            position_ids = (past + depth).unsqueeze(0)
        else:
            position_ids = torch.arange(past, past + n, device=self.device).unsqueeze(0)
        if self.compiled is not None and not eager and not keep:
            out = self.compiled.run(cache, ids, position_ids, mask)
            if out is not None:
                return ForwardOut(logits=out[0], hidden=out[1] if hidden else None)
        fast = self.prefill_fast if keep and self.prefill_fast is not None else self.fast
        if fast is not None:
            row, hs = fast.forward(
                cache, ids, position_ids, mask, keep=keep, hidden=hidden, logits=logits,
                hidden_rows=hidden_rows,
            )  # fmt: skip
            return ForwardOut(logits=row, hidden=hs)
        kwargs: dict = {self._cache_kw: cache.hf, "use_cache": True, "logits_to_keep": keep}
        kwargs["position_ids"] = position_ids
        if mask is not None:
            kwargs["attention_mask"] = mask
        if hidden:
            kwargs["output_hidden_states"] = True
        res = self.model(input_ids=ids, **kwargs)
        hs = res.hidden_states[-1][0] if hidden else None
        return ForwardOut(logits=res.logits[0], hidden=hs)  # [T, V]


def _eos_ids(model: torch.nn.Module, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        if isinstance(value, int):
            ids.add(value)
        else:
            ids.update(int(v) for v in value)
    return ids
