"""Versioned, schema-checked, atomically written JSON artifacts.

Every pipeline stage writes its results through :func:`write_artifact` and reads its inputs through
:func:`read_artifact`. The contract (see docs/contracts.md and ../shared/DESIGN.md):

- each artifact carries ``"schema": "pairbench.<kind>/v<N>"``;
- it is validated against ``workflow/schemas/<kind>.schema.json`` when written *and* when read;
- it is written with sorted keys to a temporary file in the same folder, then ``os.replace``d, so a
  killed job never leaves half a file that looks complete;
- loaders reject unknown kinds and versions (the pyperf habit).

The version of each kind is its schema file's ``$id`` (``pairbench.plan/v2``): changing an
artifact's shape bumps it there, and this module writes and reads that version only.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"


class ArtifactError(Exception):
    """An artifact is missing, corrupt, of an unknown version, or fails its schema.

    The message always names the file.
    """


def schema_id(kind: str) -> str:
    """The current schema id of *kind*: its schema file's ``$id``."""
    return load_schema(kind)["$id"]


def current_version(kind: str) -> int:
    return parse_schema_id(schema_id(kind))[1]


def parse_schema_id(value: Any) -> tuple[str, int]:
    if not isinstance(value, str) or not value.startswith("pairbench.") or "/v" not in value:
        raise ValueError(f"not a pairbench schema id: {value!r}")
    kind, _, ver = value[len("pairbench."):].rpartition("/v")
    return kind, int(ver)


@functools.lru_cache(maxsize=None)
def load_schema(kind: str) -> dict:
    path = SCHEMA_DIR / f"{kind}.schema.json"
    if not path.exists():
        raise ArtifactError(f"no schema for artifact kind {kind!r} (looked for {path.name})")
    schema = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def validate(kind: str, data: Any, where: str = "<memory>") -> None:
    """Validate *data* against the schema of *kind*; raise ArtifactError naming *where* and the field."""
    validator = jsonschema.Draft202012Validator(load_schema(kind))
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        field = "/".join(str(p) for p in err.absolute_path) or "<root>"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ArtifactError(f"{where}: field {field!r} fails schema {kind}: {err.message}{more}")


def dumps(data: Any) -> str:
    """Canonical JSON text: sorted keys, 2-space indent, trailing newline."""
    return json.dumps(data, sort_keys=True, indent=2, allow_nan=False) + "\n"


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write *text* (UTF-8) to *path* atomically (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode())


def fsync_dir(path: str | os.PathLike) -> None:
    """Make the entries of directory *path* durable (a rename into it, a file made in it): without
    this, a crash soon after ``os.replace`` can leave the old name, or none, on disk even though the
    file's own data was synced. Where a filesystem cannot sync a directory, nothing is done."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # e.g. EINVAL on a filesystem without directory fsync
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write *data* to *path* via a temporary file in the same folder, ``os.replace``, and a sync of
    the folder, so the new name is on disk too."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_artifact(path: str | os.PathLike, kind: str, data: dict) -> str:
    """Stamp *data* with its kind's current schema id, validate it, write it atomically. Returns its sha256."""
    data = dict(data)
    data["schema"] = schema_id(kind)
    validate(kind, data, where=str(path))
    text = dumps(data)
    atomic_write_text(path, text)
    return sha256_bytes(text.encode())


def read_artifact(path: str | os.PathLike, kind: str) -> dict:
    """Read and re-validate an artifact; reject a wrong kind or a version other than the current one."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ArtifactError(f"{path}: artifact is missing") from None
    data, got_kind, got_ver = parse_artifact(text, str(path))
    if got_kind != kind:
        raise ArtifactError(f"{path}: expected a {kind} artifact, found {got_kind}")
    version = current_version(kind)
    if got_ver != version:
        raise ArtifactError(
            f"{path}: unknown version v{got_ver} of {kind} (this pairbench reads {kind} v{version}; "
            "rerun the stage that wrote it, or use the pairbench that wrote it)"
        )
    validate(kind, data, where=str(path))
    return data


def parse_artifact(text: str, where: str) -> tuple[dict, str, int]:
    """``(data, kind, version)`` of an artifact's JSON text; :class:`ArtifactError` naming *where*
    if it is not JSON, not an object, or carries no valid ``schema`` id."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{where}: corrupt artifact, not valid JSON ({exc})") from None
    if not isinstance(data, dict) or "schema" not in data:
        raise ArtifactError(f"{where}: corrupt artifact, no 'schema' field")
    try:
        kind, version = parse_schema_id(data["schema"])
    except ValueError as exc:
        raise ArtifactError(f"{where}: {exc}") from None
    return data, kind, version


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
