"""The greedy verifier: keep the draft while it matches the target's argmax.

Token-identical to plain greedy decoding, for chains and trees: at each node the target's
choice is the argmax of p (warp makes p one-hot at temperature 0); the walk follows the
child carrying that token, and stops with that token as the correction when no child has it.
"""

from __future__ import annotations

import torch

from specd import Draft, SamplingParams, Verdict, Verifier, argmax, hookimpl


class GreedyVerifier(Verifier):
    name = "greedy"
    exact_for = frozenset({"greedy"})

    def verify(
        self, draft: Draft, p: torch.Tensor, params: SamplingParams, generator: torch.Generator
    ) -> Verdict:
        choice = argmax(p).tolist()  # [N + 1]: the target's token at each row
        path: list[int] = []
        node = -1
        while True:
            want = choice[node + 1]
            nxt = next((c for c in draft.children(node) if draft.tokens[c] == want), None)
            if nxt is None:
                return Verdict(path=path, token=want)
            path.append(nxt)
            node = nxt


@hookimpl
def specd_register_verifiers(register):
    register(GreedyVerifier)
