"""Level metrics and validity (pairbench.analysis.loadlevel) on hand-built levels with hand-computed values.

A level is what its measure record keeps under ``client``: per request when it was due, sent and
ended (s since the level started) and each token's arrival (s since its send). The closed-loop level
below: 2 streams, 4 requests of 3 tokens each (token times = send + TTFT, then the gaps):

    stream 0: r0 due 0.000 sent 0.000, TTFT 100, gaps 10 20 -> tokens .100 .110 .130, end .140
              r2 due 0.140 sent 0.142, TTFT  50, gaps 20 20 -> tokens .192 .212 .232, end .240
    stream 1: r1 due 0.000 sent 0.001, TTFT 120, gaps 30 30 -> tokens .121 .151 .181, end .200
              r3 due 0.200 sent 0.204, TTFT  60, gaps 10 10 -> tokens .264 .274 .284, end .300
"""

import json

import pytest

from pairbench.analysis.loadlevel import Bounds, check, level_metrics, percentile, pkey
from pairbench.core.slo import SLO


def rec(index, *, stream=None, due, sent, ttft=None, gaps=(), end, error=None, kind=None, warmup=False,
        completion=None):
    """One request's raw times (ms given here; stored in s): its tokens at TTFT, then the gaps."""
    tokens = []
    if ttft is not None:
        tokens = [ttft]
        for g in gaps:
            tokens.append(tokens[-1] + g)
    return {"index": index, "warmup": warmup, "stream": stream, "scheduled_s": due, "sent_s": sent, "end_s": end,
            "token_s": [t / 1e3 for t in tokens],
            "completion_tokens": completion if completion is not None else len(gaps) + 1,
            "error": error, "error_kind": kind}


def closed(**over):
    records = [
        rec(0, stream=0, due=0.0, sent=0.0, ttft=100.0, gaps=(10.0, 20.0), end=0.140),
        rec(1, stream=1, due=0.0, sent=0.001, ttft=120.0, gaps=(30.0, 30.0), end=0.200),
        rec(2, stream=0, due=0.140, sent=0.142, ttft=50.0, gaps=(20.0, 20.0), end=0.240),
        rec(3, stream=1, due=0.200, sent=0.204, ttft=60.0, gaps=(10.0, 10.0), end=0.300),
    ]
    client = {"wall_s": 0.300, "cpu_s": 0.030, "offered_rate_rps": None, "requests": records}
    client.update(over)
    return client


SLO_ = SLO(ttft_ms=100, itl_ms=25)


def test_closed_loop_metrics_by_hand():
    m = level_metrics(closed(), level="in32-out3-c2", slo=SLO_, percentiles=(50, 99))
    assert (m.n_requests, m.n_measured, m.n_ok, m.n_itl, m.n_errors) == (4, 4, 4, 8, 0)
    assert m.window_s == pytest.approx(0.300)
    assert m["output_tok_s"] == pytest.approx(12 / 0.300)           # 12 tokens in the window
    assert m["requests_s"] == pytest.approx(4 / 0.300)
    lat = m.values
    # TTFT 50 60 100 120: p50 at rank 1.5 -> 80; p99 at rank 2.97 -> 100 + 0.97 * 20
    assert lat["ttft_p50_ms"] == pytest.approx(80.0) and lat["ttft_p99_ms"] == pytest.approx(119.4)
    # gaps 10 10 10 20 20 20 30 30: p50 at rank 3.5 -> 20; p99 at rank 6.93 -> 30
    assert lat["itl_p50_ms"] == pytest.approx(20.0) and lat["itl_p99_ms"] == pytest.approx(30.0)
    # e2e 96 98 140 199: p50 -> 119; p99 -> 140 + 0.97 * 59
    assert lat["e2e_p50_ms"] == pytest.approx(119.0) and lat["e2e_p99_ms"] == pytest.approx(197.23)
    # TPOT (e2e - ttft) / 2: 20, 39.5, 24, 18 -> sorted 18 20 24 39.5
    assert lat["tpot_p50_ms"] == pytest.approx(22.0) and lat["tpot_p99_ms"] == pytest.approx(39.035)
    # good: r0 (ttft 100 <= 100, tpot 20), r2, r3; r1's TTFT 120 misses
    assert m["slo_attainment"] == pytest.approx(0.75)
    assert m["goodput_rps"] == pytest.approx(3 / 0.300)
    # in flight over [0, 0.204]: r0 0.140 + r1 0.199 + r2 0.062 + r3 0 = 0.401
    assert m["achieved_concurrency"] == pytest.approx(0.401 / 0.204)
    assert m["lag_p99_ms"] == pytest.approx(3.94) and m.lag_max_ms == pytest.approx(4.0)
    assert m["client_cpu_share"] == pytest.approx(0.1) and m.client_cpu_ms_per_request == pytest.approx(7.5)
    d = m.to_dict()
    json.dumps(d)  # plain JSON
    assert d["ttft_p99_ms"] == lat["ttft_p99_ms"] and d["output_tok_s"] == m["output_tok_s"]


def test_percentile_is_numpy_linear():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20], 99) == pytest.approx(19.9)
    assert percentile([], 50) is None
    assert pkey(99.9) == "p99_9" and pkey(50) == "p50"


