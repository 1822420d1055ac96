"""Which records earn a validation retry (pairbench.validate.retries), decided from the validate artifact alone."""

import pytest

from pairbench.core import naming
from pairbench.validate import retries


def cid(input_tokens):
    """The condition id of *input_tokens* input tokens (64 output tokens)."""
    return f"in{input_tokens}-out64"


def entry(input_tokens, ok=True, flags=(), **verdicts):
    return {"condition": cid(input_tokens), "ok": ok, "flags": list(flags), "selected": False,
            "verdicts": {case: {"verdict": v, "reason": f"{case} said {v}"} for case, v in verdicts.items()}}


def validation(*entries, retry=0):
    body = {"round": 1, "arm": "candidate", "records": list(entries)}
    return {**body, "retry": retry} if retry else body


def test_a_timeout_earns_a_retry_naming_the_case():
    v = validation(entry(256, python_function="timeout", token_counts="pass"),
                   entry(1024, python_function="pass", token_counts="pass"))
    assert retries.retry_reasons(v, ["timeout"]) == {
        "in256-out64": {"reason": "case python_function timeout: python_function said timeout", "kinds": ["timeout"]}}


def test_only_records_whose_every_reason_is_retryable_are_retried():
    v = validation(entry(1, python_function="timeout", matches_baseline="fail"),  # also wrong: not retried
                   entry(2, ok=False, flags=["cold_cache: 7 prompt tokens came from the cache"],
                         python_function="timeout"),
                   entry(3, python_function="fail"),
                   entry(4, ok=False, flags=["prompt_tokens: got 257, planned 256"], token_counts="fail"),
                   entry(5, python_function="pass", matches_baseline="skipped"))
    assert retries.retry_reasons(v, ["timeout"]) == {}
    assert set(retries.retry_reasons(v, ["timeout", "fail"])) == {cid(1), cid(3)}
    assert set(retries.retry_reasons(v, ["timeout", "gate"])) == {cid(2)}
    assert set(retries.retry_reasons(v, ["timeout", "fail", "gate"])) == {cid(1), cid(2), cid(3), cid(4)}
    why = retries.retry_reasons(v, ["timeout", "gate"])[cid(2)]
    assert why == {"reason": "gate cold_cache: 7 prompt tokens came from the cache; "
                             "case python_function timeout: python_function said timeout",
                   "kinds": ["gate", "timeout"]}
    assert retries.kind_of(why["kinds"]) == "gate failure + validator timeout"


def test_nothing_to_retry_when_everything_passed_or_retries_are_off():
    v = validation(entry(256, python_function="pass", token_counts="pass"))
    assert retries.retry_reasons(v, ["timeout", "fail", "gate"]) == {}
    assert retries.retry_reasons(validation(entry(256, python_function="timeout")), []) == {}


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match=r"validate.retry_on: unknown kind\(s\) \['crash'\]"):
        retries.retry_reasons(validation(), ["timeout", "crash"])


def test_keys_and_labels_match_the_file_names():
    measure = {"visit": {"id": "r03-candidate"}, "retry": 2, "records": []}
    assert naming.measure_key(measure) == ("r03-candidate", 2)
    assert naming.validation_key({"round": 3, "arm": "candidate", "retry": 2}) == ("r03-candidate", 2)
    assert naming.validation_key({"round": 3, "arm": "candidate"}) == ("r03-candidate", 0)
    assert naming.label("r03-candidate", 0) == "r03-candidate"
    assert naming.label("r03-candidate", 2) == "r03-candidate.retry2"
    assert retries.kind_of(["fail"]) == "case failure" and retries.kind_of(["timeout"]) == "validator timeout"


# --- how retries are disclosed: the bundle README's "Retries" section and the HTML landing page -------

def measure(visit_id, records, attempt=1, retry=0, reasons=()):
    rnd, arm = int(visit_id[1:3]), visit_id.split("-", 1)[1]
    body = {"visit": {"id": visit_id, "round": rnd, "arm": arm}, "attempt": attempt,
            "records": [{"condition": cid(n), "input_tokens": n, "output_tokens": 64} for n in records]}
    if retry:
        body.update({"retry": retry, "retry_reasons": [{"condition": cid(n), "reason": f"case python_function {k}: x",
                                                        "kinds": [k]} for n, k in reasons]})
    return body


def table(rows):
    import pandas as pd

    return pd.DataFrame([dict(zip(("round", "arm", "condition", "attempt", "retry", "selected", "reason"),
                                  (rnd, arm, cid(n), *rest))) for rnd, arm, n, *rest in rows])


def test_report_lists_every_retry_with_its_reason_and_outcome():
    from pairbench.publish.report import retries_section

    measures = [measure("r01-b", [256, 1024]), measure("r01-c", [256, 1024], attempt=2),
                measure("r02-c", [256, 1024]),
                measure("r02-c", [256, 1024], retry=1, reasons=[(256, "timeout"), (1024, "timeout")]),
                measure("r02-c", [256], retry=2, reasons=[(256, "timeout")])]
    df = table([(1, "b", 256, 1, 0, True, ""), (1, "b", 1024, 1, 0, True, ""),
                (1, "c", 256, 2, 0, True, ""), (1, "c", 1024, 2, 0, True, ""),
                (2, "c", 256, 1, 0, False, "superseded by retry 2"), (2, "c", 1024, 1, 0, False, "superseded by retry 1"),
                (2, "c", 256, 1, 1, False, "superseded by retry 2"), (2, "c", 1024, 1, 1, True, ""),
                (2, "c", 256, 1, 2, False, "case python_function timeout")])
    text = "\n".join(retries_section(measures, df))
    assert ("Retries: 3 disclosed: 1 engine-fault re-attempt(s) of a measurement job and 2 partial-visit "
            "validation retry(ies) (2 validator timeout).") in text
    assert "- r01-c: attempt 2: an engine fault failed the earlier attempt(s)" in text
    assert ("- r02-c retry 1, `in256-out64` (partial visit, validator timeout): the visit's own measurement was "
            "excluded: case python_function timeout: x. Re-measured after every visit; its new record was "
            "excluded too and then superseded by retry 2;") in text
    assert "- r02-c retry 1, `in1024-out64` (partial visit, validator timeout): the visit's own measurement " \
           "was excluded: case python_function timeout: x. Re-measured after every visit; its new record " \
           "passed and is the one used;" in text
    assert "- r02-c retry 2, `in256-out64` (partial visit, validator timeout): retry 1 was excluded" in text
    assert text.count("its new record was excluded too;") == 1
    assert "Retries: none" in "\n".join(retries_section(measures[:1], df.iloc[:2]))


def test_landing_page_has_a_row_per_retried_record():
    from pairbench.publish.landing import retry_rows

    df = table([(1, "b", 256, 1, 0, True, ""), (1, "c", 256, 2, 0, True, ""), (1, "c", 1024, 2, 0, True, ""),
                (2, "c", 256, 1, 0, False, "superseded by retry 2"), (2, "c", 256, 1, 1, False, "superseded by retry 2"),
                (2, "c", 256, 1, 2, True, ""), (2, "c", 1024, 1, 1, False, "case python_function timeout")])
    assert retry_rows(df) == [["1", "c", "in256-out64", "2", "0", "used"], ["1", "c", "in1024-out64", "2", "0", "used"],
                              ["2", "c", "in256-out64", "1", "1", "superseded by retry 2"],
                              ["2", "c", "in1024-out64", "1", "1", "excluded"],
                              ["2", "c", "in256-out64", "1", "2", "used"]]
    assert retry_rows(df.drop(columns=["attempt", "retry"])) == []
