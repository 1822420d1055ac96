"""The HTML report (``snakemake --report``) through the same scrubber and leak gate as the bundle.

Snakemake's report is one self-contained HTML file of two kinds of text. Its *template*: the
libraries (React, Vega, Tailwind), styles and app code Snakemake ships, the same for every run of one
Snakemake version. Its *data*: one ``<script id="..."> var name = <JSON>; </script>`` block each for
the results (every file tagged ``report()``, embedded as a base64 ``data:`` URI where a path or a user
name hides from a scan of the page's text), the rules (their code, params, in- and outputs), the
categories, the rule graph, run times and timeline, the packages and the workflow's description.

:func:`scrub` rewrites every string of every data block, and the text of every file embedded in
them, with :func:`pairbench.publish.sanitize.scrub_text` (PNGs lose their text chunks); it leaves the
template alone (the scrubber's path and entropy rules fire on minified library code, and rewriting it
would break the page). :func:`scan` runs the bundle's leak gate (:func:`pairbench.publish.leakgate.scan`:
detect-secrets, the scrubber's detectors, this machine's literal identifiers, the PNG check) over each
data block and each embedded file, and this machine's literal identifiers over the template.
``python -m pairbench html-report <written> --out <publishable>`` runs both and writes the page only
when the gate finds nothing (docs/publishing.md).
"""

from __future__ import annotations

import base64
import binascii
import json
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


#: One data block of the page: ``<script id="results">\n    var results = {...};\n    </script>``.
DATA_BLOCK = re.compile(r'(?P<head><script id="(?P<id>[\w-]+)">\s*var (?P<var>\w+) = )(?P<json>.*?)(?P<tail>;?\s*</script>)',
                        re.S)


def _scrub_text(text: str, identifiers: Mapping[str, Iterable[str]], pseudonyms: MutableMapping[str, str]) -> str:
    """*text* scrubbed, and every file it embeds as a data URI (whose text a scrub of *text* misses)."""
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

    out = sanitize.scrub_text(DATA_URI.sub(embedded, text), identifiers, pseudonyms)
    return re.sub(r"\0(\d+)\0", lambda m: uris[int(m.group(1))], out)


def _scrub_json(value, identifiers, pseudonyms):
    if isinstance(value, str):
        return _scrub_text(value, identifiers, pseudonyms)
    if isinstance(value, list):
        return [_scrub_json(v, identifiers, pseudonyms) for v in value]
    if isinstance(value, dict):
        return {_scrub_text(k, identifiers, pseudonyms): _scrub_json(v, identifiers, pseudonyms) for k, v in value.items()}
    return value


def _data(m: re.Match):
    try:
        return json.loads(m.group("json"))
    except json.JSONDecodeError as exc:
        raise HtmlReportError(f"report.html: the data block {m.group('id')!r} is not JSON ({exc}): not a page "
                              "snakemake --report wrote, or a Snakemake whose page this pairbench does not know") from None


def blocks(html: str) -> list[re.Match]:
    """The page's data blocks; :class:`HtmlReportError` when it has none (not Snakemake's page)."""
    found = list(DATA_BLOCK.finditer(html))
    if not found:
        raise HtmlReportError("report.html: no <script id=...> var ... = {...} data block: not a page snakemake "
                              "--report wrote, or a Snakemake whose page this pairbench does not know")
    return found


def scrub(html: str, identifiers: Mapping[str, Iterable[str]], pseudonyms: MutableMapping[str, str] | None = None) -> str:
    """*html* with every string of its data blocks and every file they embed scrubbed (PNGs stripped
    of text chunks); the template as it was."""
    pseudonyms = {} if pseudonyms is None else pseudonyms
    blocks(html)

    def block(m: re.Match) -> str:
        data = json.dumps(_scrub_json(_data(m), identifiers, pseudonyms)).replace("</", "<\\/")
        return m.group("head") + data + m.group("tail")

    return DATA_BLOCK.sub(block, html)


def parts(html: str) -> list[Part]:
    """The template (data blocks cut out), each data block's JSON (its data URIs cut out) and each
    file embedded in them, decoded."""
    out = [Part("report.html", DATA_BLOCK.sub(lambda m: m.group("head") + m.group("tail"), html), mime="template")]
    for m in blocks(html):
        text = m.group("json")
        out.append(Part(f"report.html#{m.group('id')}.json", DATA_URI.sub("data:", text), mime="application/json"))
        for u in DATA_URI.finditer(text):
            name, data = f"report.html#{m.group('id')}/{_filename(u.group('params'))}", _decode(u)
            if _is_text(u.group("mime")):
                out.append(Part(name, data.decode("utf-8", "replace"), mime=u.group("mime")))
            else:
                out.append(Part(name, None, data, mime=u.group("mime")))
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
    the scrubber's detectors, the literals, the PNG check) in each data block and each file embedded
    in them, laid out as files of a folder so each is scanned exactly as a bundle file is; and every
    literal identifier of this machine in the template."""
    template, *data = parts(html)
    findings = [leakgate.Finding("report.html", m.line, m.detector, m.value)
                for m in sanitize.find(template.text, identifiers) if m.detector.startswith("literal:")]
    with tempfile.TemporaryDirectory(prefix="pairbench-html-report-") as tmp:
        names = {}
        for i, part in enumerate(data):
            rel, data_bytes = _as_file(i, part)
            names[rel] = part.where
            Path(tmp, rel).write_bytes(data_bytes)
        found = leakgate.scan(tmp, identifiers)
    return findings + [leakgate.Finding(names[f.file], f.line, f.detector, f.value) for f in found]


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
    return {"report": str(out), "findings": 0, "blocks": len(blocks(page)),
            "embedded": sum(1 for p in parts(page) if "/" in p.where)}
