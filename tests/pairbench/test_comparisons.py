"""pairbench.study.comparisons: how a study comparison's overrides are merged into its base config."""

from pairbench.study.comparisons import merged


def test_overrides_merge_mappings_key_by_key_and_replace_everything_else():
    base = {"seed": 0, "lengths": [400, 480], "rounds": 4,
            "arms": {"baseline": {"source": "a", "env": {"X": "1"}}, "candidate": {"source": "b"}}}
    overrides = {"seed": 1, "lengths": [512], "rounds": {"min": 8, "max": 10},
                 "arms": {"baseline": {"env": {"Y": "2"}}}, "stats": {"alpha": 0.1}}
    out = merged(base, overrides)
    assert out == {"seed": 1, "lengths": [512], "rounds": {"min": 8, "max": 10},
                   "arms": {"baseline": {"source": "a", "env": {"X": "1", "Y": "2"}}, "candidate": {"source": "b"}},
                   "stats": {"alpha": 0.1}}
    # neither input is changed, and the result shares nothing with them
    assert base["arms"]["baseline"]["env"] == {"X": "1"} and base["seed"] == 0
    out["lengths"].append(1)
    out["stats"]["alpha"] = 0.2
    assert overrides["lengths"] == [512] and overrides["stats"] == {"alpha": 0.1}
