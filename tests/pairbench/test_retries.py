"""Which records earn a validation retry (pairbench.retries), decided from the validate artifact alone."""

import pytest

from pairbench import retries


def entry(length, ok=True, flags=(), **verdicts):
    return {"length": length, "ok": ok, "flags": list(flags), "selected": False,
            "verdicts": {case: {"verdict": v, "reason": f"{case} said {v}"} for case, v in verdicts.items()}}


def validation(*entries, retry=0):
    body = {"round": 1, "arm": "candidate", "records": list(entries)}
    return {**body, "retry": retry} if retry else body


def test_a_timeout_earns_a_retry_naming_the_case():
    v = validation(entry(256, python_function="timeout", token_counts="pass"),
                   entry(1024, python_function="pass", token_counts="pass"))
    assert retries.retry_reasons(v, ["timeout"]) == {
        256: "case python_function timeout: python_function said timeout"}


def test_only_records_whose_every_reason_is_retryable_are_retried():
    v = validation(entry(1, python_function="timeout", matches_baseline="fail"),  # also wrong: not retried
                   entry(2, ok=False, flags=["cold_cache: 7 prompt tokens came from the cache"],
                         python_function="timeout"),
                   entry(3, python_function="fail"),
                   entry(4, ok=False, flags=["prompt_tokens: got 257, planned 256"], token_counts="fail"),
                   entry(5, python_function="pass", matches_baseline="skipped"))
    assert retries.retry_reasons(v, ["timeout"]) == {}
    assert set(retries.retry_reasons(v, ["timeout", "fail"])) == {1, 3}
    assert set(retries.retry_reasons(v, ["timeout", "gate"])) == {2}
    assert set(retries.retry_reasons(v, ["timeout", "fail", "gate"])) == {1, 2, 3, 4}
    why = retries.retry_reasons(v, ["timeout", "gate"])[2]
    assert why == ("gate cold_cache: 7 prompt tokens came from the cache; "
                   "case python_function timeout: python_function said timeout")
    assert retries.kind_of(why) == "validator timeout + gate failure"


def test_nothing_to_retry_when_everything_passed_or_retries_are_off():
    v = validation(entry(256, python_function="pass", token_counts="pass"))
    assert retries.retry_reasons(v, ["timeout", "fail", "gate"]) == {}
    assert retries.retry_reasons(validation(entry(256, python_function="timeout")), []) == {}


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match=r"validate.retry_on: unknown kind\(s\) \['crash'\]"):
        retries.retry_reasons(validation(), ["timeout", "crash"])


def test_keys_and_labels_match_the_file_names():
    measure = {"visit": {"id": "r03-candidate"}, "retry": 2, "records": []}
    assert retries.measure_key(measure) == ("r03-candidate", 2)
    assert retries.validation_key({"round": 3, "arm": "candidate", "retry": 2}) == ("r03-candidate", 2)
    assert retries.validation_key({"round": 3, "arm": "candidate"}) == ("r03-candidate", 0)
    assert retries.label("r03-candidate", 0) == "r03-candidate"
    assert retries.label("r03-candidate", 2) == "r03-candidate.retry2"
    assert retries.kind_of("case done_marker fail: no function") == "case failure"