def test_warmup_requests_load_the_server_but_are_not_measured():
    m = level_metrics(closed(requests=[dict(r, warmup=r["index"] == 0) for r in closed()["requests"]]),
                      level="c2", slo=SLO_, percentiles=(50,))
    assert (m.n_measured, m.n_ok) == (3, 3)
    assert m.window_s == pytest.approx(0.299)                    # first measured send (r1, 0.001) -> 0.300
    assert m["output_tok_s"] == pytest.approx(12 / 0.299)           # r0's tokens arrive inside the window too
    assert m["requests_s"] == pytest.approx(3 / 0.299)
    assert m["ttft_p50_ms"] == pytest.approx(60.0)   # of 50, 60, 120
    assert m["slo_attainment"] == pytest.approx(2 / 3)             # r2, r3 good; r1 not


def test_a_valid_level_passes_every_check():
    v = check(level_metrics(closed(), level="c2", slo=SLO_, percentiles=(50,)))
    assert v.ok and v.failed == () and v.to_dict() == {"level": "c2", "ok": True, "failed": [], "messages": []}


def test_a_failed_request_fails_the_level_and_is_never_a_sample():
    run = closed()
    run["requests"][3] = rec(3, stream=1, due=0.200, sent=0.204, end=0.250, error="stream ended without [DONE] "
                            "after 2 tokens", kind="dropped")
    m = level_metrics(run, level="in32-out3-c2", slo=SLO_, percentiles=(50,))
    assert (m.n_ok, m.n_errors, m.errors) == (3, 1, {"dropped": 1})
    assert m["ttft_p50_ms"] == pytest.approx(100.0)  # of 50, 100, 120
    assert m["slo_attainment"] == pytest.approx(2 / 4)            # the failed request counts, and is not good
    v = check(m)
    assert v.failed == ("errors",)
    assert v.messages[0].startswith("level in32-out3-c2: 1 of 4 requests failed (1 dropped)")
    assert "without [DONE]" in v.messages[0]


def test_too_few_requests_for_p99():
    v = check(level_metrics(closed(), level="c2", slo=SLO_, percentiles=(50, 99)))
    assert v.failed == ("too_few_requests",)
    assert v.messages == ("level c2: 4 measured requests completed, too few for p99 (needs 100)",)


def test_schedule_lag_over_the_bound():
    v = check(level_metrics(closed(), level="c2", percentiles=(50,)), Bounds(lag_p99_ms=3.0))
    assert v.failed == ("schedule_lag",)
    assert "level c2: p99 client turnaround" in v.messages[0] and "3.9 ms exceeds 3 ms" in v.messages[0]


def test_client_cpu_near_a_core():
    v = check(level_metrics(closed(cpu_s=0.27), level="c2", percentiles=(50,)))
    assert v.failed == ("client_cpu",)
    assert v.messages[0] == ("level c2: the client used 0.90 of a CPU core (bound 0.8): the client may be the "
                             "bottleneck")


def test_closed_loop_short_of_its_streams():
    run = closed()
    run["requests"][2] = rec(2, stream=0, due=0.140, sent=0.180, ttft=50.0, gaps=(20.0, 20.0), end=0.278)
    m = level_metrics(run, level="c2", percentiles=(50,))
    # in flight over [0, 0.204]: 0.140 + 0.199 + 0.024 = 0.363
    assert m["achieved_concurrency"] == pytest.approx(0.363 / 0.204)
    v = check(m, Bounds(lag_p99_ms=100))
    assert v.failed == ("achieved_load",)
    assert v.messages[0] == "level c2: achieved concurrency 1.78 of 2 streams (below 95% of the target)"


def open_run(sends):
    due = [0.0, 0.5, 1.0]
    records = [rec(i, due=d, sent=s, ttft=40.0, gaps=(10.0,), end=s + 0.1) for i, (d, s) in enumerate(zip(due, sends))]
    return {"wall_s": sends[-1] + 0.1, "cpu_s": 0.01, "offered_rate_rps": 2.0, "requests": records}


def test_open_loop_on_schedule():
    m = level_metrics(open_run([0.001, 0.502, 1.003]), level="in32-out2-r2", percentiles=(50,))
    assert m["achieved_rate_rps"] == pytest.approx(2 / 1.002)
    assert m.lag_max_ms == pytest.approx(3.0)
    assert check(m).ok


def test_open_loop_behind_schedule():
    m = level_metrics(open_run([0.001, 0.6, 1.3]), level="in32-out2-r2", percentiles=(50,))
    v = check(m)
    assert v.failed == ("schedule_lag", "achieved_load")
    # lags 1, 100, 300 ms: p99 at rank 1.98 -> 100 + 0.98 * 200 = 296
    assert v.messages[0] == ("level in32-out2-r2: p99 schedule lag 296.0 ms exceeds 20 ms: the client, not the "
                             "engine, set the pace")
    assert v.messages[1] == ("level in32-out2-r2: achieved rate 1.54 req/s against the schedule's 2 (more than 5% "
                             "off)")


def test_no_slo_no_attainment():
    m = level_metrics(closed(), level="c2", percentiles=(50,))
    assert m["slo_attainment"] is None and m["goodput_rps"] is None and m.slo is None


def test_closed_loop_with_no_more_requests_than_streams():
    m = level_metrics(closed(), level="c4", percentiles=(50,))  # the level's id says 4 streams
    assert m["achieved_concurrency"] is None
    v = check(m)
    assert v.failed == ("achieved_load",)
    assert v.messages[0] == "level c4: 4 requests for 4 streams all went out at once: too few to hold the streams busy"
