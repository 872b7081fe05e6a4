"""The benchmarks' timed region (replayssm_cuda.bench.timing), on the CPU with torch.cuda's event, sleep and
graph calls recorded instead of run: every timed replay and the copy-bandwidth measurement must queue the
GPU hold after the caller's before_replay work and before the start event, so that the interval between
the events holds GPU work only (without the hold the host's launch was timed)."""

import pytest
import torch

from replayssm_cuda.bench import timing


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
    times = timing.replay_times(_Graph(recorded), 3, before_replay=lambda: recorded.append("before"))
    assert len(times) == 3
    cycles = int(timing.HOLD_US * 2000)
    assert recorded == ["before", f"sleep {cycles}", "record start", "replay", "record end"] * 3


def test_hold_length_and_no_hold(recorded, monkeypatch):
    timing.replay_times(_Graph(recorded), 1, hold_us=50.0)
    assert recorded == ["sleep 100000", "record start", "replay", "record end"]
    recorded.clear()
    monkeypatch.setattr(timing, "HOLD_US", 0.0)  # --hold-us 0: no hold at all
    timing.replay_times(_Graph(recorded), 1)
    assert recorded == ["record start", "replay", "record end"]


def test_configure_sets_the_method_and_checks_it(monkeypatch):
    monkeypatch.setattr(timing, "HOLD_US", timing.HOLD_US)
    monkeypatch.setattr(timing, "REPLAYS", timing.REPLAYS)
    monkeypatch.setattr(timing, "KERNEL_TIMES", timing.KERNEL_TIMES)
    timing.configure(hold_us=120, replays=7, kernel_times=True)
    assert (timing.HOLD_US, timing.REPLAYS, timing.KERNEL_TIMES) == (120.0, 7, True)
    with pytest.raises(ValueError, match="hold_us"):
        timing.configure(hold_us=-1)
    with pytest.raises(ValueError, match="replays"):
        timing.configure(replays=0)


def test_time_graph_drops_the_warm_up_replays_and_takes_the_median(monkeypatch):
    monkeypatch.setattr(timing, "capture", lambda record: "graph")
    seen = {}

    def fake_replays(graph, count, before_replay=None, hold_us=None):
        seen["count"] = count
        return [9.0] * timing.WARMUP_REPLAYS + [1.0, 3.0, 2.0, 5.0, 4.0]

    monkeypatch.setattr(timing, "replay_times", fake_replays)
    assert timing.time_graph(lambda: None, replays=5) == 3.0
    assert seen["count"] == 5 + timing.WARMUP_REPLAYS


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


def test_cold_groups_rotate_over_four_l2s():
    l2 = 60 * 2**20
    assert timing.cold_groups(512, 4 * 2**20, l2_bytes=l2) == 2            # 2 GiB a group: the floor of 2
    assert timing.cold_groups(1, 96 * 80 * 128 * 4, l2_bytes=l2) == 64     # nano4b fp32 at batch 1: 3.9 MB a row
    assert timing.cold_groups(1, 2**20, l2_bytes=l2) == 240


def test_kernel_names_lose_namespaces_and_templates():
    assert timing.kernel_name("void replayssm::(anonymous namespace)::step_kernel<64, 128>(Params)") == "step_kernel"
    assert timing.kernel_name("at::native::vectorized_elementwise_kernel<4, float>") == "vectorized_elementwise_kernel"
