"""Shared helpers for the sanitize/publish/verify tests: the planted identity and a planted run.

Everything here is synthetic and comes from tests/data/sanitize/ (identity.json, nvidia-smi output,
server log, model output, patches, a clean source tree). Nothing reads this machine's identity: the
fact collectors get planted environment, command output, interface table and host-name functions.
"""

from __future__ import annotations

import functools
import json
import shutil
import struct
import zlib
from pathlib import Path
from types import SimpleNamespace

from pairbench.core import artifacts
from pairbench.publish import envfacts
from pairbench.publish import bundle as publish

DATA = Path(__file__).resolve().parent.parent / "data" / "sanitize"
REAL_SCHEMAS = artifacts.SCHEMA_DIR


def identity() -> dict:
    return json.loads((DATA / "identity.json").read_text())


def planted_runner(ident: dict):
    query = (DATA / "nvidia-smi-query.csv").read_text()
    banner = (DATA / "nvidia-smi.txt").read_text()

    def run(argv):
        argv = tuple(argv)
        if argv == envfacts.NVIDIA_QUERY:
            return query
        if argv == ("nvidia-smi",):
            return banner
        if argv[:3] == ("git", "config", "--get"):
            return ident["git"].get(argv[3], "") + "\n"
        return None

    return run


def planted_if_addrs(ident: dict) -> dict:
    return {name: [SimpleNamespace(address=a) for a in addrs] for name, addrs in ident["if_addrs"].items()}


def planted_facts(engine_version: str = "pairbench-engine 0.1.0 (built by zq_alice@zq-devbox-07)") -> dict:
    ident = identity()
    return envfacts.collect(
        environ=ident["environ"],
        run=planted_runner(ident),
        if_addrs=planted_if_addrs(ident),
        engine_version=engine_version,
        torch=False,
        gethostname=lambda: ident["hostname"],
        getfqdn=lambda: ident["fqdn"],
    )


def planted_strings() -> list[str]:
    """Every planted identifier, as it was planted (for 'none reaches the bundle' assertions)."""
    ident = identity()
    out = [ident["hostname"], ident["fqdn"], *ident["git"].values(), *ident["also_planted"]]
    out += [v for k, v in ident["environ"].items() if k not in ("PATH", "LANG")]
    out += ["zq-fileserver", "benchshare", "corp.zqexample.net", "bo.zq"]
    return out


def use_test_schemas(monkeypatch, tmp_path: Path) -> Path:
    """Point the artifact layer at the real schemas plus the test-only ones (verdicts)."""
    d = tmp_path / "schemas"
    shutil.copytree(REAL_SCHEMAS, d)
    for p in (DATA / "schemas").glob("*.json"):
        shutil.copy(p, d / p.name)
    monkeypatch.setattr(artifacts, "SCHEMA_DIR", d)
    # a fresh cache for the test, so the session-wide one never holds the test-only schemas
    monkeypatch.setattr(artifacts, "load_schema", functools.lru_cache(maxsize=None)(artifacts.load_schema.__wrapped__))
    return d


