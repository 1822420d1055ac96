"""The leak gate: scan a finished bundle and fail closed on any finding.

Three kinds of detector run over every file of the bundle:

1. detect-secrets, through its Python API (``SecretsCollection`` under ``default_settings()``: every
   bundled plugin with its default filters), one file at a time in this process;
2. pairbench's own detectors (:data:`pairbench.publish.sanitize.DETECTORS`): home paths, UNC paths, Windows
   machine names, e-mails, IPv4/IPv6, MACs, GPU UUIDs, PCI bus ids, credential values and token
   formats;
3. the literal identifiers of this machine (:func:`pairbench.publish.envfacts.identifiers`), one detector per
   category (``literal:username``, ``literal:hostname``, ...). Binary files (plots) are searched for
   the literals as bytes, and PNGs must carry no text metadata chunks.

They are not equally independent of the scrubber that prepared the bundle: (2) and (3) are the rules
it rewrote with, so over its output they only show that nothing bypassed it. The report line
(:func:`report_line`) therefore counts them by family (:data:`FAMILIES`) instead of adding them up.

Hash policy: detect-secrets' "Hex High Entropy String" plugin fires on sha256 digests, which our
JSON is full of (``"sha256": ...``, ``"prompt_sha256": ...``, ``"inputs": {"plan": ...}``). In a
``.json`` or ``.yaml`` file, a hit is accepted as a digest only when the value is exactly 64 lowercase hex digits
*every* occurrence of it in the file is a whole JSON string (``"<hex>"``, as a field value or an
array item), never part of a longer string. Anything else is a finding. Literal secrets are still matched exactly by the literal
detectors, so a known secret cannot hide in a digest field.

Git object ids (40 lowercase hex digits: the commit and tree a git arm measured, in ``gate.json``;
a ref given as a commit sha, as a CI job gives it, in ``gate.json`` and ``config.resolved.yaml``)
fire the same plugin. One is accepted only where every occurrence of it in a ``.json`` file, or a
``.yaml`` file written with every string quoted (the bundle's), is the whole value of a field named
``commit``, ``tree``, ``tag_object`` or ``ref`` (:data:`GIT_ID_FIELDS`; a ``ref`` was resolved by git
to a commit before anything ran), or of a ``version`` field where the file has it as a ``commit``
too (a git arm's version is its ref), never an array item or part of a longer string: a 40-hex
credential in any other field is still a finding.
"""

from __future__ import annotations

import re
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from pairbench.publish import sanitize

TEXT_SUFFIXES = {".md", ".csv", ".json", ".patch", ".diff", ".yaml", ".yml", ".py", ".txt", ".toml", ".cfg"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Ancillary PNG chunks that carry free text or camera/host metadata.
PNG_TEXT_CHUNKS = {b"tEXt", b"zTXt", b"iTXt", b"eXIf", b"tIME"}



@dataclass(frozen=True)
class Finding:
    """One leak: the file (relative to the bundle), the 1-based line (0 for binary files), the detector.

    ``value`` is what matched; it is private and only ever written under ``private/``.
    """

    file: str
    line: int
    detector: str
    value: str = field(default="", repr=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.detector}"

    def public_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "detector": self.detector}

    def private_dict(self) -> dict:
        return asdict(self)


def _detect_secrets_plugins() -> list[str]:
    from detect_secrets.settings import default_settings

    with default_settings() as settings:
        return sorted(settings.plugins)


#: Checks of a file's form rather than its text: PNG text chunks, symlinks, text that is not UTF-8.
FILE_CHECKS = ("png-metadata", "symlink", "not-utf8")

#: The detector families of the report line, in its order:
#:
#: - ``independent``: detect-secrets' plugins, written by others and never used to scrub, so a
#:   clean result from them is evidence the scrubber did not produce itself;
#: - ``pattern``: pairbench's own rules (:data:`pairbench.publish.sanitize.DETECTORS`), the very
#:   rules the scrubber rewrote every match of, re-run over its output: they catch text that
#:   bypassed the scrub, not what the rules themselves miss;
#: - ``literal``: this machine's identifiers, one detector per category (``literal:hostname``);
#:   the scrubber replaced these too, so over scrubbed text they are the same kind of re-check;
#: - ``file``: :data:`FILE_CHECKS`.
FAMILIES = ("independent", "pattern", "literal", "file")


