"""pairbench's fake OpenAI-compatible server, as a package (``fake-serve``, ``python -m fake_serve``)."""

__version__ = "1.0.0"
