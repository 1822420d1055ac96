"""The report's Engine facts section (pairbench.publish.engine_section): each arm's engine facts side
by side, the fast paths off and why, and a difference no patch decides named."""

from pairbench.publish.engine_section import engine_section

PLAN = {"arms": {"baseline": {}, "candidate": {}}}


def facts(isa="avx2", decode=1, fused_on=True, differs=(), kv="f16", torch="2.13.0+cpu") -> dict:
    return {"native": {"available": True, "isa": isa, "isa_source": "cache", "kernels_sha256": "ab" * 32},
            "threads": {"prefill": 1, "decode": decode}, "linear": "gguf", "kv_dtype": kv, "torch": torch,
            "fast_paths": {"mode": "auto", "off": [], "fused_decode": {"on": fused_on, "differs": list(differs)},
                           "native_kv": {"on": False, "differs": ["KVCache"]}}}


def warmup(f, off=(), why=None) -> dict:
    return {"engine_facts": f, "fast_paths": {"mode": "auto", "off": list(off), "why": why or {}}}


def test_the_arms_facts_side_by_side_with_each_fast_path_and_why():
    text = "\n".join(engine_section(PLAN, {
        "baseline": warmup(facts(fused_on=False), off=["fused_decode"],
                           why={"fused_decode": "arm candidate's code differs: FeedForward"}),
        "candidate": warmup(facts(fused_on=False, differs=["FeedForward"], kv="int8"))}))
    assert "| fact | `baseline` | `candidate` |" in text
    assert "| kernel path (ISA) | avx2 (cache) | avx2 (cache) |" in text
    assert ("| fast path `fused_decode` | off (for the comparison: another arm's code differs) | off (this arm's "
            "code differs: FeedForward) |") in text
    assert "| KV cache | f16 | int8 |" in text  # a patch's doing: not named as the run's
    assert "The arms ran the same kernel path, threads and torch." in text
    assert "- arm candidate: fast path fused_decode off: its code differs (FeedForward)" in text


def test_a_difference_no_patch_decides_is_named():
    text = "\n".join(engine_section(PLAN, {"baseline": warmup(facts()),
                                           "candidate": warmup(facts(isa="avx512vnni", decode=2))}))
    assert "**The arms differ in kernel path (ISA), threads (prefill / decode), which no patch decides**" in text


def test_no_section_where_no_engine_reports_facts():
    assert engine_section(PLAN, {"baseline": {"engine_facts": None, "fast_paths": None},
                                 "candidate": {"engine_facts": None, "fast_paths": None}}) == []
