"""Arms: what is measured, made ready before anything runs (patch application → build).

- ``source``: a pristine export of the arm's source, patches checked (``git apply --check``) and
  applied, with a sha256 manifest of the tree before and after (:mod:`pairbench.core.trees`).
- ``gitsource``: the export of a git repository at a tag, never touching the user's checkout.
- ``llamacpp_tree``: a tagged llama.cpp repository in the user's cache, made offline from the
  llama-cpp-python sdist's ``vendor/llama.cpp``.
- ``build``: one build path for every engine, run by the recipe its profile renders
  (:meth:`pairbench.engines.profiles.EngineProfile.build_recipe`): a build command or a CMake
  build, a cached model conversion where the engine has one, and the native version string.
- ``cmake``: a CMake build of only the needed targets through ccache, and the toolchain it used.

Every step is run by :func:`pairbench.core.steps.run_step`. Nothing here imports
:mod:`pairbench.engines`: a stage hands the build its recipe.
"""
