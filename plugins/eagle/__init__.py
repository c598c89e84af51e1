"""EAGLE drafting: a small head over the target's own features, trained for each target.

- :mod:`.head`: the head (one decoder layer; the target's LM head reads its predictions).
- :mod:`.drafter`: the ``eagle`` drafter (a chain, or a tree by the head's confidence).
- :mod:`.hybrid`: the ``hybrid`` drafter (n-gram continuations where the context repeats,
  the head elsewhere, in one verified draft).
- :mod:`.headfile`: the head file format; :mod:`.features`, :mod:`.train` and
  :mod:`.command`: ``specd train eagle``.
"""
