"""The model a run names (config ``model``): a named model, a GGUF file or a Hugging Face model
directory, the files a build depends on, and the model's trained context.

Named models are picked by explicit name, never by sniffing a path string. Which engines read which
kind is their profiles' to say (``model_formats``: :func:`pairbench.engines.policy.check_engines`).
"""

from __future__ import annotations

import json
from pathlib import Path

from pairbench.core import ggufheader
from pairbench.core.configsource import ConfigError

# The models a config may name. "tiny" is the embedded engine's deterministic random-weight test
# model; its context is the engine's (engine/weights.py NAMED_MODELS["tiny"].context_length, which
# tests/pairbench/test_config.py checks this against): the one table of named contexts here.
MODEL_FILES = {"smollm2-135m": "resources/SmolLM2-135M-Instruct.Q4_1.gguf"}
NAMED_CONTEXT = {"tiny": 8192}


def resolve_model(model: str, root: Path) -> dict:
    """``{"name", "kind": "named"|"gguf"|"hf", "path"}`` for a config ``model`` value: a named model,
    a .gguf file (``gguf``), or a directory holding ``config.json``, a local Hugging Face model
    (``hf``: its tokenizer files and ``*.safetensors`` beside it)."""
    root = Path(root)
    if model in NAMED_CONTEXT:
        return {"name": model, "kind": "named", "path": None}
    if model in MODEL_FILES:
        return {"name": model, "kind": "gguf", "path": str(root / MODEL_FILES[model])}
    path = Path(model).expanduser()
    if not path.is_absolute():
        path = root / path
    if path.suffix == ".gguf":
        return {"name": path.stem, "kind": "gguf", "path": str(path)}
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError("model", f"directory {model} has no config.json (a Hugging Face model directory holds "
                              "config.json, the tokenizer files and *.safetensors)")
        return {"name": path.name, "kind": "hf", "path": str(path)}
    hub = (f"; if it is a Hugging Face model id, pairbench does not download it: fetch it into a folder first "
           f"(huggingface-cli download {model} --local-dir resources/{Path(model).name}) and give that folder"
           if model.count("/") == 1 else "")
    raise ConfigError("model", f"{model!r} is neither a known model ({', '.join(sorted([*NAMED_CONTEXT, *MODEL_FILES]))}), "
                      f"nor a path to a .gguf file, nor a Hugging Face model directory (a folder with config.json){hub}")


def model_files(info: dict) -> list[str]:
    """The files a build depends on for the model *info* (:func:`resolve_model`): the GGUF file,
    or every file of a Hugging Face directory (hidden ones, such as a download's cache, left out)."""
    if info["kind"] == "gguf":
        return [info["path"]]
    if info["kind"] == "hf":
        root = Path(info["path"])
        return sorted(str(p) for p in root.rglob("*")
                      if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    return []


def gguf_context(path: str | Path) -> int:
    """The trained context length from a GGUF file's header (:mod:`pairbench.core.ggufheader`)."""
    try:
        return ggufheader.context_length(path)
    except ggufheader.GGUFError as exc:
        raise ConfigError("model", str(exc)) from None


def hf_context(directory: str | Path) -> int:
    """The trained context length a Hugging Face model directory's ``config.json`` states."""
    path = Path(directory) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError("model", f"{path} is not valid JSON ({exc})") from None
    cfg = {**cfg.get("text_config", {}), **cfg} if isinstance(cfg.get("text_config"), dict) else cfg
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(cfg.get(key), int):
            return cfg[key]
    raise ConfigError("model", f"{path} states no context length (max_position_embeddings)")


def model_context(model: str, root: Path) -> int:
    """The trained context of the config's *model*."""
    info = resolve_model(model, root)
    if info["kind"] == "named":
        return NAMED_CONTEXT[info["name"]]
    if info["kind"] == "hf":
        return hf_context(info["path"])
    path = Path(info["path"])
    if not path.is_file():
        hint = " (run ./install.sh)" if model in MODEL_FILES else ""
        raise ConfigError("model", f"file {path} does not exist{hint}")
    return gguf_context(path)
