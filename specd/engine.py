"""The decode loop: prefill -> [draft -> verify -> commit] * -> stream.

Plain decoding is the same loop with no drafter: every step feeds only the pending token.
The cache holds every committed token but the last one (the *pending* token), so each
target step feeds ``[pending, draft...]`` and gets the target's distribution at the root
and after every draft node in one forward pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import registry
from .api import DraftContext, Drafter, ExitPolicy, Verifier
from .draft import Draft, Verdict
from .errors import BadInputError, PluginError
from .isolation import PluginFailed, PluginGuard
from .ngram_index import Corpus
from .prefix_cache import PrefixCache
from .sampling import SamplingParams, make_generator, sample, warp
from .stats import Stats
from .target import Target
from .textstream import TextStream

log = logging.getLogger(__name__)

NO_DRAFTER = "none"


@dataclass
class Delta:
    """A piece of streamed output: final text and the tokens it came from."""

    text: str
    token_ids: list[int]


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    stats: Stats

    def as_json(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.as_json()}


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    drafter: str
    verifier: str
    exit_policy: str
    cancel: Callable[[], bool] | None = None
    deadline: float | None = None  # time.monotonic() value
    corpus: Corpus | None = None
    # Plugin instances, built when the request is made (None: plain decoding).
    drafter_obj: Drafter | None = None
    verifier_obj: Verifier | None = None
    policy_obj: ExitPolicy | None = None


class Generation:
    """A running generation: iterate for :class:`Delta` objects; ``completion`` is set at the end."""

    def __init__(self, it: Iterator[Delta]) -> None:
        self._it = it
        self.completion: Completion | None = None

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> Delta:
        return next(self._it)

    def close(self) -> None:
        self._it.close()  # type: ignore[attr-defined]

    def result(self) -> Completion:
        """Run to the end and return the completion."""
        for _ in self:
            pass
        assert self.completion is not None
        return self.completion


@dataclass
class _Step:
    draft: Draft | None
    verdict: Verdict
    new_tokens: list[int] = field(default_factory=list)


class Engine:
    """Loads a target once; generates and streams many times.

    :param target: the served model.
    :param drafter: default drafter name (``"none"`` for plain decoding).
    :param verifier: default verifier name; None picks ``greedy`` for temperature 0 and
        ``rejection`` otherwise.
    :param exit_policy: default exit-policy name.
    :param max_draft: the most draft tokens one step may verify.
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
        drafter: str = "ngram",
        verifier: str | None = None,
        exit_policy: str = "adaptive",
        max_draft: int = 8,
        drafter_options: dict[str, dict[str, Any]] | None = None,
        prefix_cache_entries: int = 4,
        prefix_cache_bytes: int | None = None,
        plugin_failure_limit: int = 3,
        plugin_timeout_s: float | None = 5.0,
    ) -> None:
        if max_draft < 0:
            raise BadInputError(f"max_draft must be >= 0, got {max_draft}")
        self.target = target
        self.tokenizer = target.tokenizer
        self.default_drafter = drafter
        self.default_verifier = verifier
        self.default_exit_policy = exit_policy
        self.max_draft = max_draft
        self.drafter_options = dict(drafter_options or {})
        self.prefix_cache = PrefixCache(
            target.new_cache, max_entries=prefix_cache_entries, max_bytes=prefix_cache_bytes
        )
        self.guard = PluginGuard(failure_limit=plugin_failure_limit, timeout_s=plugin_timeout_s)
        self.corpus: Corpus | None = None
        self._drafters: dict[str, Drafter] = {}
        self._verifiers: dict[str, Verifier] = {}
        self._lock = threading.Lock()
        # Validate the defaults now so a bad name fails at start, not at the first request.
        self._check_names(drafter, verifier, exit_policy)

    @classmethod
    def load(
        cls,
        model: str | None = None,
        *,
        dtype: str | None = None,
        device: str | None = None,
        trust_remote_code: bool = False,
        **engine_kwargs: Any,
    ) -> Engine:
        """Load a model offline (the default: SmolLM2-135M-Instruct; see
        :func:`specd.models.load_target`) and build an engine."""
        from .models import load_target

        target = load_target(model, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
        return cls(target, **engine_kwargs)

    # -- public API ---------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

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
    ) -> Generation:
        """Start a generation and stream it.

        :param prompt: text, or token ids.
        :param params: sampling parameters (default: greedy, 64 tokens).
        :param drafter: drafter name for this request (``"none"``: plain decoding).
        :param cancel: checked before every target step; when true the generation ends
            with ``finish_reason == "cancelled"``.
        :param time_budget_s: wall-clock budget; when spent the generation ends with
            ``finish_reason == "time"``.
        :param corpus: extra text for drafters to copy from (default: the engine's).
        :returns: a :class:`Generation`; iterate it for deltas.
        """
        params = params or SamplingParams()
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            ids = self._empty_prompt_ids()
        bad = [t for t in ids if not 0 <= t < self.target.vocab_size]
        if bad:
            raise BadInputError(
                f"prompt token ids out of range [0, {self.target.vocab_size}): {bad[:5]}"
            )
        if isinstance(cancel, threading.Event):
            cancel = cancel.is_set
        d = drafter or self.default_drafter
        v = verifier or self.default_verifier or ("greedy" if params.greedy else "rejection")
        e = exit_policy or self.default_exit_policy
        # Plain decoding uses neither a verifier nor a policy's budget.
        self._check_names(d, v if d != NO_DRAFTER else None, e)
        self._check_exactness(d, v, params)
        req = Request(
            prompt=ids,
            params=params,
            drafter=d,
            verifier=v,
            exit_policy=e,
            cancel=cancel,
            deadline=None if time_budget_s is None else time.monotonic() + time_budget_s,
            corpus=corpus if corpus is not None else self.corpus,
        )
        # Build the plugins now, so bad options fail here rather than mid-stream.
        req.drafter_obj = self._drafter(d)
        if req.drafter_obj is not None:
            req.verifier_obj = self._verifier(v)
            req.policy_obj = self._construct("exit_policies", e)
        gen = Generation(iter(()))
        gen._it = self._run(req, gen)
        return gen

    def plugin_health(self) -> dict[str, dict[str, Any]]:
        """Calls, failures and disabled state per plugin since the engine started."""
        return self.guard.snapshot()

    # -- validation ---------------------------------------------------------------------

    def _empty_prompt_ids(self) -> list[int]:
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if bos is None:
            raise BadInputError("the prompt is empty and the model has no BOS token to start from")
        return [int(bos)]

    def _check_names(self, drafter: str, verifier: str | None, exit_policy: str) -> None:
        if drafter != NO_DRAFTER:
            registry.drafter_class(drafter)
        if verifier is not None:
            registry.verifier_class(verifier)
        registry.exit_policy_class(exit_policy)

    def _check_exactness(self, drafter: str, verifier: str, params: SamplingParams) -> None:
        if drafter == NO_DRAFTER:
            return
        mode = "greedy" if params.greedy else "sampled"
        cls = registry.verifier_class(verifier)
        if mode not in cls.exact_for:
            raise BadInputError(
                f"verifier {verifier!r} is not exact for {mode} decoding "
                f"(temperature={params.temperature}); "
                + (
                    "use a sampling verifier such as 'rejection', or --drafter none"
                    if mode == "sampled"
                    else "use 'greedy'"
                )
            )

    # -- plugin instances -----------------------------------------------------------------

    def _construct(self, kind: str, name: str, options: dict[str, Any] | None = None) -> Any:
        """A plugin instance, or None when its constructor failed (isolated like any other
        plugin failure). Options the constructor rejects are the user's error and raise."""
        key = f"{kind.rstrip('s')}:{name}"
        if self.guard.disabled(key):
            return None
        try:
            return registry.make(kind, name, options)
        except BadInputError:
            raise
        except Exception as exc:  # noqa: BLE001
            self.guard.fail(key, exc)
            return None

    def _drafter(self, name: str) -> Drafter | None:
        if name == NO_DRAFTER or self.guard.disabled(f"drafter:{name}"):
            return None
        if name not in self._drafters:
            drafter = self._construct("drafters", name, self.drafter_options.get(name))
            if drafter is None:
                return None
            self._drafters[name] = drafter
        return self._drafters[name]

    def _verifier(self, name: str) -> Verifier | None:
        if name not in self._verifiers:
            verifier = self._construct("verifiers", name)
            if verifier is None:
                return None
            self._verifiers[name] = verifier
        return self._verifiers[name]

    # -- the decode loop ----------------------------------------------------------------

    def _run(self, req: Request, gen: Generation) -> Iterator[Delta]:
        with self._lock:
            yield from self._decode(req, gen)

    def _decode(self, req: Request, gen: Generation) -> Iterator[Delta]:
        t_start = time.perf_counter()
        params = req.params
        stats = Stats(prompt_tokens=len(req.prompt), drafter=req.drafter)
        generator = make_generator(params.seed)
        text = TextStream(self.tokenizer, params.stop)
        out_ids: list[int] = []

        spec = _Speculation(self, req, stats)
        cache, reused, stop = self.prefill(req.prompt, lambda: self._should_stop(req))
        stats.reused_tokens = reused
        stats.prefill_s = time.perf_counter() - t_start
        pending = req.prompt[-1]
        if stop:  # cancelled or out of time during prefill; what was computed stays cached
            self.prefix_cache.release(cache, req.prompt[: cache.length])
            stats.finish_reason = stop
            stats.total_s = time.perf_counter() - t_start
            gen.completion = Completion(text="", token_ids=[], stats=stats)
            return

        ctx = DraftContext(
            tokens=list(req.prompt),
            params=params,
            generator=generator,
            vocab_size=self.target.vocab_size,
            target=self.target,
            corpus=req.corpus,
            exit_policy=spec.policy,
            cache=cache,
        )
        try:
            spec.start(ctx)
            finish = ""
            while not finish:
                finish = self._should_stop(req)
                if finish:
                    break
                t_step = time.perf_counter()
                remaining = params.max_tokens - len(out_ids)
                draft = spec.draft_step(ctx, min(self.max_draft, remaining - 1))
                t_drafted = time.perf_counter()
                stats.draft_s += t_drafted - t_step

                step = self.verify_step(cache, pending, draft, spec, params, generator, ctx)
                stats.verify_s += time.perf_counter() - t_drafted

                new = step.new_tokens
                n_drafted = len(draft) if draft is not None else 0
                n_accepted = len(step.verdict.path)
                depth = max(draft.depths()) if draft is not None else 0
                stats.record_step(n_drafted, depth, n_accepted)
                pending = new[-1]
                ctx.tokens.extend(new)
                spec.commit(ctx, new, n_drafted, n_accepted)

                # EOS and max_tokens cut what is emitted; the cache may hold a little more,
                # which is harmless: the prefix cache records exactly what it holds.
                emit = new
                for i, t in enumerate(emit):
                    if t in self.target.eos_token_ids:
                        emit, finish = emit[:i], "eos"
                        break
                if len(out_ids) + len(emit) >= params.max_tokens:
                    emit = emit[: params.max_tokens - len(out_ids)]
                    finish = finish or "length"
                piece, kept = text.push(emit)
                emit = emit[:kept]
                if text.stopped:
                    finish = "stop"
                out_ids.extend(emit)
                if emit and stats.new_tokens == 0:
                    stats.ttft_s = time.perf_counter() - t_start
                stats.new_tokens = len(out_ids)
                stats.step_s.append((time.perf_counter() - t_step) / max(len(emit), 1))
                if piece or emit:
                    yield Delta(piece, emit)
            tail = text.flush()
            if tail:
                yield Delta(tail, [])
            stats.finish_reason = finish
        finally:
            spec.finish(ctx)
            # The cache holds every committed token but the pending one.
            self.prefix_cache.release(cache, ctx.tokens[:-1])
        stats.total_s = time.perf_counter() - t_start
        if stats.new_tokens and not stats.ttft_s:
            stats.ttft_s = stats.total_s
        gen.completion = Completion(text=text.text, token_ids=out_ids, stats=stats)

    @staticmethod
    def _should_stop(req: Request) -> str:
        """ "cancelled" or "time" when the request must end now, else ""."""
        if req.cancel is not None and req.cancel():
            return "cancelled"
        if req.deadline is not None and time.monotonic() > req.deadline:
            return "time"
        return ""

    def prefill(self, prompt: Sequence[int], stop: Callable[[], str] | None = None):
        """Bring a cache to hold ``prompt[:-1]``, reusing the longest cached prefix, with
        ``stop`` checked between prefill chunks (:data:`specd.target.PREFILL_CHUNK`).

        :returns: (cache, tokens reused from an earlier request, why it stopped early or "").
        """
        head = list(prompt[:-1])
        cache, reused = self.prefix_cache.acquire(head)
        try:
            why = self.target.prefill(cache, head[reused:], stop)
        except BaseException:
            cache.crop(0)
            self.prefix_cache.release(cache, [])
            raise
        return cache, reused, why

    def verify_step(
        self,
        cache,
        pending: int,
        draft: Draft | None,
        spec: _Speculation,
        params: SamplingParams,
        generator: torch.Generator,
        ctx: DraftContext,
    ) -> _Step:
        """One target forward over ``[pending, draft...]``, the verifier's decision, and the
        cache commit/rollback. A failed verifier costs only its draft: the target's own
        token at the root is taken instead."""
        base = cache.length
        tokens = [pending]
        parents = None
        if draft is not None:
            tokens += draft.tokens
            parents = [-1] + [p + 1 if p >= 0 else 0 for p in draft.parents]
        out = self.target.forward(cache, tokens, parents, hidden=spec.wants_hidden)
        # logits: [1 + N, V] -> p: the target's distributions at the root and after each node
        p = warp(out.logits, params)
        verdict = spec.verify(draft, p, generator) if draft is not None else None
        if verdict is None:
            verdict = Verdict(path=[], token=_choose(p[0], params, generator))
        # Commit: keep the pending token and the accepted path; roll back the rest.
        cache.keep(base, [base] + [base + 1 + i for i in verdict.path])
        if spec.wants_hidden and out.hidden is not None:
            ctx.hidden = out.hidden[[0] + [1 + i for i in verdict.path]]
        new = [draft.tokens[i] for i in verdict.path] if draft is not None else []
        new.append(verdict.token)
        return _Step(draft=draft, verdict=verdict, new_tokens=new)


