"""Running one configuration on one prompt, timed the same way for every configuration.

Every kind is timed from the outside: a Hugging Face streamer sees each step's tokens as
``generate`` produces them, the engine's stream yields one delta per target step, and
llama.cpp's tokens are grouped by the forward pass that produced them (:mod:`.llamacpp`).
Each such *event* gets a timestamp, so TTFT, time per output token and tokens per target
step are measured by one piece of code for all.
"""

from __future__ import annotations

import re
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..engine import Engine
from ..forward.target import Target
from ..sampling import SamplingParams
from .configs import Config
from .run import Run
from .workloads import Prompt


class Runner:
    """Runs configurations against one target; builds each engine once.

    :param target: the served model (shared by every configuration).
    :param draft_lm: a draft model for ``hf-assisted``, or None.
    :param track_rss: reset the process's peak-RSS mark before each run and read it after
        (Linux ``/proc/self/clear_refs``), so each run reports its own peak.
    :param llamacpp_ctx: the context the llama.cpp configurations allocate at first (the
        longest prompt plus its new tokens); a longer prompt reloads them.
    """

    def __init__(
        self,
        target: Target,
        *,
        draft_lm: torch.nn.Module | None = None,
        track_rss: bool = False,
        llamacpp_ctx: int = 0,
    ) -> None:
        self.target = target
        self.draft_lm = draft_lm
        self.track_rss = track_rss and _can_reset_peak_rss()
        self.llamacpp_ctx = llamacpp_ctx
        self._llamacpp: Any = None
        self._engines: dict[str, Engine] = {}
        eos = sorted(target.eos_token_ids)
        self._eos = eos
        self._pad = eos[0] if eos else 0

    def engine(self, cfg: Config) -> Engine:
        if cfg.name not in self._engines:
            drafter = cfg.drafter or "none"
            self._engines[cfg.name] = Engine(
                self.target,
                drafter=drafter,
                exit_policy=cfg.exit_policy or "adaptive",
                max_draft=cfg.max_draft,
                drafter_options={drafter: dict(cfg.drafter_options)}
                if cfg.drafter_options
                else None,
                prefix_cache_entries=1,
            )
        return self._engines[cfg.name]

    def run(self, cfg: Config, prompt: Prompt) -> Run:
        if cfg.kind == "llamacpp":
            # Loaded before any clock starts: a load is no part of a run.
            self.llamacpp().load(cfg, len(prompt.ids) + prompt.max_tokens)
        cuda = self.target.device.type == "cuda"
        if self.track_rss:
            reset_peak_rss()
        if cuda:
            torch.cuda.synchronize(self.target.device)
            torch.cuda.reset_peak_memory_stats(self.target.device)
        cpu0 = time.process_time()
        if cfg.kind == "hf":
            run = self._run_hf(cfg, prompt)
        elif cfg.kind == "llamacpp":
            run = self.llamacpp().run(cfg, prompt)
        else:
            run = self._run_specd(cfg, prompt)
        run.cpu_s = time.process_time() - cpu0
        if cuda:
            torch.cuda.synchronize(self.target.device)
            run.peak_gpu_bytes = torch.cuda.max_memory_allocated(self.target.device)
        if self.track_rss:
            run.peak_rss_kb = peak_rss_kb()
        return run

    def llamacpp(self):
        """The llama.cpp runner for this target's GGUF file (:mod:`.llamacpp`)."""
        if self._llamacpp is None:
            from . import llamacpp

            path = llamacpp.model_file(self.target.name)
            if path is None:
                raise ValueError(llamacpp.unavailable(self.target.name))
            self._llamacpp = llamacpp.LlamaCppRunner(
                path,
                eos_token_ids=self.target.eos_token_ids,
                vocab_size=self.target.vocab_size,
                longest=self.llamacpp_ctx,
            )
        return self._llamacpp

    def load_times(self) -> dict[str, float]:
        """Seconds each llama.cpp configuration took to load (kept out of its rates)."""
        return dict(self._llamacpp.load_s) if self._llamacpp is not None else {}

    # -- specd ------------------------------------------------------------------------------

    def _run_specd(self, cfg: Config, prompt: Prompt) -> Run:
        engine = self.engine(cfg)
        # Every configuration starts cold: reusing the KV cache another configuration left
        # for the same prompt would flatter the TTFT. Prefix reuse is measured on its own.
        engine.prefix_cache.clear()
        params = SamplingParams(max_tokens=prompt.max_tokens)
        events: list[tuple[float, int]] = []
        t0 = last = time.perf_counter()
        gen = engine.stream(prompt.ids, params)
        for delta in gen:
            if delta.token_ids:
                now = time.perf_counter()
                events.append((now - last, len(delta.token_ids)))
                last = now
        total = time.perf_counter() - t0
        engine.prefix_cache.clear()
        assert gen.completion is not None
        c = gen.completion
        s = c.stats
        return Run(
            token_ids=list(c.token_ids),
            total_s=total,
            ttft_s=events[0][0] if events else total,
            events=events,
            steps=s.target_steps,
            drafted=s.drafted,
            accepted=s.accepted,
            position_drafted=list(s.position_drafted),
            position_accepted=list(s.position_accepted),
            fallback=s.fallback,
        )

    # -- Hugging Face -----------------------------------------------------------------------

    def hf_kwargs(self, cfg: Config, max_tokens: int) -> dict[str, Any]:
        from transformers import GenerationConfig

        gc = GenerationConfig(
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=self._eos or None,
            pad_token_id=self._pad,
            prompt_lookup_num_tokens=cfg.prompt_lookup_tokens,
        )
        kw: dict[str, Any] = {"generation_config": gc}
        if cfg.assisted:
            if self.draft_lm is None:
                raise ValueError(f"{cfg.name} needs a draft model")
            kw["assistant_model"] = self.draft_lm
        return kw

    @torch.inference_mode()
    def _run_hf(self, cfg: Config, prompt: Prompt) -> Run:
        model = self.target.hf_model()  # transformers' generate, on the target's weights
        ids = torch.tensor([prompt.ids], dtype=torch.long, device=self.target.device)  # [1, T]
        kw = self.hf_kwargs(cfg, prompt.max_tokens)
        clock = _Clock()
        t0 = time.perf_counter()
        clock.last = t0
        out = model.generate(ids, attention_mask=torch.ones_like(ids), streamer=clock, **kw)
        total = time.perf_counter() - t0
        new = out[0, ids.shape[1] :].tolist()
        # The engine reports tokens without the EOS that ended them; so do we.
        while new and new[-1] in self.target.eos_token_ids:
            new.pop()
        return Run(
            token_ids=new,
            total_s=total,
            ttft_s=clock.events[0][0] if clock.events else total,
            events=clock.events,
            steps=len(clock.events),
        )


