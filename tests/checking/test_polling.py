"""support.polling.wait_for, the one polling helper of the tests."""

import pytest

from support.polling import WaitTimedOut, wait_for


def test_it_returns_the_first_value_that_holds() -> None:
    values = iter([0, 0, 3, 4])
    assert wait_for(lambda: next(values), timeout=5, interval=0) == 3
    values = iter([1, 2, 7, 9])
    assert wait_for(lambda: next(values), until=lambda n: n > 5, timeout=5, interval=0) == 7


def test_a_retried_exception_is_not_yet_and_another_propagates() -> None:
    answers = iter([ConnectionError("down"), ConnectionError("down"), "up"])

    def probe() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_for(probe, timeout=5, interval=0, retry_on=(ConnectionError,)) == "up"
    with pytest.raises(ValueError):
        wait_for(lambda: int("x"), timeout=5, interval=0, retry_on=(ConnectionError,))


def test_a_timeout_names_what_the_timeout_the_last_value_and_the_last_error() -> None:
    with pytest.raises(AssertionError, match=r"after 0.05s waiting for the answer: last value 41"):
        wait_for(lambda: 41, until=lambda n: n == 42, timeout=0.05, interval=0.01, what="the answer")

    def refused() -> None:
        raise ConnectionRefusedError("nobody home")

    with pytest.raises(TimeoutError, match=r"no value; last error ConnectionRefusedError\('nobody home'\)"):
        wait_for(refused, timeout=0.05, interval=0.01, retry_on=OSError)
    assert issubclass(WaitTimedOut, AssertionError) and issubclass(WaitTimedOut, TimeoutError)
