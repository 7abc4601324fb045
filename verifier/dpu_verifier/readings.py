"""A counter's readings in real time, with when each was asked for and answered (checks.py judges the cap
on them where a counter is read in real time)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Readings:
    """A counter's running total as read in real time: when each reading was asked for, when its answer
    came, and the total it gave (readings one after another, so both times rise).

    A reading counts every byte that crossed up to some moment between its asking and its answer, so the
    bytes two readings i < j differ by crossed within (asked[i], answered[j]]: however late either was,
    that span is known, where a bin only knows when its sample was taken (on a loaded machine the lab's
    sampler ran up to 3 s late, the bytes of its whole delay went into one 0.1 s bin, and "2 s of bins"
    held 2.4 s of traffic and more: a false alarm, issue 16)."""

    asked: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)
    totals: list[int] = field(default_factory=list)

    def read(self, asked: float, answered: float, total: int) -> None:
        """Record a reading of `total` asked for at `asked` and answered at `answered`."""
        if not (answered >= asked and (not self.asked or (asked >= self.answered[-1] and total >= self.totals[-1]))):
            # The spans are only bounds while readings come one after another on a clock that does not go back.
            raise ValueError(f"a reading out of order: {(asked, answered, total)} after {self.last()}")
        self.asked.append(asked)
        self.answered.append(answered)
        self.totals.append(total)

    def last(self) -> tuple[float, float, int] | None:
        """The latest reading (asked, answered, total), if any."""
        return (self.asked[-1], self.answered[-1], self.totals[-1]) if self.totals else None

    def most_within(self, window_s: float, first: int = 0, upto: int | None = None) -> tuple[int, float]:
        """The most bytes between two readings whose span (first asked to last answered) is at most
        `window_s`, with that span; only pairs whose later reading is in [first, upto) (all by default).
        (0, 0.0) when no pair fits."""
        asked = np.asarray(self.asked, dtype=np.float64)
        answered = np.asarray(self.answered, dtype=np.float64)
        totals = np.asarray(self.totals, dtype=np.int64)
        later = np.arange(max(first, 1), len(totals) if upto is None else min(upto, len(totals)))
        # The earliest reading each can pair with has the least total (totals only rise): the best pair for it.
        earlier = np.searchsorted(asked, answered[later] - window_s, side="left")
        fits = earlier < later
        if not fits.any():
            return 0, 0.0
        later, earlier = later[fits], earlier[fits]
        got = totals[later] - totals[earlier]
        k = int(got.argmax())
        return int(got[k]), float(answered[later[k]] - asked[earlier[k]])

    def most_over(
        self, bytes_per_s: float, lag_s: float, since: int = 0, first: int = 0, upto: int | None = None
    ) -> tuple[int, float]:
        """The most bytes between two readings beyond `bytes_per_s` over their span (first asked to last
        answered) plus `lag_s`, whatever the span, with that span: pairs of readings from `since` on whose
        later one is in [first, upto). A cap's rate bounds every span, so on a long one the lag's allowance
        is small beside the traffic (a window a few times shorter than the lag is beyond router-count's
        reach; a long run over the rate is not). (0, 0.0) when no pair fits."""
        asked = np.asarray(self.asked[since:], dtype=np.float64)
        answered = np.asarray(self.answered[since:], dtype=np.float64)
        totals = np.asarray(self.totals[since:], dtype=np.int64)
        if totals.size < 2:
            return 0, 0.0
        # totals[j] - totals[i] - rate * (answered[j] - asked[i] + lag), best i < j: the prefix maximum of
        # rate * asked[i] - totals[i].
        head = np.maximum.accumulate(bytes_per_s * asked - totals)
        later = np.arange(max(first - since, 1), totals.size if upto is None else min(upto - since, totals.size))
        if later.size == 0:
            return 0, 0.0
        over = totals[later] - bytes_per_s * (answered[later] + lag_s) + head[later - 1]
        k = int(over.argmax())
        j = int(later[k])
        i = int(np.argmax(bytes_per_s * asked[:j] - totals[:j]))
        return max(0, int(over[k])), float(answered[j] - asked[i])

    def covering(self, start: float, end: float) -> int:
        """Bytes between the last reading answered by `start` and the first asked from `end` on (the first
        and the latest there are where none is): all that crossed in [start, end], and perhaps more."""
        if not self.totals:
            return 0
        i = max(0, int(np.searchsorted(np.asarray(self.answered), start, side="right")) - 1)
        j = min(len(self.totals) - 1, int(np.searchsorted(np.asarray(self.asked), end, side="left")))
        return max(0, self.totals[j] - self.totals[i])
