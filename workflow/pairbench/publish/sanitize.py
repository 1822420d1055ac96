"""Scrubbers and detectors for text that may leave the machine.

One table of detectors (:data:`DETECTORS`) serves two masters, so they can never drift apart:

- :func:`scrub_text` rewrites every match (home directories, e-mails, IP and MAC addresses, GPU UUIDs,
  PCI bus ids, Windows machine names, credential values) and replaces this machine's literal
  identifiers (see :func:`pairbench.publish.envfacts.identifiers`) with consistent pseudonyms;
- :func:`find` reports every match, which the leak gate (:mod:`pairbench.publish.leakgate`) turns into
  findings over a finished bundle.

:func:`strip_patch` removes author identities from ``git format-patch`` output.

False-positive policy (see docs/publishing.md):

- version strings (``3.11.7``, ``0.1.0``, ``2.13.0+cpu``) have at most three dotted parts and are not
  IPv4 addresses; a four-part dotted quad preceded by ``v``, ``=``, ``@`` etc. is a version pin;
- loopback and unspecified addresses (``127.0.0.0/8``, ``::1``, ``0.0.0.0``, ``::``) and the all-zero
  and broadcast MACs identify no one and are left alone;
- lowercase hex digests are not secrets: no detector here matches bare hex, and the leak gate accepts
  detect-secrets' hex-entropy hits only on JSON keys whose name contains ``sha256``;
- literal identifiers shorter than :data:`MIN_LITERAL_LEN` characters are ignored, and literals only
  match on alphanumeric boundaries (``vm`` does not match inside ``kvm``).

The idea of one detector table with a scrub rule per class follows pyperf's and detect-secrets'
plugin tables; the classes themselves are the ones listed in issue 6.
"""

from __future__ import annotations

import bisect
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, MutableMapping

MIN_LITERAL_LEN = 2

# Environment variable names whose values are credentials (issue 6: TOKEN, KEY, SECRET, PASSWORD).
SECRET_ENV_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)

REDACTED = "<redacted>"
_NUMBER = re.compile(r"^[+-]?\d[\d_.,]*(?:[eE][+-]?\d+)?$")

# Placeholder values that are not secrets: our own replacements, shell references, masks, booleans.
_NOT_A_SECRET = re.compile(r"^(?:<[^>]*>?|\$.*|\*+|x+|true|false|null|none|redacted|changeme)$", re.I)


@dataclass(frozen=True)
class Detector:
    """One class of identifier: a regex, an optional acceptance test, and how to rewrite a match.

    ``group`` names the regex group that holds the sensitive part (the whole match when ``None``): a
    credential assignment keeps its name and rewrites only the value.
    """

    name: str
    pattern: re.Pattern
    replacement: str
    accept: Callable[[str], bool] | None = None
    group: str | None = None
    description: str = ""

    def matches(self, text: str) -> Iterator[re.Match]:
        for m in self.pattern.finditer(text):
            value = m.group(self.group) if self.group else m.group(0)
            if self.accept is None or self.accept(value):
                yield m

    def sub(self, text: str, replacement: Callable[[str], str] | None = None) -> str:
        def repl(m: re.Match) -> str:
            value = m.group(self.group) if self.group else m.group(0)
            if self.accept is not None and not self.accept(value):
                return m.group(0)
            new = replacement(value) if replacement else self.replacement
            if self.group is None:
                return new
            start, end = m.span(self.group)
            base = m.start(0)
            whole = m.group(0)
            return whole[: start - base] + new + whole[end - base:]

        return self.pattern.sub(repl, text)


def _is_secret_value(value: str) -> bool:
    """A plausible credential: not a placeholder, a boolean, or a number (MAX_TOKENS=100000)."""
    return len(value) >= 4 and not _NOT_A_SECRET.match(value) and not _NUMBER.match(value)


def _is_public_ipv4(value: str) -> bool:
    try:
        ip = ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_unspecified)


def _is_public_ipv6(value: str) -> bool:
    addr = value.split("%", 1)[0]
    try:
        ip = ipaddress.IPv6Address(addr)
    except ValueError:
        return False
    if ip.is_loopback or ip.is_unspecified:
        return False
    # "1::2" in a Python slice is a valid IPv6 literal; real addresses carry more hex than that.
    digits = sum(c in "0123456789abcdefABCDEF" for c in addr.split(".")[0])
    return ip.is_link_local or digits >= 6 or "." in addr


