"""Peak RSS of one configuration, measured in a fresh process.

Run as ``python -m specd.bench.probe`` with a JSON job on stdin; prints one JSON line:
``base_rss_mb`` (interpreter and libraries imported), ``loaded_rss_mb`` (model loaded, its
weights paged in) and ``peak_rss_mb`` (the process's high-water mark after running the
configuration on the job's prompts).

A fresh process per configuration is the only way to give each configuration its own peak:
in one long-lived process the allocator keeps memory freed by earlier configurations, and
the model, the libraries and every engine built so far are counted for whichever runs last.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

#: Environment for the probe process: the same offline, quiet settings as the CLI.
PROBE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass
class TargetSpec:
    """How to load the target, as the ``--model`` options say (``tiny`` in tests)."""

    model: str | None = None
    dtype: str | None = None
    device: str | None = None
    trust_remote_code: bool = False
    #: ``--compile``: the compiled decode step, as :meth:`specd.Target.compile` takes it
    compile: str = "auto"
    #: ``--prefill-dtype``
    prefill_dtype: str | None = None
    #: ``--packed-weights``
    packed_weights: str = "off"
    #: ``--weights``
    weights: str = "auto"
    #: ``--kv-dtype``
    kv_dtype: str = "auto"

    def load(self):
        """The target as ``Engine.load`` serves it: its step compiled, its verify passes
        priced for the exit policy (a bench whose policy went unpriced would time drafts the
        engine never makes)."""
        from ..forward.models import serving_target

        return serving_target(
            self.model,
            dtype=self.dtype,
            device=self.device,
            trust_remote_code=self.trust_remote_code,
            compile=self.compile,
            prefill_dtype=self.prefill_dtype,
            packed_weights=self.packed_weights,
            weights=self.weights,
            kv_dtype=self.kv_dtype,
        )

    def load_draft(self, draft_model: str, target):
        """The draft model for ``hf-assisted``: ``target`` (the served model itself),
        ``tiny:SEED`` (a tiny random model over the target's vocabulary) or a model name as
        ``--model`` takes it, on the target's device and dtype."""
        if draft_model == "target":
            return target.hf_model()
        if draft_model.startswith("tiny:"):
            from ..forward.tiny import tiny_model

            lm = tiny_model(
                target.vocab_size, num_layers=1, seed=int(draft_model.removeprefix("tiny:"))
            )
            return lm.to(device=target.device, dtype=target.dtype)
        from ..forward import models

        lm, _ = models.load(
            draft_model,
            dtype=str(target.dtype).removeprefix("torch."),
            device=str(target.device),
            trust_remote_code=self.trust_remote_code,
            lean=False,  # transformers' assisted generation runs it
        )
        return lm


def job(
    spec: TargetSpec,
    config: str,
    prompts: list,
    *,
    threads: int | None,
    draft_model: str | None,
    draft_options: dict,
) -> dict:
    return {
        # Peak memory, not speed, is measured here: an explicit compile (minutes on CPU)
        # would be paid again in every probe process, so probes leave it to ``auto``.
        "target": {**asdict(spec), "compile": "auto"},
        "config": config,
        "prompts": [{"name": p.name, "ids": p.ids, "max_tokens": p.max_tokens} for p in prompts],
        "threads": threads,
        "draft_model": draft_model,
        "draft_options": draft_options,
    }


def main() -> int:
    from .runners import current_rss_kb, peak_rss_kb

    spec_in = json.loads(sys.stdin.read())
    import torch

    if spec_in.get("threads"):
        torch.set_num_threads(int(spec_in["threads"]))
    from . import configs
    from .runners import Runner
    from .workloads import Prompt

    base = current_rss_kb()
    spec = TargetSpec(**spec_in["target"])
    target = spec.load()
    cfg = configs.parse(
        spec_in["config"],
        draft_model=spec_in.get("draft_model"),
        draft_options=spec_in.get("draft_options"),
    )
    draft_lm = spec.load_draft(spec_in["draft_model"], target) if cfg.assisted else None
    # Page the weights in, so "loaded" means resident, not just mapped.
    with torch.inference_mode():
        for p in target.model.parameters():
            p.sum()
    loaded = current_rss_kb()
    runner = Runner(target, draft_lm=draft_lm)
    for p in spec_in["prompts"]:
        runner.run(cfg, Prompt(p["name"], p["ids"], p["max_tokens"]))
    print(
        json.dumps(
            {
                "base_rss_mb": base / 1024,
                "loaded_rss_mb": loaded / 1024,
                "peak_rss_mb": peak_rss_kb() / 1024,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
