"""``specd train eagle``: train an EAGLE head for a target on local code or text.

The target's features are cached beside the output (``HEAD.features/``) and a checkpoint
(``HEAD.ckpt``) is written at every validation, so running the same command again resumes:
shards already extracted are skipped and training continues from the checkpoint until the
time budget (``--minutes``) is spent in total.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from specd import BadInputError
from specd.options import EXIT_OK, add_model_args, thread_count

if TYPE_CHECKING:
    from specd import Target

#: The most draft positions unrolled in training (each one more pass of the head over every
#: sequence of a batch, its activations kept for the backward pass).
MAX_STEPS = 16
#: The most sequences in one update.
MAX_BATCH = 1024


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``train`` with its ``eagle`` subcommand (the ``eagle`` entry point of the
    ``specd.commands`` group; torch and the trainer load when it runs)."""
    train = subparsers.add_parser("train", help="train a drafter for a target model")
    kinds = train.add_subparsers(dest="train_kind", metavar="KIND", required=True)
    p = kinds.add_parser(
        "eagle",
        help="train an EAGLE head (one decoder layer over the target's features)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    p.add_argument("--data", nargs="+", required=True, metavar="PATH", help="files or folders")
    p.add_argument("--out", required=True, metavar="HEAD", help="the head file to write")
    p.add_argument(
        "--init",
        metavar="HEAD",
        default=None,
        help="start from this head (trained for the same target; its draft vocabulary is kept)",
    )
    p.add_argument("--glob", default="*.py", help="files to take from folders (default: *.py)")
    p.add_argument("--max-tokens", type=int, default=None, help="training tokens to use at most")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per training sequence")
    p.add_argument("--valid-every", type=int, default=50, help="hold out 1 file in N")
    p.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head may propose")
    p.add_argument("--steps", type=int, default=3, help="draft positions trained (unroll)")
    p.add_argument("--batch", type=int, default=4, help="sequences per update")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--minutes", type=float, default=10.0, help="training time budget")
    p.add_argument(
        "--updates",
        type=int,
        default=None,
        help="train for exactly this many updates instead (reproducible on any machine)",
    )
    p.add_argument(
        "--evaluate",
        action="store_true",
        help="measure the head at --out on --data (every file held out) instead of training",
    )
    p.add_argument("--valid-minutes", type=float, default=2.0, help="time between validations")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the final figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from specd import Engine

    from . import features
    from .head import EagleHead, HeadConfig
    from .headfile import load_head, save_head, weights_hash
    from .train import TrainConfig, Trainer

    for name in ("seq_len", "valid_every", "draft_vocab", "steps", "batch"):
        if getattr(args, name) < (2 if name in ("seq_len", "valid_every") else 1):
            raise BadInputError(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")
    for name, most in (("steps", MAX_STEPS), ("batch", MAX_BATCH)):
        if getattr(args, name) > most:
            raise BadInputError(f"--{name} is too large: {getattr(args, name):,} (at most {most})")
    for name in ("minutes", "valid_minutes", "lr"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise BadInputError(
                f"--{name.replace('_', '-')} must be a positive number, got {value}"
            )
    if args.max_tokens is not None and args.max_tokens < 1:
        raise BadInputError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.threads is not None:
        torch.set_num_threads(thread_count(args.threads))
    torch.manual_seed(args.seed)
    out = Path(args.out)
    command = _command(args)

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    if args.updates is not None and args.updates < 1:
        raise BadInputError(f"--updates must be >= 1, got {args.updates}")
    files = features.find_files(args.data, args.glob)
    target = Engine.load(
        args.model,
        dtype=args.dtype,
        device=args.device,
        trust_remote_code=args.trust_remote_code,
        weights=args.weights,
        drafter="none",
    ).target
    # what the model can hold, before any file is read for the corpus
    if args.seq_len > target.max_positions:
        raise BadInputError(
            f"--seq-len {args.seq_len:,}: {target.name!r} attends over {target.max_positions:,} "
            "tokens at most"
        )
    if args.evaluate:
        return evaluate(args, target, files, say)
    # read before the corpus: a head that cannot be used ends the run before any extraction
    start = None if args.init is None else load_head(Path(args.init), target)
    lineage = None if args.init is None else _lineage(Path(args.init))
    corpus = features.build_corpus(
        target,
        files,
        seq_len=args.seq_len,
        max_tokens=args.max_tokens,
        valid_every=args.valid_every,
    )
    say(
        f"{corpus.files} files: {len(corpus.train)} training and {len(corpus.valid)} "
        f"validation sequences of {args.seq_len} tokens"
    )
    cache = out.with_name(out.name + ".features") / weights_hash(target)
    train = features.load_shards(
        features.extract(target, corpus.train, cache / "train", progress=say)
    )
    valid = features.load_shards(
        features.extract(target, corpus.valid, cache / "valid", progress=say)
    )

    counts = torch.bincount(train["labels"].reshape(-1).long(), minlength=target.vocab_size)
    if start is not None:
        head = start
        vocab = head.draft_vocab.long()
        say(f"starting from {args.init} ({lineage.splitlines()[-1] if lineage else 'no command'})")
    else:
        vocab = counts.argsort(descending=True)[: min(args.draft_vocab, target.vocab_size)]
        head = EagleHead(HeadConfig.for_target(target.config), vocab.sort().values)
    covered = float(counts[vocab].sum() / counts.sum())
    say(f"draft vocabulary: {vocab.numel()} tokens cover {covered:.3f} of the target's choices")
    model = target.model
    trainer = Trainer(
        head,
        model.get_input_embeddings().weight,
        model.get_output_embeddings().weight,
        train,
        valid,
        TrainConfig(
            steps=args.steps,
            batch=args.batch,
            lr=args.lr,
            budget_s=args.minutes * 60,
            valid_every_s=args.valid_minutes * 60,
            seed=args.seed,
        ),
        target.device,
    )
    trainer.cfg.max_updates = args.updates
    ckpt = out.with_name(out.name + ".ckpt")
    if ckpt.is_file():
        trainer.load(ckpt)
        say(f"resumed from {ckpt} after {trainer.state.trained_s:.0f}s of training")
    report = trainer.run(say, checkpoint=lambda: trainer.save(ckpt))
    trainer.save(ckpt)
    report |= {"draft_vocab_coverage": round(covered, 4), "curve": trainer.state.curve}
    save_head(out, trainer.head, target, command, valid=report, init=lineage or None)
    say(f"wrote {out}")
    if args.json:
        print(json.dumps(report))
    return EXIT_OK


def evaluate(args: argparse.Namespace, target: Target, files: list[Path], say) -> int:
    """Top-1 agreement and per-position acceptance of the head at ``--out`` on ``--data``."""
    from . import features
    from .headfile import load_head, weights_hash
    from .train import TrainConfig, Trainer

    head = load_head(Path(args.out), target)
    seqs = features.evaluation_sequences(
        target, files, seq_len=args.seq_len, max_tokens=args.max_tokens
    )
    key = hashlib.sha256("\0".join(map(str, files)).encode()).hexdigest()[:12]
    folder = Path(args.out).with_name(Path(args.out).name + ".features") / weights_hash(target)
    data = features.load_shards(
        features.extract(target, seqs, folder / f"eval-{key}", progress=say)
    )
    model = target.model
    trainer = Trainer(
        head,
        model.get_input_embeddings().weight,
        model.get_output_embeddings().weight,
        data,
        data,
        TrainConfig(steps=args.steps, batch=args.batch),
        target.device,
    )
    report = trainer.validate(max_seqs=len(seqs))
    report |= {"sequences": len(seqs), "tokens": len(seqs) * args.seq_len}
    say(
        f"{len(seqs)} sequences: top1 {report['top1']:.3f}, acceptance by position "
        f"{report['position_acceptance']}, chain MAL {report['mean_acceptance_length']:.2f}"
    )
    if args.json:
        print(json.dumps(report))
    return EXIT_OK


def _lineage(path: Path) -> str:
    """The commands that made the head at ``path``, one per line, oldest first."""
    from .headfile import read_meta

    meta = read_meta(path)
    return "\n".join(filter(None, [meta.get("init"), meta.get("command")]))


#: The options that decide what a run trains, in the order the recorded command gives them.
_RECORDED = (
    "model", "dtype", "glob", "max_tokens", "seq_len", "valid_every", "draft_vocab", "steps",
    "batch", "lr", "minutes", "updates", "seed",
)  # fmt: skip


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (paths of the data as given)."""
    parts = ["specd", "train", "eagle", "--data", *args.data, "--out", args.out]
    if args.init is not None:
        parts += ["--init", args.init]
    for name in _RECORDED:
        value = getattr(args, name)
        if value is not None:
            parts += [f"--{name.replace('_', '-')}", str(value)]
    return " ".join(shlex.quote(p) for p in parts)
