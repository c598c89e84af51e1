"""The decode loop: prefill -> [draft -> verify -> commit -> emit]*.

Plain decoding is the same loop with no drafter. The cache holds every committed token but
the last one (the *pending* token), so each target step feeds ``[pending, draft...]`` (the
first one also the few prompt tokens the prefill left before it) and gets the target's
distribution at the root and after every draft node in one forward pass.

Each step is one named method or call: :meth:`Engine.prefill` (:mod:`specd.prompts`: the
prompt side, with warm-ups and the prefix cache), ``Speculation.draft``
(:mod:`specd.speculation` serves the plugins, every call guarded), :meth:`Engine.verify`,
:meth:`Engine.commit` and ``Emitter.emit`` (:mod:`specd.generation`: EOS, ``max_tokens``,
stop strings, text).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import torch

from .api import DraftContext
from .draft import Draft, Step, Verdict
from .errors import BadInputError
from .forward import pricing
from .forward.target import Target
from .generation import Completion, Delta, Emitter, Generation
from .healing import Constraint, Guide, TokenBytes, heal
from .isolation import PluginGuard
from .kvcache import KVCache
from .limits import MAX_DRAFT, ContextLimits, RequestMemory, request_memory
from .ngram_index import Corpus
from .prefix_cache import PrefixCache
from .prompts import FEED_TOKENS, Prompts
from .sampling import SamplingParams, choose, make_generator, warp
from .speculation import (
    NO_DRAFTER,
    DraftClock,
    PluginInstances,
    Request,
    Speculation,
    check_exact,
    check_names,
)
from .stats import Stats

log = logging.getLogger(__name__)


class Engine(Prompts):
    """Loads a target once; generates and streams many times.

    :param target: the served model.
    :param drafter: default drafter name (``"none"`` for plain decoding).
    :param verifier: default verifier name; None picks ``greedy`` for temperature 0 and
        ``rejection`` otherwise.
    :param exit_policy: default exit-policy name.
    :param max_draft: the most draft tokens one step may verify (0 to
        :data:`~specd.limits.MAX_DRAFT`).
    :param drafter_options: constructor options per drafter name.
    :param prefix_cache_entries: how many sequences' KV caches to keep between requests.
    :param prefix_cache_bytes: cap on their total size (None: no cap beyond the count).
    :param plugin_failure_limit: failures after which a plugin is disabled for the session.
    :param plugin_timeout_s: the longest one plugin call may take (None: no limit); a call
        that overruns it disables the plugin for the session.
    """

    def __init__(
        self,
        target: Target,
        *,
        drafter: str = "hybrid",
        verifier: str | None = None,
        exit_policy: str = "adaptive",
        max_draft: int = 8,
        drafter_options: dict[str, dict[str, Any]] | None = None,
        prefix_cache_entries: int = 4,
        prefix_cache_bytes: int | None = None,
        plugin_failure_limit: int = 3,
        plugin_timeout_s: float | None = 5.0,
    ) -> None:
        if isinstance(max_draft, bool) or not isinstance(max_draft, int):
            raise BadInputError(f"max_draft must be an integer, got {max_draft!r}")
        if not 0 <= max_draft <= MAX_DRAFT:
            raise BadInputError(f"max_draft must be from 0 to {MAX_DRAFT}, got {max_draft:,}")
        if prefix_cache_entries < 1:
            raise BadInputError(f"prefix_cache_entries must be >= 1, got {prefix_cache_entries}")
        if prefix_cache_bytes is not None and prefix_cache_bytes < 1:
            raise BadInputError(f"prefix_cache_bytes must be >= 1, got {prefix_cache_bytes}")
        self.target = target
        self.tokenizer = target.tokenizer
        self.default_drafter = drafter
        self.default_verifier = verifier
        self.default_exit_policy = exit_policy
        self.max_draft = max_draft
        self.prefix_cache = PrefixCache(
            target.new_cache, max_entries=prefix_cache_entries, max_bytes=prefix_cache_bytes
        )
        self.guard = PluginGuard(failure_limit=plugin_failure_limit, timeout_s=plugin_timeout_s)
        self.plugins = PluginInstances(self.guard, dict(drafter_options or {}))
        self.corpus: Corpus | None = None
        self._clocks: dict[str, DraftClock] = {}  # what each drafter's calls cost here
        self._lock = threading.Lock()
        # Validate the defaults now so a bad name fails at start, not at the first request.
        check_names(drafter, verifier, exit_policy)

    @classmethod
    def load(
        cls,
        model: str | None = None,
        *,
        dtype: str | None = None,
        device: str | None = None,
        trust_remote_code: bool = False,
        compile: str = "auto",
        prefill_dtype: str | None = None,
        packed_weights: str = "off",
        weights: str = "auto",
        kv_dtype: str = "auto",
        **engine_options: Any,
    ) -> Engine:
        """Load a model offline, ready to serve (:func:`specd.forward.models.serving_target`,
        which takes the other arguments), and build an engine around it.

        :param engine_options: the keyword arguments of :class:`Engine`.
        """
        from .forward.models import serving_target

        target = serving_target(
            model, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
            compile=compile, prefill_dtype=prefill_dtype, packed_weights=packed_weights,
            weights=weights, kv_dtype=kv_dtype,
        )  # fmt: skip
        return cls(target, **engine_options)

    # -- public API ---------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def heal(self, prompt: Sequence[int]) -> tuple[list[int], Constraint | None]:
        """Token healing (:mod:`specd.healing`): the prompt backed up to a clean token boundary
        and the constraint that writes the removed text again; pass both to :meth:`stream`."""
        return heal(prompt, self.token_bytes)

    @functools.cached_property
    def limits(self) -> ContextLimits:
        """The model's context window and longest token, which every prompt is held to."""
        return ContextLimits.of(self.target)

    def request_memory(self, tokens: int) -> RequestMemory:
        """The most memory a request over ``tokens`` positions takes beyond the weights."""
        return request_memory(self.target, tokens, FEED_TOKENS + self.max_draft + 1)

    @functools.cached_property
    def token_bytes(self) -> TokenBytes:
        """The bytes each token writes (read from the tokenizer on first use)."""
        return TokenBytes.from_tokenizer(self.tokenizer, self.target.vocab_size)

    def generate(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, **kw: Any
    ) -> Completion:
        """Generate to the end. Keyword arguments are those of :meth:`stream`."""
        return self.stream(prompt, params, **kw).result()

    def stream(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        drafter: str | None = None,
        verifier: str | None = None,
        exit_policy: str | None = None,
        cancel: Callable[[], bool] | threading.Event | None = None,
        time_budget_s: float | None = None,
        corpus: Corpus | None = None,
        constraint: Constraint | None = None,
    ) -> Generation:
        """Start a generation and stream it.

        :param prompt: text, or token ids.
        :param params: sampling parameters (default: greedy, 64 tokens).
        :param drafter: drafter name for this request (``"none"``: plain decoding).
        :param cancel: checked before every target step; true ends it ("cancelled").
        :param time_budget_s: wall-clock budget; when spent the generation ends ("time").
        :param corpus: extra text for drafters to copy from (default: the engine's).
        :param constraint: the text the output must start with, written by tokens each of
            which is a prefix of what is left of it or runs past its end (token healing;
            :meth:`heal` makes the prompt and the constraint).
        :returns: a :class:`Generation`; iterate it for deltas.
        """
        params = params or SamplingParams()
        ids = self._prompt_ids(prompt)
        params = self.limits.fit(len(ids), params)
        if isinstance(cancel, threading.Event):
            cancel = cancel.is_set
        d = drafter or self.default_drafter
        v = verifier or self.default_verifier or ("greedy" if params.greedy else "rejection")
        e = exit_policy or self.default_exit_policy
        # Plain decoding uses neither a verifier nor a policy's budget.
        check_names(d, v if d != NO_DRAFTER else None, e)
        check_exact(d, v, params)
        req = Request(
            prompt=ids,
            params=params,
            drafter=d,
            verifier=v,
            exit_policy=e,
            cancel=cancel,
            deadline=None if time_budget_s is None else time.monotonic() + time_budget_s,
            corpus=corpus if corpus is not None else self.corpus,
            constraint=constraint,
        )
        self.plugins.for_request(req)
        return Generation(self._run(req))

    def plugin_health(self) -> dict[str, dict[str, Any]]:
        """Calls, failures and disabled state per plugin since the engine started."""
        return self.guard.snapshot()

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        bos = getattr(self.tokenizer, "bos_token_id", None)
        return self.limits.prompt_ids(prompt, self.tokenize, self.target.vocab_size, bos)

    # -- the decode loop ----------------------------------------------------------------

    def _run(self, req: Request) -> Generator[Delta, None, Completion]:
        with self._lock:  # one generation at a time per engine
            return (yield from self._decode(req))

    def _decode(self, req: Request) -> Generator[Delta, None, Completion]:
        t_start = time.perf_counter()
        stats = Stats(prompt_tokens=len(req.prompt), drafter=req.drafter)
        vocab = self.target.vocab_size
        spec = Speculation(self.guard, req, max_draft=self.max_draft, vocab_size=vocab, stats=stats)
        # a drafter that reads the target's features gets those of the prompt, too
        d = spec.drafter
        hidden: list[torch.Tensor] | None = [] if d is not None and d.wants_hidden else None
        rows = getattr(d, "feature_rows", None) if hidden is not None else None
        # the last prompt tokens go with the first draft unless the drafter reads the cache, or
        # features when sampling: a seed draws alike whether the prompt's were cached or not
        feed = d is None or not (d.reads_cache or (d.wants_hidden and not req.params.greedy))
        leave = FEED_TOKENS - 1 if feed else 0
        cache, stats.reused_tokens, why = self.prefill(
            req.prompt, req.stop_reason, hidden, leave, hidden_rows=rows
        )
        stats.prefill_s = time.perf_counter() - t_start
        if why:  # cancelled or out of time during prefill; what was computed stays cached
            self.prefix_cache.release(cache, req.prompt[: cache.length])
            stats.finish_reason = why
            stats.total_s = time.perf_counter() - t_start
            return Completion(text="", token_ids=[], stats=stats)

        clock = self._clocks.setdefault(req.drafter, DraftClock())
        clock.start()
        if spec.policy is not None:  # what verifying costs here (priced again if the step changed)
            priced = self.target.pass_costs is not None
            spec.policy.pass_cost = self.target.price_passes() if priced else None
            spec.policy.draft_cost = clock.cost if priced else None
        ctx = DraftContext(
            tokens=list(req.prompt),
            params=req.params,
            generator=make_generator(req.params.seed),
            vocab_size=vocab,
            target=self.target,
            corpus=req.corpus,
            exit_policy=spec.policy,
            cache=cache,
            hidden=cache.prompt_features(stats.reused_tokens, hidden),
        )
        out = Emitter(self.tokenizer, req.params, self.target.eos_token_ids, stats, t_start)
        guide = None if req.constraint is None else Guide(req.constraint, self.token_bytes, vocab)
        fed = list(req.prompt[cache.length :])  # the pending token, and what was left
        held = cache.length  # the cache holds ctx.tokens[:held]
        verify_cpu = 0.0  # CPU seconds of the passes (stats.verify_s: their wall seconds)
        try:
            spec.start(ctx)
            while not out.finish:
                if why := req.stop_reason():
                    out.finish = why
                    break
                t_step = time.perf_counter()
                # draft: leave room for the verifier's own token (correction or bonus)
                draft = spec.draft(ctx, room=out.room - 1)
                t_drafted, cpu_drafted = time.perf_counter(), time.process_time()
                step = self.verify(cache, fed, draft, spec, req.params, ctx.generator, guide)
                t_verified = time.perf_counter()
                verify_cpu += time.process_time() - cpu_drafted
                stats.draft_s += t_drafted - t_step
                stats.verify_s += t_verified - t_drafted
                clock.record(
                    None if draft is None else t_drafted - t_step,
                    0 if draft is None else len(draft),
                    t_verified - t_drafted,
                    self.target.pass_cost(len(fed) + (0 if draft is None else len(draft))),
                )
                new = self.commit(cache, step, spec, ctx, stats)
                fed, held = new[-1:], len(ctx.tokens) - 1
                if guide is not None:
                    guide.commit(new)
                delta = out.emit(new, t_step)
                if delta is not None:
                    yield delta
            tail = out.flush()
            if tail is not None:
                yield tail
            stats.finish_reason = out.finish
        finally:
            spec.finish(ctx)
            # every committed token but the pending one (dropped if a step failed halfway)
            self.prefix_cache.release(cache, ctx.tokens[:held])
        self._price_again_if_quiet(verify_cpu, stats.verify_s)
        stats.total_s = time.perf_counter() - t_start
        if stats.new_tokens and not stats.ttft_s:
            stats.ttft_s = stats.total_s
        return Completion(text=out.text.text, token_ids=out.token_ids, stats=stats)

    def _price_again_if_quiet(self, cpu_s: float, wall_s: float) -> None:
        """Where the passes were priced while other work shared the cores (a table kept by
        no one, :func:`.pricing.keep_measured`) and this request's passes had their threads'
        time (``cpu_s`` of ``wall_s``, :data:`.pricing.QUIET_CHECK_S` at least), the next
        request prices them again: a daemon started on a busy host is priced for the quiet
        one as soon as it is quiet."""
        costs = self.target.pass_costs
        if costs is None or costs.reprice or wall_s < pricing.QUIET_CHECK_S:
            return
        if not pricing.busy(costs):
            return
        if pricing.share(cpu_s, wall_s) >= pricing.QUIET_SHARE:
            log.info("the host is quiet now: verify passes are priced again at the next request")
            costs.reprice = True

    def verify(
        self,
        cache: KVCache,
        fed: Sequence[int],
        draft: Draft | None,
        spec: Speculation,
        params: SamplingParams,
        generator: torch.Generator,
        guide: Guide | None = None,
    ) -> Step:
        """One target forward over ``[*fed, *draft]`` (``fed``: prompt tokens the prefill
        left, then the pending token, the root) and the verifier's decision. With no draft,
        or when the verifier fails, the target's own token at the root is taken (a failed
        verifier costs only its draft). ``guide`` is the request's constraint."""
        lead, base = len(fed) - 1, cache.length + len(fed) - 1  # base: the root's position
        tokens, parents = list(fed), None
        if draft is not None:
            tokens += draft.tokens
            parents = [*range(-1, lead)] + [p + 1 + lead if p >= 0 else lead for p in draft.parents]
        # tokens: [lead + 1 + N] -> logits, hidden: [lead + 1 + N, ...]
        out = self.target.forward(cache, tokens, parents, hidden=spec.wants_hidden)
        logits, hidden = out.logits[lead:], out.hidden  # hidden: the lead tokens' rows, too
        # p: [1 + N, V]; row 0 is the target's distribution at the root, row i + 1 after node i
        allowed = guide.allowed(draft, logits.device) if guide is not None else None
        p = self.distributions(logits, params, allowed)
        verdict = spec.verify(draft, p, generator) if draft is not None else None
        if verdict is None:
            verdict = Verdict(path=[], token=choose(p[0], params, generator))
        return Step(base, draft, verdict, hidden, lead)

    def distributions(
        self, logits: torch.Tensor, params: SamplingParams, allowed: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The target's distributions p ``[1 + N, V]``, which the verifier and plain decoding
        draw from, from ``logits`` ``[1 + N, V]`` at the root and after each draft node and
        ``allowed`` booleans from a constraint (token healing; see :func:`specd.sampling.warp`)."""
        return warp(logits, params, allowed)

    def commit(
        self, cache: KVCache, step: Step, spec: Speculation, ctx: DraftContext, stats: Stats
    ) -> list[int]:
        """Make a step's decision the request's state: the cache keeps the pending token and
        the accepted path and drops the other nodes; the accepted draft tokens and the
        verifier's token join ``ctx.tokens``; the policy and the drafter hear of them; the
        step is counted. :returns: the new tokens; the last one is the next pending token."""
        path = step.verdict.path
        cache.keep(step.base, [step.base] + [step.base + 1 + i for i in path])
        new = [step.draft.tokens[i] for i in path] if step.draft is not None else []
        new.append(step.verdict.token)
        if step.hidden is not None:  # the lead tokens, the pending one, the accepted path
            ctx.hidden = step.hidden[[*range(step.lead + 1), *(step.lead + 1 + i for i in path)]]
            if cache.features is not None and cache.features.shape[0] == step.base - step.lead:
                cache.features = torch.cat([cache.features, ctx.hidden])
        ctx.tokens.extend(new)
        drafted = len(step.draft) if step.draft is not None else 0
        depth = max(step.draft.depths()) if step.draft is not None else 0
        stats.record_step(drafted, depth, len(path))
        spec.commit(ctx, new, depth, len(path))
        return new
