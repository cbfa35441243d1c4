"""The largest one-minute rise of the KV demand over a window, and the headroom against it.

Pure and clock-free: the caller (the forecast layer) passes each sample's time. See docs/forecast.md,
"``kvcache_burst_*``", for why: on bursty traffic the time until full is +Inf between bursts and 0
during them (docs/forecast-validation.md, "What the time until full reads on real traffic"), so it
cannot say how close a pool is to its cliff; the size of the bursts it has just absorbed can.

The rise ending at sample ``t`` is ``demand(t) − min demand over (t − span, t]``, the range a Prometheus
``[1m]`` selector reads (left-open since Prometheus 3.0: its migration guide, "PromQL"), so that
``max_over_time((kvcache_demand_tokens - min_over_time(kvcache_demand_tokens[1m]))[1h:])`` is what the gauge
reads, at the sidecar's own samples. The previous sample counts however long ago, as long as the gap to it
is at most twice the one before (:data:`GAP_FACTOR`): with samples a minute or more apart (``scrape.interval``
of 1m, or a simulated clock run fast) the minute would hold the sample alone and every rise would read 0,
"no burst", on a cache that fills, so the span is then one scrape interval, the shortest the samples can
measure; but a longer gap is missed scrapes or an outage, and a rise across it is not a burst of one minute
(the minute starts again at the sample after it). Both running extrema are monotonic queues (the sliding-window
minimum/maximum of Lemire, "Streaming maximum-minimum filter using no more than three comparisons per
element", 2006): each sample is pushed and popped at most once per queue, so a scrape costs O(1)
amortised, and a queue holds at most the samples of its window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

#: The longest span a burst is measured over, seconds: one minute, about how long a burst takes to fill
#: a cache on the Mooncake traces (docs/forecast-validation.md, "Why the lead target cannot be met").
BURST_SPAN_S = 60.0
#: A gap to the previous sample longer than the span counts as one scrape interval only if it is at most this
#: many times the gap before it; longer, it is missed scrapes or an outage and no rise is measured across it.
GAP_FACTOR = 2.0


@dataclass
class BurstWindow:
    """One engine's demand samples, reduced to what the largest rise over a window needs.

    ``add`` each sample in time order; :meth:`largest_rise` is the largest rise of any span shorter than
    :data:`BURST_SPAN_S` that ends within the window, or ``None`` until the samples span ``span_s``.
    The window is an argument, not a field, so a reload that changes ``forecast.burst_window`` keeps
    the samples (the queues are pruned to the new window at the next sample).
    """

    span_s: float = BURST_SPAN_S
    #: (t, demand) of the last ``span_s``, demand increasing from the left: the front is the minimum
    _lows: deque[tuple[float, float]] = field(default_factory=deque)
    #: (t, rise ending at t) within the window, rise decreasing from the left: the front is the maximum
    _rises: deque[tuple[float, float]] = field(default_factory=deque)
    #: the first and latest sample times since the window (re)started, and the gap between the last two
    _first: float | None = None
    _last: float | None = None
    _gap: float | None = None

    def add(self, t: float, demand: float, *, window_s: float) -> None:
        """Record the demand sampled at ``t`` (after every earlier sample; NaN and ±Inf are skipped).

        A gap longer than ``window_s`` since the previous sample leaves nothing of the window: it starts
        again from this sample.
        """
        if not (math.isfinite(t) and math.isfinite(demand)):
            return
        if self._last is not None and t <= self._last:
            return  # not after the latest sample: the layer records one sample per scrape time
        if self._last is not None and t - self._last > window_s:
            self.clear()
        previous = t  # the previous sample, when it counts (below): else the minute holds this one alone
        if self._last is not None:
            gap = t - self._last
            if gap <= self.span_s or (self._gap is not None and gap <= GAP_FACTOR * self._gap):
                previous = self._last
            self._gap = gap
        if self._first is None:
            self._first = t
        self._last = t
        lows = self._lows
        while lows and lows[-1][1] >= demand:
            lows.pop()
        lows.append((t, demand))
        # left-open (t - span, t], and the previous sample when it counts; the newest sample always stays
        while lows[0][0] <= t - self.span_s and lows[0][0] < previous:
            lows.popleft()
        rise = demand - lows[0][1]
        rises = self._rises
        while rises and rises[-1][1] <= rise:
            rises.pop()
        rises.append((t, rise))
        self._prune(t, window_s)

    def largest_rise(self, now: float, *, window_s: float) -> float | None:
        """The largest rise ending within ``[now − window_s, now]``; ``None`` until two samples span ``span_s``."""
        if self._first is None or self._last is None or self._last - self._first < self.span_s:
            return None
        self._prune(now, window_s)
        return self._rises[0][1] if self._rises else 0.0

    def clear(self) -> None:
        """Start again (the engine restarted): nothing is published until the new samples span ``span_s``."""
        self._lows.clear()
        self._rises.clear()
        self._first = self._last = self._gap = None

    def held(self) -> int:
        """Samples held by both queues (the tests check the memory stays bounded)."""
        return len(self._lows) + len(self._rises)

    def _prune(self, now: float, window_s: float) -> None:
        while self._rises and self._rises[0][0] < now - window_s:
            self._rises.popleft()


def burst_headroom_ratio(*, free_tokens: float, burst_tokens: float) -> float:
    """Free tokens now ÷ the largest burst: below 1, a burst that large would not fit now.

    ``free_tokens`` is the usable capacity minus the demand now (floored at 0 by the caller or here);
    +Inf when the burst is 0 (the demand never rose in the window), NaN never.
    """
    free = max(0.0, free_tokens)
    if burst_tokens <= 0:
        return math.inf
    return free / burst_tokens
