"""Run the fake engine directly: ``python tests/fakes/fake_engine.py serve --port 8123 [--prompt-extra 1 ...]``.

The fake itself is the package ``tests/fakes/engine`` (so a pipeline arm can use it as its source,
exactly like the real engine/); see its server.py for the misbehaviour switches.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.server import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