class _Speculation:
    """The plugins serving one request, each call isolated by the engine's guard. When one
    fails, the request goes on with plain decoding."""

    def __init__(self, engine: Engine, req: Request, stats: Stats) -> None:
        self.engine = engine
        self.guard = engine.guard
        self.stats = stats
        self.params = req.params
        self.drafter_key = f"drafter:{req.drafter}"
        self.verifier_key = f"verifier:{req.verifier}"
        self.policy_key = f"exit_policy:{req.exit_policy}"
        self.drafter = req.drafter_obj
        self.verifier = req.verifier_obj
        self.policy: ExitPolicy = req.policy_obj  # type: ignore[assignment]  # None only with drafter None
        self.deadline = req.deadline
        parts = (
            (self.drafter_key, self.drafter),
            (self.verifier_key, self.verifier),
            (self.policy_key, self.policy),
        )
        missing = [key for key, obj in parts if obj is None]
        if req.drafter != NO_DRAFTER and missing:
            self._give_up(f"{', '.join(missing)} disabled or failed to start")

    @property
    def wants_hidden(self) -> bool:
        return self.drafter is not None and self.drafter.wants_hidden

    def _give_up(self, why: str) -> None:
        self.stats.fallback = self.stats.fallback or why
        self.drafter = None
        self.verifier = None

    def start(self, ctx: DraftContext) -> None:
        if self.drafter is None:
            return
        try:
            self.guard.call(self.policy_key, self.policy.start, self.engine.max_draft)
            self.guard.call(self.drafter_key, self.drafter.start, ctx, deadline=self.deadline)
        except PluginFailed as e:
            self._give_up(str(e))

    def draft_step(self, ctx: DraftContext, limit: int) -> Draft | None:
        """Ask the policy for a budget and the drafter for at most that many nodes."""
        if self.drafter is None or limit <= 0:
            return None
        drafter = self.drafter
        vocab = self.engine.target.vocab_size
        try:
            budget = min(
                limit,
                max(
                    int(self.guard.call(self.policy_key, self.policy.draft_budget)),
                    0,
                ),
            )
            if budget <= 0:
                return None

            def propose() -> Draft | None:
                draft = drafter.propose(ctx, budget)
                if draft is None or len(draft) == 0:
                    return None
                _check_draft(draft, budget, vocab)
                return draft

            return self.guard.call(self.drafter_key, propose, deadline=self.deadline)
        except PluginFailed as e:
            self._give_up(str(e))
            return None

    def verify(self, draft: Draft, p: torch.Tensor, generator: torch.Generator) -> Verdict | None:
        verifier = self.verifier
        if verifier is None:
            return None

        def run() -> Verdict:
            verdict = verifier.verify(draft, p, self.params, generator)
            _check_verdict(verdict, draft, p.shape[-1])
            return verdict

        try:
            return self.guard.call(self.verifier_key, run, deadline=self.deadline)
        except PluginFailed as e:
            self._give_up(str(e))
            return None

    def commit(self, ctx: DraftContext, new: list[int], drafted: int, accepted: int) -> None:
        if self.drafter is None:
            return
        try:
            self.guard.call(self.policy_key, self.policy.observe, drafted, accepted)
            self.guard.call(
                self.drafter_key, self.drafter.commit, ctx, new, accepted, deadline=self.deadline
            )
        except PluginFailed as e:
            self._give_up(str(e))

    def finish(self, ctx: DraftContext) -> None:
        if self.drafter is None:
            return
        try:
            self.guard.call(self.drafter_key, self.drafter.finish, ctx, deadline=self.deadline)
        except PluginFailed:
            pass


