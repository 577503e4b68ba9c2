"""The refusals of one event-loop iteration shared: once a request for a model was refused before its
body was read for its wait, the rest of that iteration's requests for it waited longer still, and are
refused with the same error, counted with the first (``Outcome.repeats``) rather than each judged and
recorded on its own: under overload refusals are most of the loop's work (docs/design/admission.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeinfer.errors import ServerBusy
from edgeinfer.outcome import Outcome

if TYPE_CHECKING:
    from edgeinfer.batching.batcher import Batcher

Key = tuple[str, str, str | None]  # (protocol, model, version asked for)


class _Turn:
    """The first request of an iteration refused for its wait, its error and the batcher that refused it."""

    __slots__ = ("batcher", "outcome", "refusal")

    def __init__(self, batcher: Batcher, refusal: ServerBusy, outcome: Outcome) -> None:
        self.batcher = batcher
        self.refusal = refusal
        self.outcome = outcome


class TurnRefusals:
    """By (protocol, model, version asked for): this iteration's first refusal before decoding, until
    it is recorded."""

    __slots__ = ("_turns",)

    def __init__(self) -> None:
        self._turns: dict[Key, _Turn] = {}

    def remember(self, batcher: Batcher, refusal: ServerBusy, outcome: Outcome) -> None:
        """``outcome``'s request was refused with ``refusal``, the one ``batcher`` gives this turn."""
        self._turns[(outcome.protocol, outcome.model, outcome.version)] = _Turn(batcher, refusal, outcome)

    def again(self, protocol: str, model: str, version: str | None) -> ServerBusy | None:
        """The refusal a request shares with the first of its iteration (counted with it), or None."""
        turns = self._turns
        if not turns:
            return None
        turn = turns.get((protocol, model, version))
        if turn is None or not turn.batcher.refuse_again(turn.refusal):
            return None
        turn.outcome.repeats += 1
        return turn.refusal

    def recorded(self, outcome: Outcome) -> None:
        """``outcome`` is being recorded: if it was a first refusal, its repeats are counted now and
        later requests go the usual way."""
        turns = self._turns
        if turns:
            key = (outcome.protocol, outcome.model, outcome.version)
            turn = turns.get(key)
            if turn is not None and turn.outcome is outcome:
                del turns[key]
