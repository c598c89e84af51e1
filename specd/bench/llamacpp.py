"""llama.cpp as a baseline, through its Python binding ``llama-cpp-python`` (the extra
``specd[llamacpp]``).

``llamacpp-plain`` is llama.cpp's greedy decoding of the model's own GGUF file;
``llamacpp-lookup[-N]`` adds the binding's draftless speculation, prompt lookup
(``llama_cpp.llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=N)``). The C++
server's ``--spec-type`` n-gram modes live in the server and the ``common`` library, which
the binding does not expose, so prompt lookup is the one draftless mode reachable here.

Each configuration loads its ``Llama`` once (the load is timed and kept out of the rates),
with as many threads as torch uses, and is fed the very token ids specd is fed. Like every
other configuration of the bench, each run starts with an empty KV cache: ``Llama.generate``
would otherwise reuse the longest prefix the previous prompt left behind.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from .configs import Config
from .run import Run
from .workloads import Prompt

#: Extra context past the prompt and its new tokens: the binding appends a whole draft to
#: the tokens it evaluates, and the tokens must fit in the context.
DRAFT_SLACK = 32


def import_error() -> str | None:
    """Why ``llama_cpp`` cannot be used here (its import error), or None when it imports."""
    try:
        import llama_cpp  # noqa: F401
        import llama_cpp.llama_speculative  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a failed build raises OSError/RuntimeError too
        return (
            f"llama-cpp-python is not usable (install it with pip install 'specd[llamacpp]'): "
            f"{type(exc).__name__}: {exc}"
        )
    return None


def version() -> str | None:
    """The installed ``llama-cpp-python`` version (None when it is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("llama-cpp-python")
    except PackageNotFoundError:
        return None


def model_file(model: str) -> Path | None:
    """The GGUF file of ``model`` (an alias of :data:`specd.forward.models.ALIASES` or a
    ``.gguf`` path), or None when the model is not one."""
    from ..forward.models import gguf_file

    return gguf_file(model)


def unavailable(model: str) -> str | None:
    """Why the llama.cpp configurations cannot run on ``model`` (None: they can)."""
    from ..forward.models import is_gguf

    if not is_gguf(model):
        return f"llama.cpp runs GGUF files; {model} is not one"
    return import_error()


class LlamaCppRunner:
    """Runs the llama.cpp configurations on one GGUF file, one ``Llama`` per configuration.

    :param model_path: the GGUF file.
    :param eos_token_ids: the tokens that end a generation (the target's, so both stop alike).
    :param vocab_size: the target's vocabulary; a file with another one is refused, since the
        prompts' token ids would mean other tokens there.
    :param longest: the longest prompt plus its new tokens the runs will ask for: the context
        to allocate at first (a longer one reloads the configuration).
    """

    def __init__(
        self,
        model_path: Path,
        *,
        eos_token_ids: set[int] | frozenset[int],
        vocab_size: int,
        longest: int = 0,
    ) -> None:
        self.model_path = model_path
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.longest = longest
        #: seconds each configuration's (last) load took; not part of any rate
        self.load_s: dict[str, float] = {}
        self._llms: dict[str, Any] = {}

    def load(self, cfg: Config, need: int) -> Any:
        """The configuration's ``Llama`` (a :func:`_counted` one), loaded on first use or
        when ``need`` tokens (a prompt and its new tokens) do not fit its context."""
        have = self._llms.get(cfg.name)
        if have is not None and have.n_ctx() >= need + DRAFT_SLACK:
            return have
        counted_llama, counted_lookup = _counted()
        self.longest = max(self.longest, need)
        draft = None
        if cfg.prompt_lookup_tokens:
            draft = counted_lookup(num_pred_tokens=cfg.prompt_lookup_tokens)
        threads = torch.get_num_threads()
        t0 = time.perf_counter()
        llm = counted_llama(
            model_path=str(self.model_path),
            n_ctx=self.longest + DRAFT_SLACK,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=512,
            verbose=False,
            # The binding keeps every position's logits when it speculates, whatever this
            # says, but sizes its buffer by it: with False, n_batch rows, and a prompt of
            # more than n_batch tokens overflows them.
            logits_all=draft is not None,
            draft_model=draft,
        )
        self.load_s[cfg.name] = time.perf_counter() - t0
        if llm.n_vocab() != self.vocab_size:
            raise ValueError(
                f"{self.model_path.name} has {llm.n_vocab()} tokens, the target "
                f"{self.vocab_size}: the prompts' token ids would mean other tokens"
            )
        self._llms[cfg.name] = llm
        return llm

    def run(self, cfg: Config, prompt: Prompt) -> Run:
        """Greedy generation of up to ``prompt.max_tokens`` tokens after ``prompt.ids``,
        stopping before an end-of-sequence token, timed per target step."""
        llm = self.load(cfg, len(prompt.ids) + prompt.max_tokens)
        draft = llm.draft_model
        # An empty KV cache: without this generate keeps the previous prompt's longest
        # common prefix and evaluates only the rest, which would flatter the TTFT.
        llm.reset()
        llm.passes = 0
        if draft is not None:
            draft.drafted = 0
        tokens: list[int] = []
        events: list[tuple[float, int]] = []
        seen_pass = 0
        t0 = last = time.perf_counter()
        gen = llm.generate(list(prompt.ids), top_k=1, temp=0.0, repeat_penalty=1.0)
        try:
            for token in gen:
                now = time.perf_counter()
                token = int(token)
                if token in self.eos_token_ids:
                    break
                tokens.append(token)
                if llm.passes != seen_pass or not events:
                    # The first token out of a new forward pass opens the pass's event.
                    seen_pass = llm.passes
                    events.append((now - last, 1))
                    last = now
                else:  # a draft token the same pass accepted
                    events[-1] = (events[-1][0], events[-1][1] + 1)
                if len(tokens) >= prompt.max_tokens:
                    break
        finally:
            gen.close()
        total = time.perf_counter() - t0
        llm.reset()
        return Run(
            token_ids=tokens,
            total_s=total,
            ttft_s=events[0][0] if events else total,
            events=events,
            steps=len(events),
            drafted=draft.drafted if draft is not None else 0,
            accepted=len(tokens) - len(events),
        )


def _counted() -> tuple[type, type]:
    """``Llama`` counting its forward passes (``passes``: one call of ``eval`` is one pass,
    the target step) and the prompt-lookup draft counting the tokens it proposed
    (``drafted``); made from the ``llama_cpp`` imported now."""
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class CountedLlama(llama_cpp.Llama):
        passes = 0

        def eval(self, tokens: Any) -> None:
            self.passes += 1
            super().eval(tokens)

    class CountedLookup(LlamaPromptLookupDecoding):
        drafted = 0

        def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
            out = super().__call__(input_ids, **kwargs)
            self.drafted += len(out)
            return out

    return CountedLlama, CountedLookup