#: Absolute paths that name no one and may stay: the null device and its kin (``--- /dev/null`` in a
#: patch), the kernel's public files, and the HTTP routes of the engines' APIs (``/v1/completions``).
PUBLIC_PATHS = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/stdin", "/dev/stdout",
                          "/dev/stderr", "/proc/cpuinfo", "/proc/meminfo", "/proc/self/status", "/proc/loadavg",
                          "/health", "/metrics", "/tokenize", "/detokenize", "/version", "/completion", "/props",
                          "/slots"})
_API_ROUTE = re.compile(r"/v1(?:/[a-z_]+)+")
# one component of a path: never ending in a dot, so "... at /x/y." leaves the sentence's full stop
_PATH_PART = r"\.*[\w@%+=~#-]+(?:\.+[\w@%+=~#-]+)*"


def _is_private_path(value: str) -> bool:
    """An absolute path that is not one of :data:`PUBLIC_PATHS` or an API route (``/v1/...``)."""
    bare = value.removeprefix("file://")
    return bare not in PUBLIC_PATHS and not _API_ROUTE.fullmatch(bare)


def _is_real_mac(value: str) -> bool:
    hexes = re.sub(r"[:-]", "", value).lower()
    return hexes not in ("000000000000", "ffffffffffff")


_CRED_WORDS = r"(?:api[_-]?key|access[_-]?key|secret(?:[_-]?key)?|token|password|passwd|client[_-]?secret)"

