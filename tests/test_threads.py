"""The CPU thread policy: a fair share of the cores other processes leave, or a fixed count."""

from __future__ import annotations

import pytest
import torch

from bertforge import threads


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
    threads._installed, threads._policy = False, None


def test_share_leaves_the_cores_others_use(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    policy = threads.FairShare(max_threads=4)
    assert policy.share(0.0) == 4
    assert policy.share(0.2) == 4  # a competitor's occasional work does not take a core
    assert policy.share(1.0) == 3
    assert policy.share(2.5) == 1
    assert policy.share(7.0) == 1  # never fewer than one


def test_tick_changes_the_count_only_when_two_samples_agree(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    policy = threads.FairShare(max_threads=2, interval_s=0.0)
    assert policy.threads == 2 and torch.get_num_threads() == 2
    readings = iter([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    monkeypatch.setattr(policy, "others_busy_cores", lambda: next(readings))
    seen = [policy.tick() for _ in range(6)]
    # one busy reading between quiet ones changes nothing; two in a row do, and two quiet ones undo it
    assert seen == [2, 2, 2, 1, 1, 2]
    assert torch.get_num_threads() == 2


def test_tick_samples_only_every_interval(monkeypatch):
    policy = threads.FairShare(max_threads=1, interval_s=3600.0)
    calls = []
    monkeypatch.setattr(policy, "others_busy_cores", lambda: calls.append(1) or 0.0)
    for _ in range(100):
        policy.tick()
    assert calls == []


def test_reading_the_machine_gives_a_plausible_figure():
    policy = threads.FairShare(interval_s=0.0)
    sum(i * i for i in range(200_000))  # some of this process's own work, which must not count
    others = policy.others_busy_cores()
    if others is None:
        pytest.skip("no /proc/stat here")
    assert 0.0 <= others <= (threads.os.cpu_count() or 1)


def test_a_fixed_count_from_the_environment(monkeypatch):
    monkeypatch.setenv(threads.THREADS_ENV, "1")
    threads.install()
    assert threads.tick() == 1 and torch.get_num_threads() == 1
    monkeypatch.setenv(threads.THREADS_ENV, "many")
    threads.install()
    with pytest.raises(ValueError, match="BERTFORGE_THREADS must be a whole number"):
        threads.tick()


def test_nothing_happens_until_installed():
    assert threads.tick() is None


def test_the_wait_policy_spins_briefly_and_keeps_a_users_choice(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    threads.short_spin_wait()
    assert "GOMP_SPINCOUNT" not in threads.os.environ and not threads.threads_should_yield()
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert threads.threads_should_yield()  # the user's passive waiting reaches ONNX Runtime's threads too
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "infinite")
    threads.short_spin_wait()
    assert threads.os.environ["GOMP_SPINCOUNT"] == "infinite" and not threads.threads_should_yield()
    monkeypatch.delenv("GOMP_SPINCOUNT")
    threads.short_spin_wait()  # GNU OpenMP spins briefly (its spin count wins), other runtimes wait passively
    assert threads.os.environ["GOMP_SPINCOUNT"] == threads.SPIN_COUNT
    assert threads.os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and threads.threads_should_yield()


@pytest.mark.slow
@pytest.mark.skipif(threads.usable_cores() < 2, reason="libgomp throttles spinning when threads outnumber cores")
def test_gnu_openmp_takes_the_spin_count_over_the_passive_policy():
    """The policy sets both variables and relies on libgomp preferring GOMP_SPINCOUNT: with an endless
    spin count and PASSIVE, a worker thread spins through an idle second."""
    import subprocess
    import sys

    script = ("import time, torch; torch.set_num_threads(2); x = torch.randn(256, 256)\n"
              "for _ in range(5): x @ x\n"
              "t = time.process_time(); time.sleep(1.0); print(time.process_time() - t)")
    spent = {}
    for count in ("infinite", "0"):
        env = {**threads.os.environ, "GOMP_SPINCOUNT": count, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2"}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        spent[count] = float(done.stdout.strip().splitlines()[-1])
    assert spent["infinite"] > 0.3 and spent["0"] < 0.1, spent
