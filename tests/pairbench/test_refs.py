"""The CI shorthand refs: {git, base, head, arm} (pairbench.core.refs)."""

from pairbench.core.refs import expand


def test_refs_make_the_arms_base_and_head():
    cfg, problems = expand({"label": "pr", "refs": {"base": "origin/main", "head": "HEAD"}})
    assert problems == []
    assert cfg == {"label": "pr", "baseline": "base",
                   "arms": {"base": {"source": {"git": ".", "ref": "origin/main"}},
                            "head": {"source": {"git": ".", "ref": "HEAD"}}}}


def test_the_shared_keys_go_to_both_arms_and_the_repository_to_both_sources():
    cfg, _ = expand({"refs": {"git": "../llama.cpp", "base": "a" * 40, "head": "b" * 40,
                              "arm": {"engine": "llama-server", "threads": 1, "args": ["-fa"]}}})
    assert cfg["arms"]["head"] == {"engine": "llama-server", "threads": 1, "args": ["-fa"],
                                   "source": {"git": "../llama.cpp", "ref": "b" * 40}}
    assert cfg["arms"]["base"]["args"] is not cfg["arms"]["head"]["args"]  # copies, not one list


def test_a_config_without_refs_is_left_alone():
    given = {"arms": {"a": {}, "b": {}}}
    assert expand(given) == (given, [])


def test_bad_refs_are_named_by_key():
    _, problems = expand({"refs": {"base": "main", "colour": 1, "arm": {"source": "engine"}}, "arms": {"x": {}}})
    assert problems == [
        (("refs", "colour"), "not a key of refs (git, base, head, arm)"),
        (("refs", "head"), "the head arm's branch, tag or commit is required"),
        (("refs", "arm", "source"), "each arm's source is {git: refs.git, ref: refs.base or refs.head}"),
        (("refs",), "makes the arms base and head; give refs or arms, not both"),
    ]
    assert expand({"refs": "main..HEAD"})[1] == [(("refs",), "give a map {git, base, head, arm}, got 'main..HEAD'")]


def test_load_config_reads_the_shorthand_as_two_arms_and_names_its_problems_where_given(tmp_path):
    """The shorthand goes through the one config loader: the run sees the arms base and head, and a
    bad refs key is an error at its file and line, before any other check."""
    import pytest

    from pairbench.stages.runconfig import REPO, ConfigErrors, load_config

    cfg = tmp_path / "pr.yaml"
    cfg.write_text("label: pr\nmodel: tiny\nrefs: {base: main, head: HEAD, arm: {threads: 1}}\n")
    run = load_config([cfg], root=REPO)
    assert run["baseline"] == "base" and list(run["arms"]) == ["base", "head"]
    assert (run["arms"]["head"]["source"], run["arms"]["head"]["threads"]) == ({"git": ".", "ref": "HEAD"}, 1)
    with pytest.raises(ConfigErrors) as exc:
        load_config([cfg], {"refs": {"head": ""}}, root=REPO)
    assert "--config refs: refs.head: the head arm's branch, tag or commit is required" in str(exc.value)
    cfg.write_text("label: pr\nmodel: tiny\narms: {a: {}, b: {}}\nrefs: {base: main, head: HEAD}\n")
    with pytest.raises(ConfigErrors) as exc:
        load_config([cfg], root=REPO)
    assert f"{cfg}:4: refs: makes the arms base and head; give refs or arms, not both" in str(exc.value)
