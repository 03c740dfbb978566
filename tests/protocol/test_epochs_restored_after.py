"""`EpochState.restored_after(e)` False means `taken_back` is None for every answer given in epoch e or later.

A batch's answers are told "stands" at once when no restore known entered a
later epoch than the oldest answer's (the node's `ReplyBatch`); this holds it
to `taken_back` over random restore histories (more than RESTORES_KEPT, so the
forgotten one counts too) and random answers.
"""

from __future__ import annotations

import random

from snapmesh.protocol.node.epochs import RESTORES_KEPT, EpochState


def test_no_restore_after_the_oldest_answers_epoch_means_every_answer_stands() -> None:
    rng = random.Random(31)
    for _ in range(500):
        state = EpochState("p1")
        epoch = 1
        for n in range(rng.randrange(0, RESTORES_KEPT + 4)):
            epoch += rng.randrange(1, 3)
            state.entered(epoch, f"s{n}", cut=rng.choice([None, rng.randrange(1, 100)]))
        answers = [(rng.randrange(1, 120), rng.randrange(1, epoch + 2)) for _ in range(rng.randrange(1, 6))]
        oldest = min(e for _, e in answers)
        if not state.restored_after(oldest):
            assert all(state.taken_back(lsn, e) is None for lsn, e in answers)
        else:  # some restore is after it: the oldest answer logged after every cut is taken back
            assert state.taken_back(10**6, oldest) is not None