class _Clock:
    """A ``generate`` streamer that timestamps each step's tokens (the first put is the prompt)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int]] = []
        self.last = time.perf_counter()
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        now = time.perf_counter()
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.events.append((now - self.last, int(value.numel())))
        self.last = now

    def end(self) -> None:
        pass


# -- peak RSS ---------------------------------------------------------------------------------

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _can_reset_peak_rss() -> bool:
    try:
        reset_peak_rss()
        return peak_rss_kb() > 0
    except OSError:
        return False


def reset_peak_rss() -> None:
    """Set the process's peak-RSS mark (VmHWM) to its current RSS (Linux >= 4.0)."""
    _CLEAR_REFS.write_text("5")


def peak_rss_kb() -> int:
    """The process's peak RSS in KiB: VmHWM where /proc has it, else ru_maxrss."""
    try:
        m = re.search(r"VmHWM:\s+(\d+)\s+kB", _STATUS.read_text())
        if m:
            return int(m.group(1))
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss // 1024 if sys.platform == "darwin" else rss  # bytes on macOS, KiB on Linux


def current_rss_kb() -> int:
    try:
        m = re.search(r"VmRSS:\s+(\d+)\s+kB", _STATUS.read_text())
        if m:
            return int(m.group(1))
    except OSError:
        pass
    return 0
