"""CPU threads that take a fair share of a busy machine and all of a quiet one.

torch starts one OpenMP thread per core and every parallel region ends at a barrier. On a machine
where other jobs run, some of those threads are descheduled, and the whole region waits for the last
one: a 2-thread job beside one busy competitor on 2 cores runs at the speed of its slowest thread
plus the wake-up latency, many times slower than its fair share. Threads that spin while they wait
also burn the cycles the competitor needs.

`FairShare` samples the machine every 2 seconds (/proc/stat, minus this process's own CPU time)
and sets torch's thread count to the cores the *other* processes leave idle (at least one, at most
the cores this process may use). Two bertforge jobs that start on a quiet 2-core machine settle at one
thread each; the last one to finish goes back to two. `short_spin_wait()` lets OpenMP threads spin only
briefly at barriers before they sleep; it works only before the OpenMP runtime starts (before torch is
imported), so the command-line entry point calls it first.

Set `BERTFORGE_THREADS=N` (or pass a thread count) to fix the count and turn the sampling off.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

THREADS_ENV = "BERTFORGE_THREADS"


# GNU OpenMP's busy-wait iterations before a waiting thread sleeps: its default is 300,000 (about 3 ms
# by its own estimate of 100,000 spins a millisecond), OMP_WAIT_POLICY=PASSIVE is 0; 10,000 is about
# 0.1 ms. benchmarks/shared_cpu.py: sleeping at once cost serve requests on a quiet machine, and
# spinning for milliseconds holds cores a competing job needs.
SPIN_COUNT = "10000"


def short_spin_wait() -> None:
    """Let OpenMP threads spin only briefly at barriers before sleeping, unless the user chose a policy.

    A spinning thread holds its core after each parallel region; on a shared machine that core is
    one another job could use, while on a quiet one a thread that sleeps at once pays a wake-up on the
    next region. Sets GOMP_SPINCOUNT (GNU OpenMP, pip's torch: it takes precedence over the wait policy)
    and OMP_WAIT_POLICY=PASSIVE (for other OpenMP runtimes, which ignore GOMP_SPINCOUNT); child
    processes inherit both. Takes effect only before the OpenMP runtime loads. A policy the user chose
    (OMP_WAIT_POLICY or GOMP_SPINCOUNT) is left as it is."""
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def threads_should_yield() -> bool:
    """Whether waiting threads should give their cores up soon: OpenMP is asked for passive waiting
    (by `short_spin_wait` or the user). Thread pools outside OpenMP (ONNX Runtime's) follow it."""
    return os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _busy_and_total_ticks() -> tuple[int, int] | None:
    """Jiffies the whole machine spent busy and in all, from /proc/stat's first line (None off Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = [int(value) for value in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)
    return total - idle, total


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class FairShare:
    """Keeps torch's intra-op thread count at the idle cores other processes leave (see module doc).

    Call `tick()` often (every training step, every batch): it costs a clock read, and samples the
    machine only every `interval_s` seconds. `threads` is the count in force."""

    max_threads: int = field(default_factory=usable_cores)
    interval_s: float = 2.0  # reading /proc/stat costs microseconds; adapting within ~4 s matters more
    threads: int = 0
    _last_time: float = 0.0
    _last_ticks: tuple[int, int] | None = None
    _last_own: float = 0.0
    _pending: int = 0  # a new count seen once; applied when the next sample agrees (no flapping)

    def __post_init__(self) -> None:
        import torch

        self.max_threads = max(1, min(self.max_threads, usable_cores()))
        self.threads = self.max_threads
        torch.set_num_threads(self.threads)
        self._sample_start()

    def _sample_start(self) -> None:
        self._last_time = time.monotonic()
        self._last_ticks = _busy_and_total_ticks()
        self._last_own = _own_cpu_seconds()

    def others_busy_cores(self) -> float | None:
        """Cores the other processes kept busy since the last sample (None where it cannot be read)."""
        ticks = _busy_and_total_ticks()
        if ticks is None or self._last_ticks is None:
            return None
        busy = ticks[0] - self._last_ticks[0]
        total = ticks[1] - self._last_ticks[1]
        if total <= 0:
            return None
        cores = os.cpu_count() or 1
        elapsed_core_s = total / os.sysconf("SC_CLK_TCK")  # all cores' seconds in the interval
        wall_s = elapsed_core_s / cores
        own_cores = (_own_cpu_seconds() - self._last_own) / max(wall_s, 1e-9)
        return max(0.0, cores * busy / total - own_cores)

    def share(self, others_busy: float) -> int:
        """The thread count for `others_busy` cores in use elsewhere: the idle rest, 1 to max_threads.
        A core counts as taken when it is more than a third busy (a competitor's gaps between steps,
        or a spinning waiter, should not make this job oversubscribe it)."""
        taken = int(others_busy + 2 / 3)
        return max(1, min(self.max_threads, usable_cores() - taken))

    def tick(self) -> int:
        now = time.monotonic()
        if now - self._last_time < self.interval_s:
            return self.threads
        others = self.others_busy_cores()
        self._sample_start()
        if others is None:
            return self.threads
        wanted = self.share(others)
        if wanted == self.threads:
            self._pending = 0
        elif wanted == self._pending:
            import torch

            torch.set_num_threads(wanted)
            self.threads, self._pending = wanted, 0
        else:
            self._pending = wanted
        return self.threads


class FixedThreads:
    """A thread count the user chose: set once, never changed (the same interface as FairShare)."""

    def __init__(self, threads: int) -> None:
        import torch

        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        torch.set_num_threads(threads)

    def tick(self) -> int:
        return self.threads


def thread_policy(threads: int | None = None) -> FairShare | FixedThreads:
    """`threads` (or $BERTFORGE_THREADS) fixes the count; otherwise a FairShare of the machine."""
    if threads is None and os.environ.get(THREADS_ENV):
        value = os.environ[THREADS_ENV]
        try:
            threads = int(value)
        except ValueError:
            raise ValueError(f"${THREADS_ENV} must be a whole number of threads, got {value!r}") from None
    return FixedThreads(threads) if threads is not None else FairShare()


# The process's policy: off until `install()` (the command line installs one; a library user may too).
_installed = False
_requested: int | None = None
_policy: FairShare | FixedThreads | None = None


def install(threads: int | None = None) -> None:
    """Govern this process's torch threads from now on: `threads` fixed, or (None) a fair share.
    Nothing is measured or imported until the first `tick()`, so a command's --help stays instant."""
    global _installed, _requested, _policy
    _installed, _requested, _policy = True, threads, None


def tick() -> int | None:
    """Called by the training loop and the inference batches: applies the installed policy (None if none)."""
    global _policy
    if not _installed:
        return None
    if _policy is None:
        _policy = thread_policy(_requested)
    return _policy.tick()


__all__ = ["THREADS_ENV", "FairShare", "FixedThreads", "install", "short_spin_wait", "thread_policy",
           "threads_should_yield", "tick", "usable_cores"]
