"""The benchmarks' timed region (bench/timing.py), on the CPU with torch.cuda's event, sleep and graph
calls recorded instead of run: every timed replay and the copy-bandwidth measurement must queue the
GPU hold after the caller's before_replay work and before the start event, so that the interval between
the events holds GPU work only (session 25: without the hold the host's launch was timed)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import timing  # noqa: E402


class _Event:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def record(self):
        self.log.append(f"record {self.name}")

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 1.0


@pytest.fixture
def recorded(monkeypatch):
    """torch.cuda's timing calls replaced by a log of their order; returns the log."""
    log = []
    events = iter(range(10**6))

    def make_event(enable_timing=False):
        assert enable_timing
        return _Event(log, "start" if next(events) % 2 == 0 else "end")

    monkeypatch.setattr(torch.cuda, "Event", make_event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(f"sleep {cycles}"))
    return log


class _Graph:
    def __init__(self, log):
        self.log = log

    def replay(self):
        self.log.append("replay")


def test_every_replay_is_queued_behind_the_hold(recorded):
    times = timing._replay_times(_Graph(recorded), 3, before_replay=lambda: recorded.append("before"))
    assert len(times) == 3
    cycles = int(timing.HOLD_US * 2000)
    assert recorded == ["before", f"sleep {cycles}", "record start", "replay", "record end"] * 3


def test_hold_length_and_the_old_method(recorded, monkeypatch):
    timing._replay_times(_Graph(recorded), 1, hold_us=50.0)
    assert recorded == ["sleep 100000", "record start", "replay", "record end"]
    recorded.clear()
    monkeypatch.setattr(timing, "HOLD_US", 0.0)  # REPLAYSSM_BENCH_HOLD_US=0: no hold at all
    timing._replay_times(_Graph(recorded), 1)
    assert recorded == ["record start", "replay", "record end"]


def test_the_copy_is_timed_behind_the_hold_too(recorded, monkeypatch):
    class _Buffer:
        def random_(self, lo, hi):
            return self

        def numel(self):
            return 2**30

        def copy_(self, src):
            recorded.append("copy")

    monkeypatch.setattr(torch, "empty", lambda *a, **k: _Buffer())
    monkeypatch.setattr(torch, "empty_like", lambda t: _Buffer())
    bandwidth = timing.measure_copy_bandwidth()
    assert bandwidth == pytest.approx(2 * 2**30 / 1e-3)
    cycles = int(timing.HOLD_US * 2000)
    assert recorded[:4] == [f"sleep {cycles}", "record start", "copy", "record end"]
    assert recorded.count(f"sleep {cycles}") == recorded.count("copy") == 25
