"""Unit tests for pairbench.publish.sanitize: each detector's positives and false-positive guards, the scrubber's
consistent pseudonyms, and patch identity stripping. All identifiers are synthetic."""

from __future__ import annotations

import pytest

from pairbench.publish import sanitize
from pairbench.publish.sanitize import find, scrub_text, strip_patch

from sanitize_support import DATA, IDS, POSITIVES


def detectors_in(text: str, ids=None) -> set[str]:
    return {m.detector for m in find(text, ids or {})}


@pytest.mark.parametrize("detector,text", POSITIVES, ids=[f"{d}:{t[:24]}" for d, t in POSITIVES])
def test_detector_finds_and_scrubber_removes(detector, text):
    assert detector in detectors_in(text)
    scrubbed = scrub_text(text, {})
    assert detector not in detectors_in(scrubbed), scrubbed


# Text that must NOT be flagged by any detector: our numeric data, versions, hashes, code.
NEGATIVES = [
    "python 3.11.7, torch 2.13.0+cpu, pairbench 0.1.0, driver 550.54.15, CUDA 12.4",
    "pin: gguf==0.10.0.1 and tokenizers>=0.20.3.4, release v1.2.3.4",
    "round,arm,condition,input_tokens,output_tokens,ttft_ms\n1,baseline,in256-out64,256,64,120.5\n"
    "2,candidate,in1024-out64,1024,64,1.25e3\n",
    '{"prompt_tokens": 256, "max_tokens": 64, "tokens_cached": 0, "kv_bytes": 1048576}',
    '{"sha256": "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"}',
    "index 308af67..87748c7 100644",
    "From 000217c1ce420482fd6a147ea13ca24ab5027add Mon Sep 17 00:00:00 2001",
    "server on 127.0.0.1:8080, bind 0.0.0.0, [::1]:8080, loopback only",
    "timestamps 12:30:45 and 2026-11-29T15:20:01.123",
    "x = seq[1::2]; y = arr[::3]; std::vector<int> v;",
    "json.dumps(data, sort_keys=True); cache_key = compute(prompt)",
    '{"eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "pad_token": null}',
    "HF_TOKEN=<redacted> and PASSWORD=${DB_PASSWORD} and OPENAI_API_KEY=***",
    "ether 00:00:00:00:00:00 brd ff:ff:ff:ff:ff:ff",
    "desktop-class and laptop-friendly machines, DESKTOP-ish",
    "a homepage at https://x.example.org/homepage/x and src/Users.py, path engine/Users.py",
    "tok/s and ms/token, 1/2 and 3/4, docs/perf.md, ~/.cache/pairbench, <path>/engine/x.py, cd /",
    "--- /dev/null\n+++ b/engine/new.py; GET /v1/chat/completions, /health and /metrics",
    "</td><td>0.95</td></tr></details><br/>",
    "the ratio 1.163 [1.12, 1.20] p=0.031 over 4 rounds of 256 tokens",
    "time per output token improves; the first token arrives sooner; token throughput doubles",
    "MAX_TOKENS=100000 TOKENIZERS_PARALLELISM=false --max-tokens 64 --token-budget=4096",
    "Authorization header omitted; password policy documented; secret sauce: none",
]


@pytest.mark.parametrize("text", NEGATIVES)
def test_no_false_positives(text):
    assert detectors_in(text) == set()
    assert scrub_text(text, {}) == text


def test_literal_identifiers_are_whole_tokens_only():
    ids = {"hostname": ["vm"], "username": ["root"]}
    assert detectors_in("kvm runs as rootless on vmware", ids) == set()
    assert detectors_in("host vm, user root", ids) == {"literal:hostname", "literal:username"}
    # a single character is too short to be a usable literal
    assert sanitize.usable_literals({"username": ["a"]}) == []


def test_scrub_pseudonyms_are_consistent_and_kept():
    pseudonyms: dict[str, str] = {}
    a = scrub_text("zq_alice on zq-devbox-07 (ZQ-DEVBOX-07) and DESKTOP-7QK2M9X", IDS, pseudonyms)
    b = scrub_text("again zq-devbox-07, DESKTOP-7QK2M9X, zq_alice", IDS, pseudonyms)
    assert a == "user-1 on host-2 (host-2) and host-1"
    assert b == "again host-2, host-1, user-1"
    assert pseudonyms == {"zq_alice": "user-1", "zq-devbox-07": "host-2", "desktop-7qk2m9x": "host-1"}


def test_scrub_fqdn_email_secret_and_home():
    text = ("ssh zq_alice@zq-devbox-07.corp.zqexample.net; HOME=/home/zq_alice; "
            "key zqk_live_9f8e7d6c5b4a39281706f5e4d3c2b1a0 in a sentence")
    out = scrub_text(text, IDS)
    assert out == "ssh <email>; HOME=~; key <redacted> in a sentence"
    assert "host-1.domain-1" == scrub_text("zq-devbox-07.corp.zqexample.net", IDS)


def test_literal_home_that_is_not_under_home():
    ids = {"home": ["/srv/zq"]}
    # the literal home first (its pseudonym ~), then any other absolute path (abs-path)
    assert scrub_text("model at /srv/zq/models/x.gguf, not /srv/zqx", ids) == "model at ~/models/x.gguf, not <path>"


