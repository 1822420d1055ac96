"""report.html (``snakemake --report``) through the bundle's scrubber and leak gate (issue 38: it was
written outside the gate). The page's own text and every file it embeds as a base64 ``data:`` URI
are scrubbed; the gate scans both; the page is written only when the gate finds nothing."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from pairbench import __main__ as cli
from pairbench.publish import htmlreport, leakgate

from sanitize_support import IDS, png

PATHS = ["/scratch/qx_bob/jobs/4711/build", "/opt/qx_bob/toolchain/bin/g++", "/tmp/qx_bob-tmp/bench.log"]


def uri(mime: str, name: str, data: bytes) -> str:
    return f"data:{mime};charset=utf8;filename={name};base64,{base64.b64encode(data).decode()}"


def page(template_extra: str = "") -> str:
    """A page shaped like Snakemake's: its template (library code, on which the scrubber's path and
    entropy rules would fire) and its data blocks: the results with their embedded files (a CSV naming
    a path, provenance JSON with a digest and a host, a plot whose PNG carries text chunks), the rules'
    code and the workflow's description."""
    digest = hashlib.sha256(b"x").hexdigest()
    csv = f"arm,condition,note\nbaseline,in256-out64,built in {PATHS[0]}\n".encode()
    prov = json.dumps({"sha256": digest, "cxx": PATHS[1], "host": "zq-devbox-07"}).encode()
    plot = png({"Software": "matplotlib", "Author": "zq_alice"})
    results = {name: {"name": name, "caption": "", "data_uri": uri(mime, name, data)} for name, mime, data in
               [("measurements.csv", "text/csv", csv), ("provenance.json", "application/json", prov),
                ("decode_tok_s.png", "image/png", plot)]}
    rules = {"make": {"code": f'<div class="source"><span>shell: tee {PATHS[2]}</span></div>', "n_jobs": 1}}
    desc = "<p>ran on zq-devbox-07 for 12.3 s; GET /v1/completions</p>"

    def block(name: str, var: str, value) -> str:
        return f'    <script id="{name}">\n    var {var} = {json.dumps(value)};\n    </script>\n'

    return ("<!DOCTYPE html>\n<html><head><title>Snakemake Report</title>\n"
            '    <script>var re=/\\\\[a-z]+\\\\x/;var pal="cfe1f2bed8eca8cee58fc1de74b2d75ba3cf4592c63181bd";'
            f'var u="/usr/lib/x";{template_extra}</script>\n'
            + block("workflow-desc", "workflow_desc", desc) + block("results", "results", results)
            + block("rules", "rules", rules) + "</head><body><div id=\"app\"></div></body></html>\n")


def embedded(html: str) -> dict[str, bytes]:
    return {p.where: (p.text.encode() if p.text is not None else p.data) for p in htmlreport.parts(html)}


def test_the_page_and_every_embedded_file_are_scrubbed_and_pass_the_gate(tmp_path):
    src, out = tmp_path / "report.html", tmp_path / "public" / "report.html"
    src.write_text(page())
    raw = embedded(page())
    assert PATHS[0].encode() in raw["report.html#results/measurements.csv"]  # hidden from a scan of the page's text
    assert PATHS[0] not in page()
    result = htmlreport.publish(src, out, IDS)
    assert result == {"report": str(out), "findings": 0, "blocks": 3, "embedded": 3}
    clean = out.read_text()
    parts = embedded(clean)
    for where, data in parts.items():
        for secret in (b"qx_bob", b"zq-devbox-07", b"zq_alice"):
            assert secret not in data, (where, secret)
    assert "shell: tee <path>" in clean and "GET /v1/completions" in clean and "ran on host-1 " in clean
    assert b"built in <path>" in parts["report.html#results/measurements.csv"]
    prov = json.loads(parts["report.html#results/provenance.json"])
    assert prov["sha256"] == hashlib.sha256(b"x").hexdigest() and prov["cxx"] == "<path>"  # a digest stays
    assert leakgate.png_text_chunks(parts["report.html#results/decode_tok_s.png"]) == []
    template = page().split('<script id="workflow-desc">')[0]
    assert clean.startswith(template)  # Snakemake's own code is left whole: rewriting it breaks the page
    assert htmlreport.scan(clean, IDS) == []