def png(text_chunks: dict[str, str] | None = None, extra: dict[bytes, bytes] | None = None) -> bytes:
    """A 1x1 RGB PNG, optionally with tEXt chunks (as matplotlib writes 'Software', 'Author') and
    other ancillary chunks (*extra*: type -> raw data), which the scrubber cannot rewrite."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
    for k, v in (text_chunks or {}).items():
        out += chunk(b"tEXt", k.encode() + b"\x00" + v.encode())
    for k, v in (extra or {}).items():
        out += chunk(k, v)
    out += chunk(b"IDAT", zlib.compress(b"\x00\x00\x00\x00")) + chunk(b"IEND", b"")
    return out


def planted_run(tmp_path: Path, facts: dict) -> dict:
    """The inputs the pipeline would hand to build_bundle, with identifiers planted everywhere."""
    run = tmp_path / "run"
    run.mkdir()
    env = artifacts.write_artifact(run / "environment.json", "environment", envfacts.public(facts))
    assert env
    fixtures = publish.fixture_manifest([
        {"condition": "in256-out64", "prompt_tokens": 256,
         "messages": [{"role": "system", "content": "You are a terse assistant."},
                      {"role": "user", "content": "Summarise the frozen paragraph about river deltas."}],
         "text": "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n"},
    ])
    artifacts.write_artifact(run / "fixtures.json", "fixture_manifest", fixtures)
    (run / "plot.png").write_bytes(png({"Software": "matplotlib", "Author": "zq_alice on zq-devbox-07"}))
    files = {
        "README.md": str(DATA / "README.md"),
        "config.resolved.yaml": DATA / "config.resolved.yaml",
        "tables/measurements.csv": str(DATA / "tables" / "measurements.csv"),
        "tables/verdicts.json": str(DATA / "tables" / "verdicts.json"),
        "environment.json": str(run / "environment.json"),
        "fixtures.json": str(run / "fixtures.json"),
        "plots/decode_tok_s.png": str(run / "plot.png"),
        "scripts/replot.py": str(DATA / "scripts" / "replot.py"),
        # private material the pipeline might hand over by mistake: never copied
        "logs/server.log": str(DATA / "server.log"),
        "outputs/r01-candidate-in256-out64.json": str(DATA / "model_output.json"),
    }
    return {
        "files": files,
        "patches": {"0001-int8-path": DATA / "0001-int8-path.patch",
                    "0002-version-tag.patch": DATA / "0002-version-tag.patch"},
        "patched_files": json.loads((DATA / "patched_files.json").read_text()),
        "clean_source": DATA / "clean_source",
        "patch_roots": ["/home/zq_alice/pb/src"],
    }


# Identifiers for the detector unit tests (a subset of the planted identity).
IDS = {
    "username": ["zq_alice"],
    "hostname": ["zq-devbox-07"],
    "domain": ["corp.zqexample.net"],
    "home": ["/home/zq_alice"],
    "email": ["zq.alice@corp.zqexample.net"],
    "secret": ["zqk_live_9f8e7d6c5b4a39281706f5e4d3c2b1a0"],
}

# (detector, text that must be found and rewritten)
POSITIVES = [
    ("home-path", "/home/zq_alice/pb/results"),
    ("home-path", "/Users/zq_alice/Library"),
    ("home-path", r"C:\Users\zq_alice\pb"),
    ("home-path", r'{"path": "C:\\Users\\zq_alice\\pb"}'),
    ("home-path", "cwd=/root/pb"),
    # any other absolute path, whatever its prefix (issue 38: these reached publish/ verbatim)
    ("abs-path", "built in /scratch/zq_alice/jobs/4711/build"),
    ("abs-path", "CXX=/opt/zq_alice/toolchain/bin/g++"),
    ("abs-path", "log at /tmp/zq_alice-tmp/bench.log:12"),
    ("abs-path", "spool /var/spool/slurmd/job4711/slurm_script"),
    ("abs-path", '{"error": "cannot open \'/data/zq_alice/m.gguf\'"}'),
    ("abs-path", "file:///scratch/zq_alice/x"),
    ("abs-path", "PATH=/usr/bin:/opt/zq_alice/bin"),
    ("abs-path", "<b>/scratch/zq_alice</b>"),
    ("abs-path", r"D:\zq_alice\bench"),
    ("unc-path", r"\\zq-fileserver\benchshare\x"),
    ("unc-path", r'{"share": "\\\\zq-fileserver\\benchshare"}'),
    ("windows-machine-name", "ran on DESKTOP-7QK2M9X today"),
    ("windows-machine-name", "LAPTOP-QZ81KD3"),
    ("email", "mail zq.alice+bench@corp.zqexample.net now"),
    ("ipv4", "listening on 10.23.45.67:8080"),
    ("ipv4", "peer 192.168.178.42"),
    ("ipv6", "addr 2001:db8:abcd:12::7 up"),
    ("ipv6", "[fe80::3e22:fbff:fe4a:5e91%eth0]:8080"),
    ("ipv6", "::ffff:10.23.45.67"),
    ("mac-address", "ether 3c:22:fb:4a:5e:91 brd"),
    ("mac-address", "3C-22-FB-4A-5E-91"),
    ("gpu-uuid", "GPU-5a1c2f3e-8b9d-4e6f-a0b1-c2d3e4f5a6b7"),
    ("gpu-uuid", "MIG-5a1c2f3e-8b9d-4e6f-a0b1-c2d3e4f5a6b7"),
    ("pci-bus-id", "Bus-Id 00000000:3B:00.0"),
    ("pci-bus-id", "0000:86:00.0"),
    ("credential-env", "ZQ_API_KEY=zqk_live_9f8e7d6c5b4a3928"),
    ("credential-env", "export DB_PASSWORD='zq-hunter2-pass'"),
    ("credential-env", '"HF_TOKEN": "hf_ZqPlanted0123456789abcdefghijklmn"'),
    ("credential-field", '"api_key": "abcdef123456"'),
    ("credential-field", "--api-key zqk_live_9f8e7d6c5b4a3928"),
    ("credential-field", "password: zq-hunter2-pass"),
    ("token-format", "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz012345"),
    ("token-format", "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
    ("token-format", "AKIAIOSFODNN7EXAMPLE"),
    ("bearer-token", "Authorization: Bearer AbCdEfGhIjKlMnOpQrSt.uvwx"),
    ("url-credentials", "https://zq_alice:hunter2@git.zqexample.net/x.git"),
    ("private-key", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----"),
]
