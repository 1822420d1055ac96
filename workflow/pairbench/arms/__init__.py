"""Arms: what is measured, made ready before anything runs (patch application → build).

- ``source``: a pristine export of the arm's source, patches checked (``git apply --check``) and
  applied, with a sha256 manifest of the tree before and after.
- ``gitsource``: the export of a git repository at a tag, never touching the user's checkout.
- ``llamacpp_tree``: a tagged llama.cpp repository in the user's cache, made offline from the
  llama-cpp-python sdist's ``vendor/llama.cpp``.
- ``build``: the embedded engine's byte-compile and cached model conversion, or an external arm's
  build command (its profile's, or the arm's own), and the native version string.
"""
