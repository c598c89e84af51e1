"""Benchmark configurations: the Hugging Face baselines and the specd settings under test.

Names are what ``--configs`` takes:

- ``hf-plain``: ``model.generate`` greedy.
- ``hf-prompt-lookup`` or ``hf-prompt-lookup-N``: ``generate(prompt_lookup_num_tokens=N)``
  (default 10, the value Hugging Face's documentation uses).
- ``hf-assisted``: ``generate(assistant_model=...)`` with ``--draft-model``.
- ``llamacpp-plain``: llama.cpp's greedy decoding of the model's GGUF file, and
  ``llamacpp-lookup`` or ``llamacpp-lookup-N``: with its prompt lookup (N draft tokens,
  default 10, the binding's default), through ``llama-cpp-python`` (:mod:`.llamacpp`).
- ``specd-plain``: the engine with ``--drafter none``.
- ``specd-DRAFTER-POLICY-kN``: the engine with that drafter, exit policy and ``--max-draft N``,
  e.g. ``specd-ngram-adaptive-k8``; ``+KEY=VALUE`` suffixes pass drafter options, e.g.
  ``specd-draft_model-fixed-k6+tree=topk+branch=2`` (a token tree).

The three references (``hf-plain``, ``hf-prompt-lookup``, ``specd-plain``) always run, since
every ratio in the report divides by one of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .. import registry
from ..errors import BadInputError
from ..limits import MAX_DRAFT
from ..speculation import NO_DRAFTER

HF_PLAIN = "hf-plain"
HF_PROMPT_LOOKUP = "hf-prompt-lookup"
HF_ASSISTED = "hf-assisted"
SPECD_PLAIN = "specd-plain"
LLAMACPP_PLAIN = "llamacpp-plain"
LLAMACPP_LOOKUP = "llamacpp-lookup"
REFERENCES = (HF_PLAIN, HF_PROMPT_LOOKUP, SPECD_PLAIN)

#: Hugging Face's documented example value for ``prompt_lookup_num_tokens``.
HF_PROMPT_LOOKUP_TOKENS = 10

#: ``LlamaPromptLookupDecoding``'s default ``num_pred_tokens``.
LLAMACPP_LOOKUP_TOKENS = 10

#: The llama.cpp configurations run by default (skipped with the reason where they cannot).
LLAMACPP_DEFAULTS = [LLAMACPP_PLAIN, LLAMACPP_LOOKUP, f"{LLAMACPP_LOOKUP}-2"]

#: Drafters that need a draft model (``--draft-model``) to be benchmarked.
MODEL_DRAFTERS = ("draft_model",)

#: The default configurations of the drafters we know; any other installed drafter gets
#: ``specd-NAME-adaptive-k8``.
DRAFTER_DEFAULTS = {
    "ngram": [
        "specd-ngram-fixed-k4",
        "specd-ngram-fixed-k8",
        "specd-ngram-fixed-k16",
        "specd-ngram-adaptive-k8",
        "specd-ngram-adaptive-k16",
    ],
    "early_exit": ["specd-early_exit-fixed-k4", "specd-early_exit-adaptive-k6"],
}


@dataclass(frozen=True)
class Config:
    """One way of generating: a Hugging Face baseline or a specd engine setting.

    ``drafter`` is the name ``specd generate --drafter`` accepts (``"none"`` for specd plain)
    and None for the Hugging Face baselines.
    """

    name: str
    kind: str  # "hf" | "specd" | "llamacpp"
    drafter: str | None = None
    exit_policy: str | None = None
    max_draft: int = 0
    prompt_lookup_tokens: int | None = None
    assisted: bool = False
    drafter_options: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def generate_args(self) -> str | None:
        """The ``specd generate`` flags that reproduce this configuration (None for HF)."""
        if self.kind != "specd":
            return None
        if self.drafter == NO_DRAFTER:
            return "--drafter none"
        args = f"--drafter {self.drafter} --exit-policy {self.exit_policy} --max-draft {self.max_draft}"
        for k, v in self.drafter_options.items():
            args += f" --drafter-option {k}={v}"
        return args

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "exit_policy": self.exit_policy,
            "max_draft": self.max_draft or None,
            "prompt_lookup_num_tokens": self.prompt_lookup_tokens,
            "generate_args": self.generate_args(),
        }


_SPECD_RE = re.compile(
    r"^specd-(?P<drafter>.+)-(?P<policy>[a-z_]+)-k(?P<k>\d+)(?P<opts>(?:\+[^+=]+=[^+]*)*)$"
)
_PL_RE = re.compile(r"^hf-prompt-lookup(?:-(?P<n>\d+))?$")
_LLAMACPP_RE = re.compile(r"^llamacpp-lookup(?:-(?P<n>\d+))?$")


def parse(
    name: str, *, draft_model: str | None = None, draft_options: dict[str, Any] | None = None
) -> Config:
    """A configuration from its name (see the module docstring).

    :raises BadInputError: malformed name, unknown drafter or exit policy, or a
        configuration that needs ``--draft-model`` without one.
    """
    if name == HF_PLAIN:
        return Config(HF_PLAIN, "hf")
    if m := _PL_RE.match(name):
        n = int(m["n"]) if m["n"] else HF_PROMPT_LOOKUP_TOKENS
        if n < 1:
            raise BadInputError(f"configuration {name!r}: prompt lookup needs at least 1 token")
        return Config(name, "hf", prompt_lookup_tokens=n)
    if name == HF_ASSISTED:
        if draft_model is None:
            raise BadInputError(f"configuration {name!r} needs --draft-model")
        return Config(HF_ASSISTED, "hf", assisted=True)
    if name.startswith("llamacpp-"):
        return _parse_llamacpp(name)
    if name in (SPECD_PLAIN, "specd-none"):
        return Config(SPECD_PLAIN, "specd", drafter=NO_DRAFTER)
    m = _SPECD_RE.match(name)
    if not m:
        raise BadInputError(
            f"unknown configuration {name!r}; use hf-plain, hf-prompt-lookup[-N], hf-assisted, "
            "llamacpp-plain, llamacpp-lookup[-N], specd-plain or specd-DRAFTER-POLICY-kN[+KEY=VALUE...] (e.g. specd-ngram-adaptive-k8)"
        )
    drafter, policy, k = m["drafter"], m["policy"], int(m["k"])
    registry.drafter_class(drafter)  # raises UnknownPluginError (a BadInputError)
    registry.exit_policy_class(policy)
    if not 1 <= k <= MAX_DRAFT:
        raise BadInputError(
            f"configuration {name!r}: the draft length must be from 1 to {MAX_DRAFT}"
        )
    options: dict[str, Any] = {}
    if drafter in MODEL_DRAFTERS:
        if draft_model is None:
            raise BadInputError(f"configuration {name!r} needs --draft-model")
        options = {"model": draft_model, **(draft_options or {})}
    if m["opts"]:
        from ..options import parse_options

        options.update(parse_options(m["opts"].lstrip("+").split("+")))
    return Config(
        name, "specd", drafter=drafter, exit_policy=policy, max_draft=k, drafter_options=options
    )


def _parse_llamacpp(name: str) -> Config:
    if name == LLAMACPP_PLAIN:
        return Config(name, "llamacpp")
    m = _LLAMACPP_RE.match(name)
    if not m:
        raise BadInputError(
            f"unknown llama.cpp configuration {name!r}; use llamacpp-plain or "
            "llamacpp-lookup[-N] (prompt lookup with N draft tokens)"
        )
    n = int(m["n"]) if m["n"] else LLAMACPP_LOOKUP_TOKENS
    if n < 1:
        raise BadInputError(f"configuration {name!r}: prompt lookup needs at least 1 token")
    return Config(name, "llamacpp", prompt_lookup_tokens=n)


def default_names(*, draft_model: str | None = None) -> tuple[list[str], list[dict[str, str]]]:
    """The default configuration names for what is installed, and the ones skipped (with why).

    Drafters that need a draft model are skipped unless ``draft_model`` is given.
    """
    names = [HF_PLAIN, HF_PROMPT_LOOKUP, SPECD_PLAIN]
    skipped: list[dict[str, str]] = []
    installed = registry.registered("drafters")
    for drafter in sorted(installed):
        if drafter in MODEL_DRAFTERS:
            continue
        names += DRAFTER_DEFAULTS.get(drafter, [f"specd-{drafter}-adaptive-k8"])
    for drafter in MODEL_DRAFTERS:
        wanted = [
            f"specd-{drafter}-fixed-k4",
            f"specd-{drafter}-adaptive-k8",
            f"specd-{drafter}-fixed-k6+tree=topk+branch=2",
        ]
        if drafter not in installed:
            skipped += [
                {"config": n, "reason": f"the {drafter} plugin is not installed"} for n in wanted
            ]
        elif draft_model is None:
            skipped += [
                {"config": n, "reason": "no draft model (pass --draft-model)"} for n in wanted
            ]
        else:
            names += wanted
    names += LLAMACPP_DEFAULTS
    if draft_model is not None:
        names.append(HF_ASSISTED)
    else:
        skipped.append({"config": HF_ASSISTED, "reason": "no draft model (pass --draft-model)"})
    return names, skipped


def resolve(
    requested: list[str] | None,
    *,
    draft_model: str | None = None,
    draft_options: dict[str, Any] | None = None,
) -> tuple[list[Config], list[dict[str, str]]]:
    """Parse the requested names (default: :func:`default_names`), adding the references.

    :returns: (configurations in run order, skipped configurations with the reason).
    """
    skipped: list[dict[str, str]] = []
    if requested:
        names = list(requested)
    else:
        names, skipped = default_names(draft_model=draft_model)
    names = list(REFERENCES) + [n for n in names if n not in REFERENCES and n != "specd-none"]
    seen: set[str] = set()
    out = []
    for n in names:
        cfg = parse(n, draft_model=draft_model, draft_options=draft_options)
        if cfg.name not in seen:
            seen.add(cfg.name)
            out.append(cfg)
    return out, skipped
