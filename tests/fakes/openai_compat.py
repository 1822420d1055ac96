"""The fake OpenAI-compatible server, run from its package's tree without installing it.

The fake lives in an installable package (``tests/fakes/fake_serve/``: ``fake_serve.openai_compat``)
so that a test can install it from a patched git tag into an arm's own environment
(``tests/engines/test_python_install.py``). Configs and tests that launch it as a script use this
file: ``python tests/fakes/openai_compat.py --flavor vllm serve MODEL --port 8000``; tests import
its helpers from here (``from tests.fakes.openai_compat import render``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "fake_serve"))

from fake_serve.openai_compat import *  # noqa: E402,F401,F403 (encode, render, main, ...)
from fake_serve.openai_compat import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
