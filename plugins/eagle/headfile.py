"""The head file: a safetensors file whose metadata names the target it was trained for.

Metadata keys: ``format`` (``specd-eagle-head/1``), ``target`` (the model name as given to
``--model``), ``target_hash`` (:func:`weights_hash` of the target), ``command`` (the command
line that trained it), ``init`` (only when training started from another head: the commands
that made that head, one per line, oldest first), ``config`` (the head's shapes, JSON) and
``valid`` (figures measured on the validation split, JSON). Loading a head for a target
with another weights hash is refused with :class:`HeadMismatchError`, naming both.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specd import BadInputError, Target

from .head import EagleHead, HeadConfig

FORMAT = "specd-eagle-head/1"
#: The ``head`` option that asks for an untrained head (tests, conformance checks).
RANDOM = "random"
#: Where the heads shipped with specd live, one per model alias: ``heads/<alias>.safetensors``.
SHIPPED = Path(__file__).resolve().parent / "heads"
#: Every this-many-th value of each weight tensor enters the hash (fast on a large model,
#: and any retrained or other model differs in them).
HASH_STRIDE = 97


class HeadMismatchError(BadInputError):
    """The head was trained for another target."""


def weights_hash(target: Target) -> str:
    """A hash of the target's weights, the same in every dtype and on every device: every
    :data:`HASH_STRIDE`-th value of each tensor, rounded to bfloat16, with names and shapes.
    Kept across starts (``Target.remembered``): computing it reads every weight, which for
    blocks means de-quantizing them all, a quarter of a second of each start."""
    cached = getattr(target, "_eagle_weights_hash", None)
    if cached is None:
        cached = target.remembered(f"eagle-weights-hash-{HASH_STRIDE}", lambda: _hash(target))
        target._eagle_weights_hash = cached  # type: ignore[attr-defined]
    return cached


def _hash(target: Target) -> str:
    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in sorted(target.model.state_dict().items()):
            h.update(f"{name}:{tuple(p.shape)};".encode())
            sample = p.detach().reshape(-1)[::HASH_STRIDE].to("cpu", torch.float32)
            h.update(sample.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:16]


def save_head(
    path: Path,
    head: EagleHead,
    target: Target,
    command: str,
    valid: dict | None = None,
    init: str | None = None,
) -> None:
    """Write ``head`` in bfloat16 (the draft vocabulary as int32)."""
    tensors = {
        k: (v.to(torch.int32) if k == "draft_vocab" else v.to(torch.bfloat16)).contiguous().cpu()
        for k, v in head.state_dict().items()
    }
    meta = {
        "format": FORMAT,
        "target": target.name,
        "target_hash": weights_hash(target),
        "command": command,
        "config": head.config.to_json(),
        "valid": json.dumps(valid or {}, sort_keys=True),
    }
    if init is not None:
        meta["init"] = init
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)


def read_meta(path: Path) -> dict[str, str]:
    """A head file's metadata; :class:`BadInputError` when it is not a head file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise BadInputError(f"EAGLE head {path}: not a readable safetensors file ({e})") from e
    if meta.get("format") != FORMAT:
        raise BadInputError(f"EAGLE head {path}: not a specd EAGLE head (format {FORMAT!r})")
    return meta


def load_head(path: Path, target: Target) -> EagleHead:
    """Load a head for ``target`` in its dtype and on its device.

    :raises HeadMismatchError: the head names another target's weights.
    """
    meta = read_meta(path)
    mine = weights_hash(target)
    if meta.get("target_hash") != mine:
        raise HeadMismatchError(
            f"EAGLE head {path} was trained for {meta.get('target')!r} (weights "
            f"{meta.get('target_hash')}), not for the target {target.name!r} (weights {mine}); "
            f"train one with: specd train eagle --model {target.name} --data PATH --out HEAD"
        )
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
    head = EagleHead(HeadConfig.from_json(meta["config"]), tensors["draft_vocab"], init=False)
    head.load_state_dict(tensors, assign=True)  # every weight is the file's (strict)
    return head.to(device=target.device, dtype=target.dtype).eval()


def shipped_head(target: Target) -> Path | None:
    """The head shipped for ``target``'s model alias, if any."""
    path = SHIPPED / f"{Path(target.name).name}.safetensors"
    return path if path.is_file() else None


def random_head(target: Target, seed: int = 0, vocab: int = 8192) -> EagleHead:
    """An untrained head for ``target`` over its first ``vocab`` token ids, the same for a
    given seed. Its input projection passes the feature through, so before any training it
    guesses that the target's last choice comes again (a cycle, on a tiny random target)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = EagleHead(
            HeadConfig.for_target(target.config), torch.arange(min(vocab, target.vocab_size))
        )
        with torch.no_grad():
            h = head.config.hidden
            head.fc.weight[:, :h] += torch.eye(h)
    return head.to(device=target.device, dtype=target.dtype).eval()