def detector_names(identifiers: Mapping[str, Iterable[str]]) -> list[str]:
    """Every detector the gate runs with these identifiers (:func:`families` groups them)."""
    names = [f"detect-secrets:{p}" for p in _detect_secrets_plugins()]
    names += list(sanitize.DETECTOR_NAMES)
    names += sorted({f"literal:{c}" for c, _ in sanitize.usable_literals(identifiers)})
    names += list(FILE_CHECKS)
    return names


def family_of(name: str) -> str:
    """The family (:data:`FAMILIES`) of the detector called *name*; ValueError naming it if none."""
    if not isinstance(name, str):
        raise ValueError(f"a detector name must be a str, got {name!r}")
    if name.startswith("detect-secrets:"):
        return "independent"
    if name.startswith("literal:"):
        return "literal"
    if name in sanitize.DETECTOR_NAMES:
        return "pattern"
    if name in FILE_CHECKS:
        return "file"
    raise ValueError(f"unknown leak-gate detector {name!r} (not detect-secrets:*, literal:*, a pattern rule "
                     f"of pairbench.publish.sanitize or one of {', '.join(FILE_CHECKS)})")


def families(detectors: Iterable[str]) -> dict[str, int]:
    """How many distinct detectors of each family (:data:`FAMILIES`, every family present)."""
    counts = dict.fromkeys(FAMILIES, 0)
    for name in set(detectors):
        counts[family_of(name)] += 1
    return counts


def _is_digest_only(text: str, value: str) -> bool:
    """Whether *value* is a sha256 digest standing as a whole JSON string everywhere it occurs."""
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        return False
    starts = [m.start() for m in re.finditer(re.escape(value), text)]
    return bool(starts) and all(
        i > 0 and text[i - 1] == '"' and text[i + 64:i + 65] == '"' for i in starts
    )


GIT_ID_FIELDS = ("commit", "tree", "tag_object", "ref")


def _is_git_id_only(text: str, value: str) -> bool:
    """Whether *value* is a git object id standing as the whole value of a :data:`GIT_ID_FIELDS`
    field everywhere it occurs; or of a ``version`` field where the same file has it as a ``commit``
    (a git arm's version is its ref: a sha ref's is that commit)."""
    if not re.fullmatch(r"[0-9a-f]{40}", value):
        return False
    total = len(re.findall(re.escape(value), text))
    fields = "|".join(GIT_ID_FIELDS)
    as_field = len(re.findall(rf'"(?:{fields})":\s*"{value}"', text))
    if re.search(rf'"commit":\s*"{value}"', text):
        as_field += len(re.findall(rf'"version":\s*"{value}"', text))
    return total > 0 and as_field == total


def _scan_detect_secrets(root: Path, rel_paths: list[str]) -> list[Finding]:
    from detect_secrets import SecretsCollection
    from detect_secrets.settings import default_settings

    findings: list[Finding] = []
    with default_settings():
        secrets = SecretsCollection(root=str(root))
        for rel in rel_paths:
            secrets.scan_file(rel)  # in-process: no multiprocessing pool inside a Snakemake job
        for filename, secret in secrets:
            value = secret.secret_value or ""
            if secret.type == "Hex High Entropy String" and filename.endswith((".json", ".yaml", ".yml")):
                text = (root / filename).read_text(errors="replace")
                if _is_digest_only(text, value) or _is_git_id_only(text, value):
                    continue
            findings.append(Finding(Path(filename).as_posix(), secret.line_number, f"detect-secrets:{secret.type}", value))
    return findings


def png_text_chunks(data: bytes) -> list[str]:
    """Names of text/metadata chunks in a PNG (empty for a clean one); raises ValueError if not a PNG."""
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG file")
    found = []
    pos = len(PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos:pos + 8])
        if ctype in PNG_TEXT_CHUNKS:
            found.append(ctype.decode("ascii"))
        pos += 12 + length
        if ctype == b"IEND":
            break
    return found


