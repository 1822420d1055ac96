"""The HTML report (``snakemake --report``) through the same scrubber and leak gate as the bundle.

Snakemake's report is one self-contained HTML file: its own text (the rules' code and params, the
config files, run times), and every file tagged ``report()`` (tables, plots, provenance and audit
JSON) embedded as a base64 ``data:`` URI, where a path or a user name would hide from a scan of the
page's text. :func:`scrub` rewrites the page's text and the text of every embedded file with
:func:`pairbench.publish.sanitize.scrub_text` (PNGs lose their text chunks), and :func:`scan`
runs the bundle's own leak gate (:func:`pairbench.publish.leakgate.scan`: detect-secrets, the
scrubber's detectors, this machine's literal identifiers, the PNG check) over the page's text and
each embedded file. ``python -m
pairbench html-report <written> --out <publishable>`` runs both and writes the page only when the
gate finds nothing (docs/publishing.md).
"""

from __future__ import annotations

import base64
import binascii
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, MutableMapping

from pairbench.core.artifacts import atomic_write_text
from pairbench.publish import leakgate, sanitize

#: A base64 data URI as Snakemake writes it: ``data:<mime>;charset=<enc>;filename=<name>;base64,<data>``
DATA_URI = re.compile(r"data:(?P<mime>[\w.+/-]+)(?P<params>(?:;[\w-]+=[^;,\"'\s]*)*);base64,(?P<data>[A-Za-z0-9+/=]+)")
_TEXT_MIMES = ("text/", "application/json", "application/yaml", "application/x-yaml", "image/svg+xml",
               "application/javascript")


class HtmlReportError(Exception):
    """The page cannot be published: the gate found something (or an embedded file is broken)."""


@dataclass(frozen=True)
class Part:
    """One searchable part of the page: ``where`` names it (``report.html`` or the embedded file)."""

    where: str
    text: str | None  # None: binary
    data: bytes = b""
    mime: str = "text/html"


def _is_text(mime: str) -> bool:
    return mime.startswith(_TEXT_MIMES)


def _filename(params: str) -> str:
    m = re.search(r";filename=([^;]*)", params)
    return m.group(1) if m else "embedded"


def _decode(m: re.Match) -> bytes:
    try:
        return base64.b64decode(m.group("data"), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HtmlReportError(f"report.html: an embedded {m.group('mime')} file is not base64: {exc}") from None


def scrub(html: str, identifiers: Mapping[str, Iterable[str]], pseudonyms: MutableMapping[str, str] | None = None) -> str:
    """*html* with its text and every embedded file's text scrubbed, PNGs stripped of text chunks."""
    pseudonyms = {} if pseudonyms is None else pseudonyms
    uris: list[str] = []

    def embedded(m: re.Match) -> str:
        mime, params, data = m.group("mime"), m.group("params"), _decode(m)
        params = sanitize.scrub_text(params, identifiers, pseudonyms)
        if _is_text(mime):
            data = sanitize.scrub_text(data.decode("utf-8", "replace"), identifiers, pseudonyms).encode()
        elif mime == "image/png":
            try:
                data = leakgate.strip_png_metadata(data)
            except ValueError as exc:
                raise HtmlReportError(f"report.html: embedded {_filename(params)}: {exc}") from None
        uris.append(f"data:{mime}{params};base64,{base64.b64encode(data).decode()}")
        return f"\0{len(uris) - 1}\0"

    page = sanitize.scrub_text(DATA_URI.sub(embedded, html), identifiers, pseudonyms)
    return re.sub(r"\0(\d+)\0", lambda m: uris[int(m.group(1))], page)


def parts(html: str) -> list[Part]:
    """The page's own text (data URIs cut out) and each embedded file, decoded."""
    out = [Part("report.html", DATA_URI.sub("data:", html))]
    for m in DATA_URI.finditer(html):
        name, data = f"report.html#{_filename(m.group('params'))}", _decode(m)
        if _is_text(m.group("mime")):
            out.append(Part(name, data.decode("utf-8", "replace"), mime=m.group("mime")))
        else:
            out.append(Part(name, None, data, mime=m.group("mime")))
    return out


def _as_file(i: int, part: Part) -> tuple[str, bytes]:
    """The file name and bytes *part* is scanned as: text under its own suffix where the gate knows
    it (a JSON file's digests are judged as in a bundle), else ``.txt``; a PNG as ``.png`` (its text
    chunks are findings) whatever its name; other binary data as bytes."""
    if part.text is not None:
        suffix = Path(part.where).suffix.lower()
        return f"{i:04d}{suffix if suffix in leakgate.TEXT_SUFFIXES else '.txt'}", part.text.encode()
    return f"{i:04d}{'.png' if part.mime == 'image/png' else '.bin'}", part.data


def scan(html: str, identifiers: Mapping[str, Iterable[str]]) -> list[leakgate.Finding]:
    """Every finding of the bundle's leak gate (:func:`pairbench.publish.leakgate.scan`: detect-secrets,
    the scrubber's detectors, the literals, the PNG check) in the page and in each embedded file: the
    parts are laid out as files of a folder, so each is scanned exactly as a bundle file is."""
    with tempfile.TemporaryDirectory(prefix="pairbench-html-report-") as tmp:
        names = {}
        for i, part in enumerate(parts(html)):
            rel, data = _as_file(i, part)
            names[rel] = part.where
            Path(tmp, rel).write_bytes(data)
        found = leakgate.scan(tmp, identifiers)
    return [leakgate.Finding(names[f.file], f.line, f.detector, f.value) for f in found]


def publish(src: str | Path, out: str | Path, identifiers: Mapping[str, Iterable[str]]) -> dict:
    """Scrub the report at *src*, gate it, and write it to *out* only if the gate found nothing;
    :class:`HtmlReportError` naming each finding (file, line, detector; never the value) otherwise,
    and nothing written."""
    page = scrub(Path(src).read_text(encoding="utf-8"), identifiers)
    findings = scan(page, identifiers)
    if findings:
        raise HtmlReportError(f"leak gate: {len(findings)} finding(s) in {src} after scrubbing; nothing written:\n"
                              + leakgate.format_findings(findings))
    atomic_write_text(out, page)
    return {"report": str(out), "findings": 0, "embedded": len(parts(page)) - 1}
