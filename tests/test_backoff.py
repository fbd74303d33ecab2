"""The one retry/backoff helper (platform/common/backoff.py): pauses, cap, jitter, attempts, deadline, what is
retried."""
from __future__ import annotations

import doctest

import pytest

from sparkmq.platform.common import backoff as backoff_module
from sparkmq.platform.common.backoff import Backoff, RetryDelays, call_with_retries


def test_docstring_examples() -> None:
    result = doctest.testmod(backoff_module)
    assert result.attempted > 0 and result.failed == 0


# -- Backoff ------------------------------------------------------------------------------------------------------

def test_exponential_pauses_double_up_to_the_cap() -> None:
    policy = Backoff(initial_s=0.05, max_s=1.0)
    assert [policy.delay_s(n) for n in range(7)] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_linear_pauses_grow_by_the_increment() -> None:
    policy = Backoff(initial_s=0.02, max_s=0.05, factor=1.0, increment_s=0.02)
    assert [policy.delay_s(n) for n in range(4)] == pytest.approx([0.02, 0.04, 0.05, 0.05])


def test_a_constant_pause() -> None:
    policy = Backoff(initial_s=0.3, max_s=0.3, factor=1.0)
    assert {policy.delay_s(n) for n in (0, 1, 50)} == {0.3}


def test_far_past_the_cap_is_the_cap_not_an_overflow() -> None:
    assert Backoff(initial_s=0.2, max_s=5.0).delay_s(100_000) == 5.0
    assert Backoff(initial_s=0.0, max_s=5.0).delay_s(100_000) == 0.0


def test_jitter_cuts_each_pause_by_at_most_its_fraction() -> None:
    policy = Backoff(initial_s=0.05, max_s=1.0, jitter=0.5)
    assert policy.delay_s(0, rand=lambda: 0.0) == pytest.approx(0.05)
    assert policy.delay_s(0, rand=lambda: 0.999999) == pytest.approx(0.025, rel=1e-4)
    assert policy.delay_s(30, rand=lambda: 0.5) == pytest.approx(0.75)
    samples = []
    for n in range(8):
        base = min(1.0, 0.05 * 2 ** n)
        for _ in range(200):
            pause = policy.delay_s(n)
            assert base / 2 <= pause <= base
            samples.append(pause)
    assert len(set(samples)) > 1000  # really random, not a constant cut


