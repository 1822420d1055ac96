"""The test engine fake-serve: the fake OpenAI-compatible server as a package (tests/fakes/fake_serve),
in a git repository with a tag, the way a Python engine's arms take it (``source: {git, tag}``).

Its profile is tests/engines/profiles/fake-serve.yaml (installed into an arm's own environment from
the arm's tree); tests/engines/fake_serve_slower.patch makes the candidate answer ``b + a`` instead
of ``a + b``, at 25 ms a token, as version 1.1.0.
"""

import shutil
from pathlib import Path

from .test_gitsource import git

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "fakes" / "fake_serve"
PROFILES = HERE / "profiles"
PATCH = HERE / "fake_serve_slower.patch"
TAG = "v1.0.0"


def make_repo(dest: Path) -> Path:
    """A git repository holding the fake-serve package at tag v1.0.0 (then one later commit, which
    no arm may run)."""
    shutil.copytree(PACKAGE, dest, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", ".")
    git(dest, "commit", "-q", "-m", "fake-serve 1.0.0")
    git(dest, "tag", TAG)
    (dest / "fake_serve" / "__init__.py").write_text('"""after the tag"""\n\n__version__ = "9.9.9"\n')
    git(dest, "commit", "-q", "-am", "after the tag")
    return dest
