"""Training an EAGLE head on cached target features.

Loss at unroll step s (1-based, weight ``0.8 ** (s - 1)``): SmoothL1 between the predicted
and the true next feature, plus ``ce_weight`` times the cross-entropy of the head's draft
vocabulary logits against the target's own greedy next token (so the head learns what the
target would write, not what the file says). Step 1 is teacher forcing; steps 2.. feed the
head its own predicted features, the way a draft chain does (the training-time test).

Validation runs the same unroll on held-out files and reports, per draft position k, the
share of chains whose first k tokens all equal the target's greedy tokens; the mean
acceptance length of a k-token chain follows as ``1 + sum of those shares``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .head import EagleHead


@dataclass
class TrainConfig:
    steps: int = 3  # unroll depth (draft positions trained)
    batch: int = 4  # sequences per optimizer step
    lr: float = 1e-3
    ce_weight: float = 0.1
    budget_s: float = 600.0  # training time, excluding validation
    max_updates: int | None = None  # when set, the run's length in updates instead of time
    valid_every_s: float = 120.0
    seed: int = 0


@dataclass
class TrainState:
    """What a checkpoint holds besides the weights and the optimizer."""

    updates: int = 0
    positions: int = 0
    trained_s: float = 0.0
    curve: list[dict] = field(default_factory=list)


class Trainer:
    """:param head: the head to train (its ``draft_vocab`` fixed).
    :param embed: ``[V, H]`` target input embeddings. :param lm_head: ``[V, H]`` target LM head.
    :param train: shards joined (``feat``, ``tokens``, ``labels``). :param valid: the same
        for held-out files."""

    def __init__(
        self,
        head: EagleHead,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        train: dict[str, torch.Tensor],
        valid: dict[str, torch.Tensor],
        config: TrainConfig,
        device: torch.device,
    ) -> None:
        self.head = head.to(device).float()
        self.cfg = config
        self.device = device
        self.embed = embed.detach().to(device, torch.float32)
        vocab = head.draft_vocab.to(device)
        self.lm_rows = lm_head.detach().to(device, torch.float32)[vocab]  # [Vd, H]
        # full id -> index in the draft vocabulary (-1: outside it)
        self.to_draft = torch.full((embed.shape[0],), -1, dtype=torch.long, device=device)
        self.to_draft[vocab] = torch.arange(vocab.numel(), device=device)
        self.train_data = train
        self.valid_data = valid
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=config.lr, weight_decay=0.0)
        self.state = TrainState()
        self.gen = torch.Generator().manual_seed(config.seed)

    # -- one batch ----------------------------------------------------------------------

    def _batch(self, data: dict[str, torch.Tensor], idx: torch.Tensor):
        feat = data["feat"][idx].to(self.device, torch.float32)  # [B, T, H]
        tokens = data["tokens"][idx].to(self.device, torch.long)  # [B, T]
        labels = data["labels"][idx].to(self.device, torch.long)  # [B, T]
        # row j: input (f_j, e(x_{j+1})) -> target f_{j+1}, label: the target's token after j+1
        return (
            feat[:, :-1],
            self.embed[tokens[:, 1:]],
            feat[:, 1:],
            labels[:, 1:],
        )

    def _losses(self, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x_feat, emb, tgt, labels = self._batch(self.train_data, idx)
        outs = self.head.unrolled(x_feat, emb, self.cfg.steps)
        target_idx = self.to_draft[labels]
        total = torch.zeros((), device=self.device)
        for s, out in enumerate(outs):
            o, t, y = out[:, s:], tgt[:, s:], target_idx[:, s:]
            loss = F.smooth_l1_loss(o, t)
            logits = self.head.logits(o, self.lm_rows)
            loss = loss + self.cfg.ce_weight * F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-1
            )
            total = total + 0.8**s * loss
        return total, outs

    def _progress(self) -> float:
        """How much of the run is done, 0..1: by updates when counted, else by time."""
        if self.cfg.max_updates is not None:
            return min(self.state.updates / max(self.cfg.max_updates, 1), 1.0)
        return min(self.state.trained_s / max(self.cfg.budget_s, 1e-9), 1.0)

    def _lr(self) -> float:
        frac = self._progress()
        warm = min(1.0, (self.state.updates + 1) / 50)
        return self.cfg.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    # -- the loop -----------------------------------------------------------------------

    def run(
        self, progress: Callable[[str], None], checkpoint: Callable[[], None] | None = None
    ) -> dict:
        """Train until the run is done (:meth:`_progress`); validate every ``valid_every_s``.
        :returns: the last validation figures."""
        n = self.train_data["tokens"].shape[0]
        t_len = self.train_data["tokens"].shape[1] - 1
        last_valid = self.state.trained_s
        report = self.validate()
        progress(_format(self.state, report))
        while self._progress() < 1.0:
            t0 = time.monotonic()
            self.head.train()
            for g in self.opt.param_groups:
                g["lr"] = self._lr()
            idx = torch.randint(0, n, (self.cfg.batch,), generator=self.gen)
            loss, _ = self._losses(idx)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
            self.opt.step()
            self.state.updates += 1
            self.state.positions += self.cfg.batch * t_len
            self.state.trained_s += time.monotonic() - t0
            if self.state.trained_s - last_valid >= self.cfg.valid_every_s:
                last_valid = self.state.trained_s
                report = self.validate()
                report["loss"] = round(float(loss.detach()), 4)
                progress(_format(self.state, report))
                if checkpoint is not None:
                    checkpoint()
        report = self.validate()
        progress(_format(self.state, report))
        return report

    @torch.no_grad()
    def validate(self, max_seqs: int = 64) -> dict:
        """Top-1 agreement and per-position chain acceptance on the validation split."""
        self.head.eval()
        n = min(self.valid_data["tokens"].shape[0], max_seqs)
        hits: list[list[torch.Tensor]] = [[] for _ in range(self.cfg.steps)]
        for start in range(0, n, self.cfg.batch):
            idx = torch.arange(start, min(start + self.cfg.batch, n))
            x_feat, emb, _, labels = self._batch(self.valid_data, idx)
            outs = self.head.unrolled(x_feat, emb, self.cfg.steps)
            for s, out in enumerate(outs):
                guess = self.head.draft_vocab.to(self.device)[
                    self.head.logits(out, self.lm_rows).argmax(-1)
                ]
                hits[s].append(guess == labels)  # [B, T-1]
        correct = [torch.cat(h) for h in hits]
        t = correct[0].shape[1]
        # a chain drafted after true row r: its token k comes from step k's row r + k - 1
        chain = torch.ones_like(correct[0][:, : t - self.cfg.steps + 1])
        accept = []
        for s in range(self.cfg.steps):
            chain = chain & correct[s][:, s : s + chain.shape[1]]
            accept.append(round(float(chain.float().mean()), 4))
        self.state.curve.append(
            {"trained_s": round(self.state.trained_s, 1), "positions": self.state.positions}
            | {"top1": accept[0], "position_acceptance": accept}
        )
        return {
            "top1": accept[0],
            "position_acceptance": accept,
            "mean_acceptance_length": round(1 + sum(accept), 3),
        }

    # -- checkpoints --------------------------------------------------------------------

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        torch.save(
            {
                "head": self.head.state_dict(),
                "opt": self.opt.state_dict(),
                "state": self.state.__dict__,
                "gen": self.gen.get_state(),
            },
            tmp,
        )
        tmp.replace(path)

    def load(self, path: Path) -> None:
        ck = torch.load(path, map_location=self.device, weights_only=False)
        self.head.load_state_dict(ck["head"])
        self.opt.load_state_dict(ck["opt"])
        self.state = TrainState(**ck["state"])
        self.gen.set_state(ck["gen"])


def _format(state: TrainState, report: dict) -> str:
    acc = " ".join(f"{a:.2f}" for a in report["position_acceptance"])
    loss = f" loss {report['loss']:.3f}" if "loss" in report else ""
    return (
        f"train {state.trained_s:6.0f}s {state.positions:>9} positions{loss} | valid top1 "
        f"{report['top1']:.3f} acceptance by position {acc} "
        f"MAL {report['mean_acceptance_length']:.2f}"
    )
