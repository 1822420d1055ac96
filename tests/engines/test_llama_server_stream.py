"""llama-server's OpenAI-compatible stream, as recorded from the server built from the vendored tag
(tests/data/llama-server/stream-verbose.sse: /v1/completions, stream, include_usage, "verbose": true).

Its chunks carry the generated token ids only in ``__verbose.tokens``; the client must read them
there, or the token_counts and matches_baseline cases would compare empty lists.
"""

import json
from pathlib import Path

from pairbench.engines.client import StreamResult, absorb_chunk
from pairbench.engines.profiles import load_profile

SSE = Path(__file__).resolve().parents[1] / "data" / "llama-server" / "stream-verbose.sse"


def test_token_ids_come_from_the_verbose_copy_of_each_chunk():
    result = StreamResult()
    for i, line in enumerate(SSE.read_text().splitlines()):
        if line.startswith("data: ") and line != "data: [DONE]":
            absorb_chunk(result, json.loads(line[6:]), float(i))
    assert result.text == "Hello there. I"
    assert result.token_ids == [19556, 665, 30, 339]
    assert len(result.token_times) == 4  # the final chunk (no ids, empty text) adds no token
    assert result.usage["completion_tokens"] == 4 and result.timings["prompt_n"] == 12
    assert result.finish_reason == "length"


def test_the_profile_asks_for_the_verbose_copy():
    path, body = load_profile("llama-server").generation_body(prompt="p", factors={"output_tokens": 4}, seed=0)
    assert path == "/v1/completions" and body["verbose"] is True and body["cache_prompt"] is False