# Order matters for scrubbing: credentials before anything that could eat part of them, e-mails
# before host names, PCI ids before MACs and IPv6, home paths before UNC paths.
DETECTORS: tuple[Detector, ...] = (
    Detector(
        "private-key",
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S),
        "<redacted private key>",
        description="PEM private key blocks",
    ),
    Detector(
        "url-credentials",
        re.compile(r"\b[a-z][a-z0-9+.-]*://(?P<secret>[^\s:/@<>\"']+:[^\s@/<>\"']+)@", re.I),
        REDACTED,
        group="secret",
        description="user:password@ in URLs",
    ),
    Detector(
        "bearer-token",
        re.compile(r"(?:\bbearer|\bbasic|authorization:\s*token)\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)", re.I),
        REDACTED,
        group="secret",
        description="Authorization header values",
    ),
    Detector(
        "token-format",
        re.compile(
            r"(?<![\w-])(?:sk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}|gh[opsur]_[A-Za-z0-9]{20,}"
            r"|github_pat_\w{20,}|hf_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}"
            r"|glpat-[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,})"
        ),
        REDACTED,
        description="well-known API token formats (OpenAI, GitHub, Hugging Face, AWS, Slack, ...)",
    ),
    Detector(
        "credential-env",
        re.compile(
            r"\b(?P<name>[A-Z][A-Z0-9_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)[A-Z0-9_]*)"
            r"[\"']?\s*[=:]\s*[\"']?(?P<secret>[^\s\"'<>,;]+)"
        ),
        REDACTED,
        accept=_is_secret_value,
        group="secret",
        description="values of environment variables named *TOKEN*, *KEY*, *SECRET*, *PASSWORD*",
    ),
    Detector(
        "credential-field",
        re.compile(
            r"(?<![\w-])(?:[\"']?(?P<name>(?:[a-z0-9]+[_-])*" + _CRED_WORDS + r")[\"']?\s*[=:]\s*"
            r"|--(?P<flag>(?:[a-z0-9]+-)*" + _CRED_WORDS + r")(?:\s+|=))[\"']?"
            r"(?P<secret>[^\s\"'<>,;}\]\[]{6,})",
            re.I,
        ),
        REDACTED,
        accept=_is_secret_value,
        group="secret",
        description="values of fields and flags named api_key, token, secret, password (--api-key X)",
    ),
    Detector(
        "email",
        re.compile(r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"),
        "<email>",
        description="e-mail addresses",
    ),
    Detector(
        "home-path",
        re.compile(
            r"/(?:home|Users)/[^/\s\"'\\:<>]+"
            r"|(?<![\w/])/root(?=[/\s\"':]|$)"
            r"|\b[A-Za-z]:(?:\\{1,2}|/)(?:Users|Documents and Settings)(?:\\{1,2}|/)[^\\/\s\"':*?<>|]+",
            re.M,
        ),
        "~",
        description="home directories: /home/x, /Users/x, /root, C:\\Users\\x",
    ),
    Detector(
        "abs-path",
        # An absolute POSIX path of at least one component, wherever it starts: not the path part of a
        # URL (after its host, or the // of scheme://), not a relative path or a unit (tok/s), not
        # what a scrubbed prefix left (<path>/engine/x.py, ~/x). A file:// URL is a path.
        re.compile(r"file://(?:/" + _PATH_PART + ")+"
                   r"|(?<![\w.~%+/\\-])(?<!<path>)(?<!:/)(?<!://)(?!(?<=<)/[A-Za-z][\w-]*>)"
                   r"/(?!/)" + _PATH_PART + "(?:/" + _PATH_PART + ")*/?"
                   r"|(?<![\w])[A-Za-z]:(?:\\{1,2}|/)[\w.@%+=,~#$ -]*[\w.@%+=,~#$-](?:(?:\\{1,2}|/)[\w.@%+=,~#$-]+)*"),
        "<path>",
        accept=_is_private_path,
        description="any other absolute path, whatever its prefix (/scratch/x, /opt/x/bin/g++, /tmp/x-tmp/log, D:\\x)",
    ),
    Detector(
        "unc-path",
        re.compile(r"(?<![\w:\\])(?:\\\\){1,2}[A-Za-z0-9][\w.$-]*\\{1,2}[\w.$-]+"),
        "<unc-path>",
        description="UNC paths \\\\host\\share",
    ),
    Detector(
        "windows-machine-name",
        re.compile(r"\b(?:DESKTOP|LAPTOP|WIN)-[A-Z0-9]{5,15}\b"),
        "<host>",
        description="Windows default machine names DESKTOP-XXXXXXX, LAPTOP-...",
    ),
    Detector(
        "gpu-uuid",
        re.compile(r"\b(?:GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
        "<gpu-uuid>",
        description="NVIDIA GPU and MIG UUIDs",
    ),
    Detector(
        "pci-bus-id",
        re.compile(r"\b(?:[0-9a-f]{8}|[0-9a-f]{4}):[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\b", re.I),
        "<pci-bus-id>",
        description="PCI bus ids with a domain (0000:3b:00.0, 00000000:3B:00.0)",
    ),
    Detector(
        "mac-address",
        re.compile(r"(?<![\w:-])[0-9a-f]{2}(?P<sep>[:-])(?:[0-9a-f]{2}(?P=sep)){4}[0-9a-f]{2}(?![\w:-])", re.I),
        "<mac>",
        accept=_is_real_mac,
        description="MAC addresses (not all-zero or broadcast)",
    ),
    Detector(
        "ipv6",
        re.compile(
            r"(?<![\w:.])(?=[0-9a-f:]*:[0-9a-f]*:)[0-9a-f:]{2,39}(?:(?<=:)\d{1,3}(?:\.\d{1,3}){3})?"
            r"(?:%[\w.]+)?(?![\w:])",
            re.I,
        ),
        "<ipv6>",
        accept=_is_public_ipv6,
        description="IPv6 addresses (not loopback or unspecified)",
    ),
    Detector(
        "ipv4",
        re.compile(r"(?<![\w.=<>~^@+-])(?:\d{1,3}\.){3}\d{1,3}(?![\w-]|\.\d)"),
        "<ipv4>",
        accept=_is_public_ipv4,
        description="IPv4 addresses (not loopback or unspecified; 4 parts, so not versions)",
    ),
)

DETECTOR_NAMES = tuple(d.name for d in DETECTORS)

# Identifier categories (keys of envfacts.identifiers()) and what replaces them. Categories with a
# pseudonym prefix get consistent numbered pseudonyms ("host-1"); the rest get a fixed placeholder.
PSEUDONYM_PREFIX = {
    "fqdn": "host",
    "hostname": "host",
    "domain": "domain",
    "username": "user",
    "git_name": "author",
}
PLACEHOLDER = {
    "secret": REDACTED,
    "home": "~",
    "path": "<path>",
    "email": "<email>",
    "ip": "<ip>",
    "mac": "<mac>",
    "gpu_uuid": "<gpu-uuid>",
    "pci_bus_id": "<pci-bus-id>",
    "serial": "<serial>",
}
# Case-sensitive categories: secrets and serials are exact strings; names are not.
_CASE_SENSITIVE = {"secret", "serial", "home", "path"}


def literal_pattern(value: str, category: str) -> re.Pattern:
    """A regex matching *value* as a whole token (not inside a longer alphanumeric word)."""
    flags = 0 if category in _CASE_SENSITIVE else re.IGNORECASE
    body = re.escape(value)
    if category in ("home", "path"):
        # /root must not match /rootfs; the next character must end the path component.
        return re.compile(body + r"(?![\w.-])", flags)
    if category == "secret":
        return re.compile(body)  # anywhere, even glued to other text: the scrubber replaces substrings too
    return re.compile(r"(?<![A-Za-z0-9])" + body + r"(?![A-Za-z0-9])", flags)


def usable_literals(identifiers: Mapping[str, Iterable[str]]) -> list[tuple[str, str]]:
    """(category, value) pairs worth matching, longest value first (so an FQDN beats its host part)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for category, values in identifiers.items():
        for v in values or ():
            if not isinstance(v, str):
                continue
            v = v.strip()
            if len(v) < MIN_LITERAL_LEN or (category, v) in seen:
                continue
            if category in ("home", "path") and v in ("/", "~"):
                continue
            seen.add((category, v))
            out.append((category, v))
    out.sort(key=lambda cv: (-len(cv[1]), cv[0], cv[1]))
    return out


def _pseudonym(value: str, prefix: str, pseudonyms: MutableMapping[str, str]) -> str:
    key = value.lower()
    if key not in pseudonyms:
        n = 1 + sum(1 for p in pseudonyms.values() if p.startswith(prefix + "-"))
        pseudonyms[key] = f"{prefix}-{n}"
    return pseudonyms[key]


def scrub_text(
    text: str,
    identifiers: Mapping[str, Iterable[str]],
    pseudonyms: MutableMapping[str, str] | None = None,
) -> str:
    """Rewrite every identifier in *text*; return the scrubbed text.

    *identifiers* maps a category (``username``, ``hostname``, ``fqdn``, ``domain``, ``home``,
    ``email``, ``ip``, ``mac``, ``secret``, ``gpu_uuid``, ``pci_bus_id``, ``serial``, ``git_name``)
    to this machine's literal values (see :func:`pairbench.publish.envfacts.identifiers`). Callers may add
    ``path`` (absolute directories such as the checkout, rewritten to ``<path>``); any other category
    is replaced by ``<redacted>``.

    *pseudonyms* (lower-cased identifier → pseudonym) is read and **extended in place**, so one
    mapping passed over every file of a bundle keeps ``host-1`` meaning the same host everywhere.
    Keep it in ``private/``; never publish it.
    """
    if pseudonyms is None:
        pseudonyms = {}
    literals = usable_literals(identifiers)

    # 1. Exact secrets first: a secret may contain anything, including what the classes below match.
    for category, value in literals:
        if category == "secret":
            text = text.replace(value, REDACTED)
    # 2. Literal paths, longest first: a checkout path (e.g. /work/pb, category "path") -> <path>, the
    #    home directory (e.g. /root, /srv/alice) -> ~, before the generic home-directory patterns.
    for category, value in literals:
        if category in ("home", "path"):
            text = literal_pattern(value, category).sub(PLACEHOLDER[category], text)
    # 3. The detector classes.
    for det in DETECTORS:
        if det.name == "windows-machine-name":
            text = det.sub(text, lambda v: _pseudonym(v, "host", pseudonyms))
        else:
            text = det.sub(text)
    # 4. Remaining literals: names get pseudonyms, addresses and ids placeholders.
    for category, value in literals:
        if category in ("secret", "home", "path"):
            continue
        pat = literal_pattern(value, category)
        if category in PSEUDONYM_PREFIX:
            prefix = PSEUDONYM_PREFIX[category]
            text = pat.sub(lambda m, p=prefix: _pseudonym(m.group(0), p, pseudonyms), text)
        else:
            text = pat.sub(PLACEHOLDER.get(category, REDACTED), text)
    return text


@dataclass(frozen=True)
class Match:
    """One detector hit in a text: 1-based line and column, the detector, and the matched text.

    ``value`` is private (it may be the secret itself): log it only under ``private/``.
    """

    line: int
    column: int
    detector: str
    value: str = field(repr=False)


def _line_col(text: str, offset: int, line_starts: list[int]) -> tuple[int, int]:
    i = bisect.bisect_right(line_starts, offset) - 1
    return i + 1, offset - line_starts[i] + 1


def find(text: str, identifiers: Mapping[str, Iterable[str]] | None = None) -> list[Match]:
    """Every detector hit and every literal identifier in *text* (the leak gate's own detectors).

    Literal identifiers report as ``literal:<category>``.
    """
    line_starts = [0] + [m.end() for m in re.finditer(r"\n", text)]
    hits: list[Match] = []
    for det in DETECTORS:
        for m in det.matches(text):
            start = m.start(det.group) if det.group else m.start()
            value = m.group(det.group) if det.group else m.group(0)
            hits.append(Match(*_line_col(text, start, line_starts), det.name, value))
    for category, value in usable_literals(identifiers or {}):
        for m in literal_pattern(value, category).finditer(text):
            hits.append(Match(*_line_col(text, m.start(), line_starts), f"literal:{category}", m.group(0)))
    hits.sort(key=lambda h: (h.line, h.column, h.detector))
    return hits


# --- patches ---------------------------------------------------------------------------------

# Trailer and header lines that carry a person's identity in git format-patch / git log output.
_IDENTITY_LINE = re.compile(
    r"^(?:From|Author|Commit|Committer|AuthorDate|CommitDate|Date|Cc|To|Reply-To|Sender"
    r"|Signed-off-by|Co-authored-by|Co-developed-by|Reviewed-by|Acked-by|Tested-by|Reported-by"
    r"|Suggested-by|Helped-by):",
    re.I,
)
_MBOX_FROM = re.compile(r"^From [0-9a-f]{7,64} ")
_DIFF_PATH_LINE = re.compile(r"^(?P<head>diff --git |--- |\+\+\+ |rename from |rename to |copy from |copy to |Index: )(?P<rest>.*)$")


def _relativize(path: str, roots: Iterable[str], default_prefix: str) -> str:
    """Make a diff path under one of *roots* relative to it, keeping git's a/ b/ prefix convention."""
    prefix, rest = (path[:2], path[2:]) if path[:2] in ("a/", "b/") else ("", path)
    bare = rest.lstrip("/")
    for root in sorted((r.strip("/\\") for r in roots if r and r.strip("/\\")), key=len, reverse=True):
        if bare.startswith(root + "/"):
            return (prefix or default_prefix) + bare[len(root) + 1:]
    return path


def strip_patch(text: str, roots: Iterable[str] = ()) -> str:
    """Remove author identities from ``git format-patch`` output and rewrite absolute paths.

    - In the header (before the first ``diff``/``---`` line): ``From:``, ``Date:``,
      ``Signed-off-by:``, ``Co-authored-by:`` and the other identity trailers go (with their folded
      continuation lines); ``Date:`` goes too, because its time zone places the author.
    - The same trailers are removed from the commit message body, wherever they appear before the
      diff. The ``From <sha> Mon Sep 17 00:00:00 2001`` mbox line stays: it names a commit, no person.
    - E-mail addresses anywhere become ``<email>``.
    - In diff path lines (``diff --git``, ``---``, ``+++``, ``rename``/``copy``, ``Index:``), a path
      under one of *roots* (e.g. the exported source tree) is made relative to it; any other home
      directory left in a path is rewritten to ``~``. The result must still apply: ``publish`` checks
      it with ``git apply --check`` against the clean source.
    """
    out: list[str] = []
    in_diff = False
    skipping_folded = False
    email = next(d for d in DETECTORS if d.name == "email")
    home = next(d for d in DETECTORS if d.name == "home-path")
    lines = text.splitlines(keepends=True)
    bodies = [ln.rstrip("\r\n") for ln in lines]
    for i, line in enumerate(lines):
        body = bodies[i]
        if _MBOX_FROM.match(body):
            in_diff = False  # the next message of a concatenated series: a new header follows
        if not in_diff and (body.startswith("diff ") or body.startswith("--- ") or body.startswith("Index: ")):
            in_diff = True
        if not in_diff:
            if skipping_folded and body[:1] in (" ", "\t") and body.strip():
                continue
            skipping_folded = False
            if _IDENTITY_LINE.match(body) and not body.startswith("From "):
                skipping_folded = True
                continue
        m = _DIFF_PATH_LINE.match(body) if in_diff else None
        # Inside a hunk, "--- x" is a removed line "-- x": a file header only comes as a ---/+++ pair.
        if m and m.group("head") == "--- " and not (i + 1 < len(bodies) and bodies[i + 1].startswith("+++ ")):
            m = None
        if m and m.group("head") == "+++ " and not (i > 0 and bodies[i - 1].startswith("--- ")):
            m = None
        if m:
            rest = m.group("rest")
            head = m.group("head")
            if head == "diff --git ":
                parts = [_relativize(p, roots, d) for p, d in zip(rest.split(" "), ("a/", "b/"))]
            else:
                tab = rest.find("\t")  # diff -u puts a timestamp after a tab
                path, tail = (rest, "") if tab < 0 else (rest[:tab], rest[tab:])
                default = {"--- ": "a/", "+++ ": "b/"}.get(head, "")
                parts = [_relativize(path, roots, default) + tail]
            parts = [home.sub(p) for p in parts]
            line = m.group("head") + " ".join(parts) + line[len(body):]
        line = email.sub(line)
        out.append(line)
    return "".join(out)
