"""Gate evidence read from an engine's own reply (or its log): native token counts and a cold cache.

Which field proves what is the engine profile's to say (``cold_cache``, ``tokens`` in
``config/engines/<name>.yaml``); these functions only read it. The proof strength is recorded with
every record: ``strong`` (the count of prompt tokens actually evaluated), ``weak`` (a cached-token
count, which an engine may omit) or ``none`` (unproven: flagged, never a silent pass).
"""

from __future__ import annotations

import re
from typing import Any

from pairbench.engines.profiles import EngineProfile


def get_path(obj: Any, dotted: str) -> Any:
    """``get_path(reply, "usage.prompt_tokens_details.cached_tokens")``; None where missing."""
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _absent(obj: Any, dotted: str) -> bool:
    """True when *dotted* is missing because some dict on the way lacks the key (or holds null)."""
    cur = obj
    for part in dotted.split("."):
        if cur is None:
            return True
        if not isinstance(cur, dict):
            return False
        if part not in cur:
            return True
        cur = cur[part]
    return cur is None


def cold_cache_evidence(profile: EngineProfile, reply: dict, prompt_tokens: int, log_text: str | None = None) -> dict:
    """Judge one request's cold-cache gate from the server's own reply fields (or its log).

    *reply* holds the final reply's top-level fields (``usage``, ``timings``, ``tokens_cached``...);
    *log_text* is what the server logged during this one request (engines with log evidence).
    Returns ``{"proof": strong|weak|none, "cold": True|False|None, "evaluated_tokens",
    "cached_tokens", "flag"}``: ``cold`` None means unproven (never counted as a pass silently).
    """
    cc = profile.cold_cache_spec
    out = {"proof": profile.cold_cache_proof, "cold": None, "evaluated_tokens": None,
           "cached_tokens": None, "flag": None}
    cached = get_path(reply, cc.cached_field) if cc.cached_field else None
    if cached is None and cc.missing_means_zero and cc.proof == "cached_tokens" and _absent(reply, cc.cached_field):
        cached = 0  # omitted on a miss (only a well-formed absence counts, never a malformed field)
    out["cached_tokens"] = cached
    if cc.proof == "evaluated_tokens":
        if cc.evaluated_field:
            ev, where = get_path(reply, cc.evaluated_field), f"reply lacks {cc.evaluated_field}"
        else:
            found = [int(m.group(1)) for m in re.finditer(cc.log_evaluated_pattern, log_text or "")]
            ev = found[-1] if len(found) == 1 else None
            where = (f"server log has {len(found)} prompt-evaluation lines for this request, expected 1"
                     if log_text is not None else "no server log to read the evaluated count from")
            hits = count_log_prefix_hits(profile, log_text or "")
            if hits:
                cached = out["cached_tokens"] = sum(hits)
            elif log_text is not None and cc.log_pattern:
                cached = out["cached_tokens"] = 0
        out["evaluated_tokens"] = ev
        if not isinstance(ev, int):
            out["flag"] = f"cold_cache: {where}"
            return out
        out["cold"] = ev == prompt_tokens and (cached in (None, 0))
        if not out["cold"]:
            out["flag"] = (f"cold_cache: evaluated {ev} of {prompt_tokens} prompt tokens"
                           + (f", {cached} cached" if cached else ""))
        return out
    if cc.proof == "cached_tokens":
        if not isinstance(cached, int):
            out["flag"] = f"cold_cache: {cc.cached_field} is not a count ({cached!r})"
            return out
        out["cold"] = cached == 0
        if cached:
            out["flag"] = f"cold_cache: {cached} of {prompt_tokens} prompt tokens served from cache"
        return out
    out["flag"] = f"cold_cache: unproven (engine {profile.name} reports no cache evidence)"
    return out


def native_counts(profile: EngineProfile, reply: dict, *, tokenize_count: int | None = None,
                  streamed_tokens: int | None = None) -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)`` from where this engine reports them."""
    pf, cf = profile.prompt_count_field, profile.completion_count_field
    prompt = tokenize_count if pf is None else get_path(reply, pf)
    completion = streamed_tokens if cf is None else get_path(reply, cf)
    return prompt, completion


def count_log_prefix_hits(profile: EngineProfile, log_text: str) -> list[int] | None:
    """Reused-prefix token counts the server logged (``cold_cache.log_pattern``); None if no pattern."""
    pat = profile.cold_cache_spec.log_pattern
    if not pat:
        return None
    return [int(m.group(1)) for m in re.finditer(pat, log_text)]
