"""Fixtures for the recovery tests; the helpers live in _helpers.py."""

from __future__ import annotations

import pytest

from tests.recovery._helpers import make_workdir


@pytest.fixture
def workdir(tmp_path):
    wd = make_workdir(tmp_path / "repo")
    yield wd
    wd.cleanup()