def strip_png_metadata(data: bytes) -> bytes:
    """The PNG with its text/metadata chunks removed (matplotlib writes Software and more)."""
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG file")
    out = [PNG_SIGNATURE]
    pos = len(PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos:pos + 12 + length]
        if len(chunk) != 12 + length:
            raise ValueError("truncated PNG chunk")
        if ctype not in PNG_TEXT_CHUNKS:
            out.append(chunk)
        pos += 12 + length
        if ctype == b"IEND":
            break
    return b"".join(out)


def _scan_binary(rel: str, data: bytes, identifiers: Mapping[str, Iterable[str]]) -> list[Finding]:
    findings = []
    if rel.lower().endswith(".png"):
        try:
            chunks = png_text_chunks(data)
        except ValueError as exc:
            return [Finding(rel, 0, "png-metadata", str(exc))]
        findings += [Finding(rel, 0, "png-metadata", c) for c in chunks]
    for category, value in sanitize.usable_literals(identifiers):
        if len(value) >= 4 and value.encode() in data:  # short literals occur by chance in binary data
            findings.append(Finding(rel, 0, f"literal:{category}", value))
    return findings


def bundle_files(bundle_dir: str | Path) -> list[str]:
    root = Path(bundle_dir)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink())


def scan(bundle_dir: str | Path, identifiers: Mapping[str, Iterable[str]]) -> list[Finding]:
    """Every finding in every file under *bundle_dir*, sorted by file, line and detector."""
    root = Path(bundle_dir)
    rels = bundle_files(root)
    findings: list[Finding] = []
    text_rels = []
    for rel in rels:
        path = root / rel
        if path.is_symlink():
            findings.append(Finding(rel, 0, "symlink", str(path.readlink())))
            continue
        data = path.read_bytes()
        if Path(rel).suffix.lower() in TEXT_SUFFIXES:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                findings.append(Finding(rel, 0, "not-utf8", ""))
                continue
            text_rels.append(rel)
            findings += [Finding(rel, m.line, m.detector, m.value) for m in sanitize.find(text, identifiers)]
        else:
            findings += _scan_binary(rel, data, identifiers)
    findings += _scan_detect_secrets(root, text_rels)
    return sorted(set(findings), key=lambda f: (f.file, f.line, f.detector, f.value))


def result(bundle_dir: str | Path, identifiers: Mapping[str, Iterable[str]]) -> dict:
    """The full gate result (private: it holds the matched values): detectors, files, findings."""
    findings = scan(bundle_dir, identifiers)
    files = bundle_files(bundle_dir)
    detectors = detector_names(identifiers)
    return {
        "detectors": detectors,
        "files": files,
        "findings": [f.private_dict() for f in findings],
        "families": families(detectors),
        "report_line": report_line(len(findings), detectors, len(files)),
    }


def report_line(findings: int, detectors: Iterable[str], files: int) -> str:
    """The report's leak-gate line, counting *detectors* (their names) by family, so the scrubber's
    own rules re-run over its output are not added to the independent scanner as if they were
    more evidence. For example: "0 findings by detect-secrets (27 plugins, independent of the
    scrubber), by the scrubber's own 16 pattern rules and this machine's literal identifiers (2
    categories) re-run over its output, and by 3 file checks (PNG metadata, symlinks, UTF-8), over
    12 files"."""
    if isinstance(detectors, (int, str)):
        raise TypeError(f"report_line takes the detector names (leakgate.detector_names), got {detectors!r}")
    c = families(detectors)
    return (f"{findings} findings by detect-secrets ({c['independent']} plugins, independent of the scrubber), "
            f"by the scrubber's own {c['pattern']} pattern rules and this machine's literal identifiers "
            f"({c['literal']} categories) re-run over its output, and by {c['file']} file checks "
            f"(PNG metadata, symlinks, UTF-8), over {files} files")


def format_findings(findings: list[Finding], limit: int = 20) -> str:
    lines = [str(f) for f in findings[:limit]]
    if len(findings) > limit:
        lines.append(f"... and {len(findings) - limit} more")
    return "\n".join(lines)