def _choose(p: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The target's own token from a warped distribution (plain decoding)."""
    if params.greedy:
        return int(p.argmax())
    return sample(p, generator)


def _check_draft(draft: Draft, budget: int, vocab: int) -> None:
    n = len(draft.tokens)
    if n > budget:
        raise PluginError(f"draft of {n} nodes exceeds the budget of {budget}")
    if len(draft.parents) != n:
        raise PluginError("draft tokens and parents differ in length")
    for i, (t, par) in enumerate(zip(draft.tokens, draft.parents)):
        if not isinstance(t, int) or not 0 <= t < vocab:
            raise PluginError(
                f"draft token {t!r} at node {i} is outside the vocabulary [0, {vocab})"
            )
        if not -1 <= par < i:
            raise PluginError(f"draft node {i} has parent {par}; parents must precede children")
    if draft.q is not None:
        q = draft.q
        if q.shape != (n, vocab):
            raise PluginError(f"draft q has shape {tuple(q.shape)}, expected {(n, vocab)}")
        if not torch.isfinite(q).all() or (q < 0).any():
            raise PluginError("draft q has NaN, infinite or negative probabilities")
        if not torch.allclose(
            q.sum(-1).double().cpu(), torch.ones(n, dtype=torch.float64), atol=1e-3
        ):
            raise PluginError("draft q rows do not sum to 1")


def _check_verdict(verdict: Verdict, draft: Draft, vocab: int) -> None:
    prev = -1
    for node in verdict.path:
        if not 0 <= node < len(draft) or draft.parents[node] != prev:
            raise PluginError(
                f"verifier returned a path {verdict.path} that is not a root path of the draft"
            )
        prev = node
    if not 0 <= verdict.token < vocab:
        raise PluginError(f"verifier returned token {verdict.token} outside the vocabulary")