def test_without_jitter_no_random_number_is_drawn() -> None:
    def rand() -> float:
        raise AssertionError("drew a random number")
    assert Backoff(initial_s=1.0, max_s=2.0).delay_s(3, rand) == 2.0


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"initial_s": -0.1, "max_s": 1.0}, r"initial_s must be .* got -0\.1"),
    ({"initial_s": 0.1, "max_s": float("inf")}, r"max_s must be .* got inf"),
    ({"initial_s": 2.0, "max_s": 1.0}, r"max_s must be >= initial_s \(2\.0\), got 1\.0"),
    ({"initial_s": 0.1, "max_s": 1.0, "factor": 0.5}, r"factor must be .* got 0\.5"),
    ({"initial_s": 0.1, "max_s": 1.0, "jitter": 1.5}, r"jitter must be .* got 1\.5"),
    ({"initial_s": 0.1, "max_s": 1.0, "increment_s": True}, r"increment_s must be .* got True"),
])
def test_a_bad_policy_is_refused_with_its_field_and_value(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Backoff(**kwargs)


def test_a_negative_retry_number_is_refused() -> None:
    with pytest.raises(ValueError, match="retry must be >= 0, got -1"):
        Backoff(initial_s=0.1, max_s=1.0).delay_s(-1)


# -- RetryDelays --------------------------------------------------------------------------------------------------

def test_delays_grow_per_failure_and_start_over_after_a_success() -> None:
    delays = RetryDelays(Backoff(initial_s=0.2, max_s=5.0))
    assert [delays.next_s() for _ in range(7)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert delays.failures == 7
    delays.reset()
    assert delays.failures == 0
    assert delays.next_s() == pytest.approx(0.2)


def test_hold_at_max_keeps_the_longest_pause_until_a_success() -> None:
    delays = RetryDelays(Backoff(initial_s=0.2, max_s=5.0))
    delays.next_s()
    delays.hold_at_max()
    assert [delays.next_s() for _ in range(3)] == [5.0, 5.0, 5.0]
    delays.reset()
    assert delays.next_s() == pytest.approx(0.2)


def test_hold_at_max_holds_a_constant_policy_at_its_cap_too() -> None:
    delays = RetryDelays(Backoff(initial_s=0.1, max_s=3.0, factor=1.0), rand=lambda: 0.5)
    delays.hold_at_max()
    assert delays.next_s() == 3.0


def test_delays_take_their_jitter_from_the_given_source() -> None:
    delays = RetryDelays(Backoff(initial_s=1.0, max_s=8.0, jitter=0.5), rand=lambda: 1.0)
    assert [delays.next_s() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    delays.hold_at_max()
    assert delays.next_s() == 4.0


# -- call_with_retries ----------------------------------------------------------------------------------------------

class Flaky:
    """Raises the given exceptions in turn, then returns "ok"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


POLICY = Backoff(initial_s=0.02, max_s=1.0, factor=1.0, increment_s=0.02)


def test_retries_the_listed_exceptions_with_the_policys_pauses() -> None:
    fn, slept, told = Flaky(TimeoutError("a"), TimeoutError("b")), [], []
    result = call_with_retries(fn, POLICY, attempts=4, retry_on=TimeoutError, sleep=slept.append,
                               on_retry=lambda exc, attempt, pause: told.append((str(exc), attempt, pause)))
    assert result == "ok" and fn.calls == 3
    assert slept == pytest.approx([0.02, 0.04])
    assert told == [("a", 1, pytest.approx(0.02)), ("b", 2, pytest.approx(0.04))]


def test_gives_up_after_the_attempts_with_the_last_error_and_no_pause_after_it() -> None:
    fn, slept = Flaky(*(TimeoutError(str(i)) for i in range(9))), []
    with pytest.raises(TimeoutError, match="^3$"):
        call_with_retries(fn, POLICY, attempts=4, retry_on=TimeoutError, sleep=slept.append)
    assert fn.calls == 4
    assert slept == pytest.approx([0.02, 0.04, 0.06])


def test_an_exception_not_listed_is_raised_at_once() -> None:
    fn, slept = Flaky(TimeoutError("retried"), KeyError("a bug")), []
    with pytest.raises(KeyError, match="a bug"):
        call_with_retries(fn, POLICY, attempts=5, retry_on=(TimeoutError, ConnectionError), sleep=slept.append)
    assert fn.calls == 2 and len(slept) == 1


def test_a_subclass_of_a_listed_exception_is_retried() -> None:
    fn = Flaky(ConnectionResetError("reset"))
    assert call_with_retries(fn, POLICY, attempts=2, retry_on=OSError, sleep=lambda s: None) == "ok"
    assert fn.calls == 2


def test_retry_if_can_refuse_a_listed_exception() -> None:
    class Refused(ValueError):
        pass
    fn, slept = Flaky(ValueError("transient"), Refused("for good")), []
    with pytest.raises(Refused, match="for good"):
        call_with_retries(fn, POLICY, attempts=5, retry_on=ValueError,
                          retry_if=lambda exc: not isinstance(exc, Refused), sleep=slept.append)
    assert fn.calls == 2 and len(slept) == 1


def test_no_retry_starts_at_or_after_the_deadline() -> None:
    now = [100.0]

    def sleep(pause: float) -> None:
        now[0] += pause
    fn = Flaky(*(TimeoutError(str(i)) for i in range(9)))
    # pauses 0.02, 0.04, 0.06 end at 100.02, 100.06, 100.12: the third would pass the deadline 100.1
    with pytest.raises(TimeoutError, match="^2$"):
        call_with_retries(fn, POLICY, attempts=9, retry_on=TimeoutError, deadline=100.1, sleep=sleep,
                          clock=lambda: now[0])
    assert fn.calls == 3 and now[0] == pytest.approx(100.06)


def test_a_deadline_already_passed_makes_one_attempt() -> None:
    fn, slept = Flaky(TimeoutError("late")), []
    with pytest.raises(TimeoutError, match="late"):
        call_with_retries(fn, POLICY, attempts=3, retry_on=TimeoutError, deadline=5.0, clock=lambda: 10.0,
                          sleep=slept.append)
    assert fn.calls == 1 and slept == []


def test_jittered_pauses_come_from_the_given_source() -> None:
    fn, slept = Flaky(OSError(), OSError()), []
    call_with_retries(fn, Backoff(initial_s=0.1, max_s=1.0, jitter=0.5), attempts=3, retry_on=OSError,
                      sleep=slept.append, rand=lambda: 1.0)
    assert slept == pytest.approx([0.05, 0.1])


@pytest.mark.parametrize("attempts", [0, -1, True, 1.5])
def test_attempts_must_be_a_positive_integer(attempts: object) -> None:
    with pytest.raises(ValueError, match="attempts must be an integer >= 1"):
        call_with_retries(Flaky(), POLICY, attempts=attempts)  # type: ignore[arg-type]