def test_scrub_keeps_json_valid():
    import json

    raw = json.dumps({"src": "C:\\Users\\zq_alice\\pb", "unc": "\\\\zq-fs\\share\\x", "ip": "10.23.45.67",
                      "n": 3.11, "HF_TOKEN": "hf_ZqPlanted0123456789abcdefghijklmn"})
    data = json.loads(scrub_text(raw, IDS))
    assert data == {"src": "~\\pb", "unc": "<unc-path>\\x", "ip": "<ipv4>", "n": 3.11, "HF_TOKEN": "<redacted>"}


def test_strip_patch_removes_identities_and_keeps_the_diff():
    raw = (DATA / "0001-int8-path.patch").read_text()
    out = strip_patch(raw)
    for gone in ("From: ", "Date: ", "Signed-off-by", "Co-authored-by", "@corp.zqexample.net", "Zq Alice"):
        assert gone not in out
    assert out.startswith("From 000217c1ce420482fd6a147ea13ca24ab5027add Mon Sep 17 00:00:00 2001\n")
    assert "Subject: [PATCH] engine: int8 matmul path" in out
    diff = raw[raw.index("diff --git"):]
    assert out.endswith(diff), "the diff itself must be untouched"


def test_strip_patch_folded_from_header_and_email_in_body():
    raw = ("From abc Mon Sep 17 00:00:00 2001\nFrom: =?UTF-8?q?Zq=20Alice?=\n <zq.alice@corp.zqexample.net>\n"
           "Subject: [PATCH] x\n\nThanks to bo.zq@corp.zqexample.net\n---\n")
    out = strip_patch(raw)
    assert out == "From abc Mon Sep 17 00:00:00 2001\nSubject: [PATCH] x\n\nThanks to <email>\n---\n"


def test_strip_patch_relativizes_absolute_paths():
    raw = (DATA / "0002-version-tag.patch").read_text()
    out = strip_patch(raw, roots=["/home/zq_alice/pb/src"])
    assert "diff --git a/engine/VERSION b/engine/VERSION\n" in out
    assert "--- a/engine/VERSION\n+++ b/engine/VERSION\n" in out
    assert "zq_alice" not in out.split("---\n", 1)[1]
    # without the root, the home directory in the path is still rewritten (and the patch won't apply)
    out2 = strip_patch(raw)
    assert "zq_alice" not in out2.split("\n---\n", 1)[1]
    assert "diff --git a~/pb/src/engine/VERSION" in out2


def test_strip_patch_plain_diff_u_with_timestamps():
    raw = ("--- /home/zq_alice/pb/src/engine/VERSION\t2026-11-29 15:00:00 +0000\n"
           "+++ /home/zq_alice/pb/src/engine/VERSION\t2026-11-29 15:01:00 +0000\n@@ -1 +1 @@\n-0.1.0\n+0.2.0\n")
    out = strip_patch(raw, roots=["/home/zq_alice/pb/src/"])
    assert out.startswith("--- a/engine/VERSION\t2026-11-29 15:00:00 +0000\n+++ b/engine/VERSION\t")


def test_strip_patch_series_in_one_file():
    raw = (DATA / "0001-int8-path.patch").read_text() + (DATA / "0002-version-tag.patch").read_text()
    out = strip_patch(raw, roots=["/home/zq_alice/pb/src"])
    assert "From: " not in out and "Signed-off-by" not in out and "Date: " not in out
    assert out.count("\nSubject: ") == 2 and out.count("\nFrom ") == 1  # both headers kept, one per message
    assert "diff --git a/engine/VERSION b/engine/VERSION" in out


def test_path_category_and_unknown_categories():
    ids = {"path": ["/work/zq-pb", "/work/zq-pb/results/smoke"], "home": ["/home/zq_alice"], "badge": ["zq-badge-0042"]}
    text = "/work/zq-pb/results/smoke/x.json and /work/zq-pb/engine, not /work/zq-pb2; /home/zq_alice; zq-badge-0042"
    assert scrub_text(text, ids) == "<path>/x.json and <path>/engine, not <path>; ~; <redacted>"
    assert {m.detector for m in find(text, ids)} == {"literal:path", "literal:home", "home-path", "literal:badge",
                                                     "abs-path"}


def test_scrub_is_idempotent_and_pseudonyms_are_not_identifiers():
    text = "\n".join(t for _, t in POSITIVES) + "\n" + (DATA / "README.md").read_text() + (DATA / "server.log").read_text()
    ids = dict(IDS, fqdn=["zq-devbox-07.corp.zqexample.net"])
    pseudonyms: dict[str, str] = {}
    once = scrub_text(text, ids, pseudonyms)
    assert scrub_text(once, ids, dict(pseudonyms)) == once
    assert find(once, ids) == []


def test_strip_patch_leaves_hunk_lines_that_look_like_headers():
    # In a hunk, "--- x" is the removed line "-- x" (a Lua/SQL comment): not a file header to rewrite.
    hunk = "@@ -1,3 +1,2 @@\n--- /home/zq_alice/notes\n ctx\n++++ added\n"
    raw = "diff --git a/x.lua b/x.lua\n--- a/x.lua\n+++ b/x.lua\n" + hunk
    out = strip_patch(raw, roots=["/home/zq_alice"])
    assert out == raw
