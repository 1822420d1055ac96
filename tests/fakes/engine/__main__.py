"""``python -m engine``: the fake engine's command line (see server.py)."""
import sys

from .server import main

sys.exit(main())
