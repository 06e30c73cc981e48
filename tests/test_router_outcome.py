"""The outcome observer: whose failure an answer was, what the breakers count, who is ejected, what comes next."""

import pytest
from agent_reach.atp import BusinessError, ErrorCode

from mesh.policy import BreakerConfig
from router.breaker import CircuitBreaker
from router.forward import AgentAnswer
from router.instances import InstanceBook
from router.outcome import Observer, Step, hurried
from router.timeouts import ResolvedTimeouts
from router.verdicts import Reading, read, verdict

NOW = 100.0
OWN = ResolvedTimeouts(connect_s=1.0, first_byte_s=2.0, total_s=5.0)
HINTED = ResolvedTimeouts(connect_s=0.5, first_byte_s=0.5, total_s=0.5)

ANSWERS = {
    "success": (AgentAnswer(result=1), Reading.SUCCESS, Step.DONE, True, False),
    "refused connection": (AgentAnswer(error_code=ErrorCode.AGENT_ERROR, sent=False, message="refused"),
                           Reading.UNREACHED, Step.NEXT, False, True),
    "connect timeout": (AgentAnswer(error_code=ErrorCode.CONNECT_TIMEOUT, sent=False), Reading.UNREACHED,
                        Step.NEXT, False, True),
    "connect timeout at the caller's deadline": (
        AgentAnswer(error_code=ErrorCode.CONNECT_TIMEOUT, sent=False, cut_short=True), Reading.CALLERS, Step.DONE,
        None, False),
    "total timeout at the caller's deadline": (
        AgentAnswer(error_code=ErrorCode.TOTAL_TIMEOUT, cut_short=True), Reading.CALLERS, Step.DONE, None, False),
    "total timeout": (AgentAnswer(error_code=ErrorCode.TOTAL_TIMEOUT), Reading.FAILED, Step.RETRY, False, False),
    "agent busy": (AgentAnswer(error_code=ErrorCode.BUSY), Reading.BUSY, Step.NEXT, None, False),
    "agent's 422": (AgentAnswer(error_code=ErrorCode.INVALID_PAYLOAD), Reading.CALLERS, Step.DONE, None, False),
    "agent's 413": (AgentAnswer(error_code=ErrorCode.PAYLOAD_TOO_LARGE), Reading.CALLERS, Step.DONE, None, False),
    "agent's 431": (AgentAnswer(error_code=ErrorCode.INVALID_FRAME), Reading.CALLERS, Step.DONE, None, False),
    "router out of descriptors before sending": (
        AgentAnswer(error_code=ErrorCode.INTERNAL_ERROR, sent=False), Reading.ROUTERS, Step.DONE, None, False),
    "router out of buffers after sending": (
        AgentAnswer(error_code=ErrorCode.INTERNAL_ERROR), Reading.ROUTERS, Step.DONE, None, False),
    "business error": (AgentAnswer(error_code=ErrorCode.BUSINESS_ERROR, business_error=BusinessError(code="no")),
                       Reading.BUSINESS, Step.DONE, False, False),
    "agent error": (AgentAnswer(error_code=ErrorCode.AGENT_ERROR), Reading.FAILED, Step.RETRY, False, False),
    "answer too large": (AgentAnswer(error_code=ErrorCode.ANSWER_TOO_LARGE), Reading.FAILED, Step.RETRY, False,
                         False),
}


@pytest.mark.parametrize("name", ANSWERS)
def test_each_answer_is_read_counted_ejected_and_followed_as_decided(name):
    answer, reading, step, counted, ejected = ANSWERS[name]
    book = InstanceBook()
    breaker = CircuitBreaker(BreakerConfig())
    assert read(answer) is reading and verdict(answer) is counted
    assert Observer(book).observe(breaker, "a-1", answer, NOW) is step
    requests, failures = breaker.snapshot(NOW).requests, breaker.snapshot(NOW).failures
    assert (requests, failures) == ((0, 0) if counted is None else (1, 0) if counted else (1, 1))
    assert book.ejected("a-1", NOW) is ejected


def test_a_success_reinstates_an_ejected_instance_and_a_new_refusal_starts_over():
    book = InstanceBook()
    observer, breaker = Observer(book), CircuitBreaker(BreakerConfig())
    refused = AgentAnswer(error_code=ErrorCode.AGENT_ERROR, sent=False)
    observer.observe(breaker, "a-1", refused, NOW)
    observer.observe(breaker, "a-1", refused, NOW + 3)
    assert book.ejected("a-1", NOW + 3 + 3.9)  # the second refusal in a row: 4 s
    observer.observe(breaker, "a-1", AgentAnswer(result=1), NOW + 10)
    assert not book.ejected("a-1", NOW + 10)
    observer.observe(breaker, "a-1", refused, NOW + 20)
    assert book.ejected("a-1", NOW + 21.9) and not book.ejected("a-1", NOW + 22)  # 2 s again


def test_the_capability_breaker_counts_the_final_answer_by_the_same_rule():
    breaker = CircuitBreaker(BreakerConfig())
    for answer in (AgentAnswer(error_code=ErrorCode.BUSY), AgentAnswer(error_code=ErrorCode.INTERNAL_ERROR),
                   AgentAnswer(error_code=ErrorCode.TOTAL_TIMEOUT, cut_short=True), None):
        Observer.observe_capability(breaker, answer, NOW)
    assert breaker.snapshot(NOW).requests == 0
    Observer.observe_capability(breaker, AgentAnswer(error_code=ErrorCode.AGENT_ERROR), NOW)
    Observer.observe_capability(breaker, AgentAnswer(result=1), NOW)
    assert (breaker.snapshot(NOW).requests, breaker.snapshot(NOW).failures) == (2, 1)


@pytest.mark.parametrize(("code", "expected"), [
    (ErrorCode.CONNECT_TIMEOUT, True), (ErrorCode.FIRST_BYTE_TIMEOUT, True), (ErrorCode.TOTAL_TIMEOUT, True),
    (ErrorCode.AGENT_ERROR, False), (None, False)])
def test_a_timeout_is_the_callers_only_when_its_deadline_was_brought_forward(code, expected):
    assert hurried(code, HINTED, OWN) is expected
    assert hurried(code, OWN, OWN) is False


def test_an_instance_refusing_for_a_long_outage_stays_ejected_for_the_longest_time_and_no_longer():
    """In panic every instance is tried, so a single dead instance takes a strike per call: the 1025th used
    to overflow a float and fail every later call in the router."""
    book = InstanceBook()
    observer = Observer(book)
    breaker, refused = CircuitBreaker(BreakerConfig()), AgentAnswer(error_code=ErrorCode.AGENT_ERROR, sent=False)
    for strike in range(2000):
        assert observer.observe(breaker, "a-1", refused, NOW + strike) is Step.NEXT
    assert book.ejected("a-1", NOW + 1999 + 59.9) and not book.ejected("a-1", NOW + 1999 + 60)