def test_what_bypasses_the_scrubber_fails_the_gate_and_nothing_is_written(tmp_path, monkeypatch):
    src, out = tmp_path / "report.html", tmp_path / "public.html"
    src.write_text(page())
    monkeypatch.setattr(htmlreport, "scrub", lambda html, ids: html)  # a scrubber that missed everything
    with pytest.raises(htmlreport.HtmlReportError, match="nothing written") as err:
        htmlreport.publish(src, out, IDS)
    assert not out.exists()
    found = {str(f) for f in htmlreport.scan(page(), IDS)}
    assert {"report.html#workflow-desc.json:1: literal:hostname", "report.html#rules.json:1: abs-path",
            "report.html#results/measurements.csv:2: abs-path", "report.html#results/provenance.json:1: abs-path",
            "report.html#results/provenance.json:1: literal:hostname",
            "report.html#results/decode_tok_s.png:0: png-metadata"} <= found, found
    assert not any(f.startswith("report.html:") for f in found)  # the template's code is no finding
    assert "report.html#results/measurements.csv:2: abs-path" in str(err.value) and "qx_bob" not in str(err.value)


def test_an_identifier_of_this_machine_in_the_template_fails_the_gate(tmp_path):
    """The template is Snakemake's code, left unscrubbed; a literal of this machine found there is
    still a finding (a page that is not what Snakemake wrote, or one that put data outside its blocks)."""
    src = tmp_path / "report.html"
    src.write_text(page(template_extra='var who="zq_alice";'))
    with pytest.raises(htmlreport.HtmlReportError, match=r"report.html:3: literal:username"):
        htmlreport.publish(src, tmp_path / "out.html", IDS)


def test_a_page_without_data_blocks_is_refused(tmp_path):
    src = tmp_path / "report.html"
    src.write_text("<html><body>not snakemake's</body></html>\n")
    with pytest.raises(htmlreport.HtmlReportError, match="no <script id=...> var"):
        htmlreport.publish(src, tmp_path / "out.html", IDS)
    assert not (tmp_path / "out.html").exists()


def test_a_broken_embedded_file_is_named(tmp_path):
    src = tmp_path / "report.html"
    src.write_text('<script id="results">\nvar results = {"p": "' + uri("image/png", "p.png", b"GIF89a, not a PNG")
                   + '"};\n</script>\n')
    with pytest.raises(htmlreport.HtmlReportError, match="embedded p.png: not a PNG file"):
        htmlreport.publish(src, tmp_path / "out.html", IDS)


def test_the_command_writes_a_clean_page_and_refuses_a_leaking_one(tmp_path, capsys, monkeypatch):
    src, out = tmp_path / "report.html", tmp_path / "public.html"
    src.write_text(page())
    assert cli.main(["html-report", str(src), "--out", str(out)]) == 0
    assert "qx_bob" not in out.read_text() and "OK:" in capsys.readouterr().out
    monkeypatch.setattr(htmlreport, "scrub", lambda html, ids: html)
    out.unlink()
    assert cli.main(["html-report", str(src), "--out", str(out)]) == 1
    assert not out.exists() and "abs-path" in capsys.readouterr().err


SNAKEFILE = """
rule all:
    input: report("out.txt", caption="cap.rst", category="x"), report("data.json", category="x")
rule make:
    output: "out.txt", "data.json"
    shell: "echo 'built in PATH0' > {output[0]}; echo '{{\\"p\\": \\"PATH1\\"}}' > {output[1]}"
"""


@pytest.mark.skipif(shutil.which("snakemake") is None, reason="snakemake is not on PATH")
def test_a_real_snakemake_report_is_scrubbed_and_gated_without_false_findings(tmp_path):
    """Snakemake's own page (its scripts, styles and fonts) passes the gate once scrubbed; the paths a
    rule's shell command, a caption and the embedded outputs carried are gone."""
    (tmp_path / "Snakefile").write_text(SNAKEFILE.replace("PATH0", PATHS[0]).replace("PATH1", PATHS[1]))
    (tmp_path / "cap.rst").write_text(f"A caption naming {PATHS[2]}\n")
    for args in (["--cores", "1", "--quiet"], ["--report", "report.html"]):
        subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=tmp_path, check=True, capture_output=True)
    src = (tmp_path / "report.html").read_text()
    assert any("qx_bob" in (p.text or "") for p in htmlreport.parts(src))  # the report carries them
    htmlreport.publish(tmp_path / "report.html", tmp_path / "public.html", IDS)
    clean = (tmp_path / "public.html").read_text()
    assert all("qx_bob" not in (p.text or "") for p in htmlreport.parts(clean))
    assert clean.split('<script id="workflow-desc">')[0] == src.split('<script id="workflow-desc">')[0]
