"""``python -m fake_serve``: the fake server (fake_serve.openai_compat)."""

import sys

from fake_serve.openai_compat import main

sys.exit(main())
