"""The registry of machine facts: what we know about the host, and which of it may be published.

Modelled on pyperf's metadata collection: one registry (:data:`FACTS`) of keys, each with a type, a
unit and a public/private flag; small ``collect_*`` functions fill it and tolerate missing sources
(no nvidia-smi, no git, no psutil, a sandbox without a hostname). Sanitizing is then an allowlist over
the registry:

- :func:`collect` returns every fact, private ones included (keep that under ``private/``);
- :func:`public` returns the ``environment.json`` body: public facts only, devices under stable
  pseudonymous ids (``gpu0``, ``gpu1``) in the order nvidia-smi lists them;
- :func:`identifiers` returns the literal private identifiers of this machine, by category, for
  :func:`pairbench.publish.sanitize.scrub_text` and the leak gate;
- :func:`node_facts` is what a measuring job records of its node (under ``private/``), and
  :func:`on_node` puts those machine facts in place of the publishing job's own, so
  ``environment.json`` describes the node that measured, even when publish runs on another.

Every collector takes its sources as arguments (environment mapping, command runner, interface table)
so tests can plant synthetic identities and never read this machine's.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import platform
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pairbench.publish.sanitize import SECRET_ENV_NAME


@dataclass(frozen=True)
class Fact:
    key: str
    type: str  # "str", "int", "list[str]", "list[gpu]"
    unit: str | None
    public: bool
    description: str


FACTS: tuple[Fact, ...] = (
    # public
    Fact("cpu_model", "str", None, True, "CPU model name"),
    Fact("cpu_count_logical", "int", "count", True, "logical CPUs (hardware threads)"),
    Fact("cpu_count_physical", "int", "count", True, "physical CPU cores"),
    Fact("cpu_arch", "str", None, True, "machine architecture (x86_64, arm64)"),
    Fact("memory_total_bytes", "int", "bytes", True, "installed RAM"),
    Fact("os_family", "str", None, True, "Linux, Darwin, Windows"),
    Fact("os_version", "str", None, True, "kernel release or OS version"),
    Fact("os_distribution", "str", None, True, "distribution name and version (os-release PRETTY_NAME)"),
    Fact("python_implementation", "str", None, True, "CPython, PyPy"),
    Fact("python_version", "str", None, True, "Python version"),
    Fact("torch_version", "str", None, True, "PyTorch version"),
    Fact("torch_cuda_version", "str", None, True, "CUDA version PyTorch was built with"),
    Fact("gpu_count", "int", "count", True, "number of GPUs nvidia-smi lists"),
    Fact("gpus", "list[gpu]", None, True, "GPUs as {id: gpuN, name, memory_total_bytes}"),
    Fact("gpu_driver_version", "str", None, True, "NVIDIA driver version"),
    Fact("cuda_version", "str", None, True, "CUDA version the driver supports"),
    Fact("engine_version", "str", None, True, "native version string of the engine under test"),
    # private: never leave the machine
    Fact("hostname", "str", None, False, "host name"),
    Fact("fqdn", "str", None, False, "fully qualified host name"),
    Fact("domain", "str", None, False, "DNS domain"),
    Fact("username", "str", None, False, "login name"),
    Fact("home", "str", None, False, "home directory"),
    Fact("ip_addresses", "list[str]", None, False, "interface IP addresses (loopback excluded)"),
    Fact("mac_addresses", "list[str]", None, False, "interface MAC addresses"),
    Fact("git_user_email", "str", None, False, "git config user.email"),
    Fact("git_user_name", "str", None, False, "git config user.name"),
    Fact("secret_env_names", "list[str]", None, False, "names of env vars that hold credentials"),
    Fact("secret_env_values", "list[str]", None, False, "values of env vars that hold credentials"),
    Fact("gpu_uuids", "list[str]", None, False, "GPU UUIDs"),
    Fact("gpu_pci_bus_ids", "list[str]", None, False, "GPU PCI bus ids"),
    Fact("gpu_serials", "list[str]", None, False, "GPU serial numbers"),
)
FACT_BY_KEY = {f.key: f for f in FACTS}
PUBLIC_KEYS = tuple(f.key for f in FACTS if f.public)
# Facts of the software that every job of a run shares (one checkout, one Python environment): the
# publish job reads them itself. Every other fact describes the machine a job ran on.
SOFTWARE_KEYS = frozenset({"python_implementation", "python_version", "torch_version", "torch_cuda_version",
                           "engine_version"})
# Never written to disk, not even under private/: they stay in the memory of the job that read them.
NEVER_STORED = frozenset({"secret_env_values"})

Runner = Callable[[Sequence[str]], str | None]


def run_command(argv: Sequence[str], timeout: float = 10.0) -> str | None:
    """stdout of *argv*, or None when the program is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def collect_cpu(cpuinfo: str | None = None) -> dict[str, Any]:
    if cpuinfo is None:
        cpuinfo = _read("/proc/cpuinfo")
    model = None
    if cpuinfo:
        m = re.search(r"^(?:model name|Processor|cpu model)\s*:\s*(.+)$", cpuinfo, re.M)
        model = m.group(1).strip() if m else None
    model = model or platform.processor() or None
    physical = None
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except Exception:
        pass
    return {
        "cpu_model": model,
        "cpu_count_logical": os.cpu_count(),
        "cpu_count_physical": physical,
        "cpu_arch": platform.machine() or None,
    }


def collect_memory(meminfo: str | None = None) -> dict[str, Any]:
    total = None
    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except Exception:
        text = meminfo if meminfo is not None else _read("/proc/meminfo")
        m = re.search(r"^MemTotal:\s*(\d+)\s*kB", text or "", re.M)
        total = int(m.group(1)) * 1024 if m else None
    return {"memory_total_bytes": total}


def collect_os(os_release: str | None = None) -> dict[str, Any]:
    if os_release is None:
        os_release = _read("/etc/os-release") or _read("/usr/lib/os-release") or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', os_release, re.M)
    dist = m.group(1) if m else None
    if platform.system() == "Darwin":
        dist = f"macOS {platform.mac_ver()[0]}".strip()
    return {"os_family": platform.system() or None, "os_version": platform.release() or None, "os_distribution": dist}


def collect_python() -> dict[str, Any]:
    return {"python_implementation": platform.python_implementation(), "python_version": platform.python_version()}


def collect_torch() -> dict[str, Any]:
    try:
        import torch  # heavy, but already loaded wherever the engine runs

        return {"torch_version": torch.__version__, "torch_cuda_version": torch.version.cuda}
    except Exception:
        return {"torch_version": None, "torch_cuda_version": None}


NVIDIA_QUERY = ("nvidia-smi", "--query-gpu=index,name,memory.total,driver_version,uuid,pci.bus_id,serial",
                "--format=csv,noheader,nounits")


def collect_gpus(run: Runner = run_command) -> dict[str, Any]:
    """GPU facts from nvidia-smi; an empty list (not an error) when there is none."""
    facts: dict[str, Any] = {"gpu_count": 0, "gpus": [], "gpu_driver_version": None, "cuda_version": None,
                             "gpu_uuids": [], "gpu_pci_bus_ids": [], "gpu_serials": []}
    out = run(NVIDIA_QUERY)
    if not out:
        return facts
    rows = []
    for line in out.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 7:
            continue
        rows.append(cells)
    rows.sort(key=lambda c: int(c[0]) if c[0].isdigit() else 0)
    for i, (_, name, mem_mib, driver, uuid, bus, serial) in enumerate(rows[:]):
        mem = int(float(mem_mib) * 1024 * 1024) if re.fullmatch(r"[\d.]+", mem_mib) else None
        facts["gpus"].append({"id": f"gpu{i}", "name": name, "memory_total_bytes": mem})
        facts["gpu_driver_version"] = facts["gpu_driver_version"] or driver or None
        for key, value in (("gpu_uuids", uuid), ("gpu_pci_bus_ids", bus), ("gpu_serials", serial)):
            if value and value.lower() not in ("[n/a]", "n/a", "[not supported]"):
                facts[key].append(value)
    facts["gpu_count"] = len(facts["gpus"])
    banner = run(("nvidia-smi",)) or ""
    m = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    facts["cuda_version"] = m.group(1) if m else None
    return facts


def collect_engine(engine_version: str | None = None) -> dict[str, Any]:
    """The engine's native version string, as the build stage recorded it (``build/<arm>.json``)."""
    return {"engine_version": engine_version}


_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "localhost6"}


def collect_host(
    gethostname: Callable[[], str] = socket.gethostname,
    getfqdn: Callable[[], str] = socket.getfqdn,
) -> dict[str, Any]:
    hostname = fqdn = None
    try:
        hostname = gethostname() or platform.node() or None
        fqdn = getfqdn() or None
    except OSError:
        pass
    # localhost names identify no machine; as literals they would only rewrite "localhost:8080".
    if hostname and hostname.lower() in _LOCAL_NAMES:
        hostname = None
    if fqdn and fqdn.lower() in _LOCAL_NAMES:
        fqdn = None
    domain = None
    if fqdn and hostname and fqdn.lower().startswith(hostname.lower() + "."):
        domain = fqdn[len(hostname) + 1:]
    elif fqdn and "." in fqdn:
        domain = fqdn.split(".", 1)[1]
    if (domain or "").lower() in ("localdomain", "local", "lan", "home"):
        domain = None  # generic suffixes: replacing them would only mangle ordinary words
    return {"hostname": hostname, "fqdn": fqdn if fqdn != hostname else None, "domain": domain}


def collect_user(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    user = environ.get("USER") or environ.get("USERNAME") or environ.get("LOGNAME")
    if not user:
        try:
            user = getpass.getuser()
        except Exception:
            user = None
    home = environ.get("HOME") or environ.get("USERPROFILE")
    if not home:
        try:
            home = str(Path.home())
        except Exception:
            home = None
    return {"username": user, "home": home}


def collect_network(if_addrs: Mapping[str, Sequence[Any]] | None = None) -> dict[str, Any]:
    """Interface addresses from psutil.net_if_addrs() (or the planted table); loopback excluded."""
    if if_addrs is None:
        try:
            import psutil

            if_addrs = psutil.net_if_addrs()
        except Exception:
            if_addrs = {}
    ips: list[str] = []
    macs: list[str] = []
    for addrs in if_addrs.values():
        for a in addrs:
            value = str(getattr(a, "address", "") or "").split("%", 1)[0]
            if not value:
                continue
            try:
                ip = ipaddress.ip_address(value)
            except ValueError:
                if re.fullmatch(r"(?i)[0-9a-f]{2}([:-][0-9a-f]{2}){5}", value) and set(value) - set("0:-"):
                    macs.append(value)
                continue
            if not (ip.is_loopback or ip.is_unspecified):
                ips.append(value)
    return {"ip_addresses": sorted(set(ips)), "mac_addresses": sorted(set(macs))}


def collect_git(run: Runner = run_command) -> dict[str, Any]:
    def get(key: str) -> str | None:
        out = run(("git", "config", "--get", key))
        return out.strip() or None if out else None

    return {"git_user_email": get("user.email"), "git_user_name": get("user.name")}


def collect_secret_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Names and values of environment variables whose names contain TOKEN, KEY, SECRET, PASSWORD."""
    environ = os.environ if environ is None else environ
    names = sorted(k for k, v in environ.items() if SECRET_ENV_NAME.search(k) and v)
    # Values become literals that are replaced wherever they occur, so trivial ones would wreck the
    # report (TOKENIZERS_PARALLELISM=false would redact every "false"): keep only plausible secrets.
    values = sorted({environ[k] for k in names if is_plausible_secret(environ[k])})
    return {"secret_env_names": names, "secret_env_values": values}


def is_plausible_secret(value: str) -> bool:
    """At least 6 characters, not a number, boolean or placeholder."""
    v = value.strip()
    return len(v) >= 6 and not re.fullmatch(r"[+-]?[\d.,_]+|true|false|yes|no|none|null|on|off", v, re.I)


def collect(
    *,
    environ: Mapping[str, str] | None = None,
    run: Runner = run_command,
    if_addrs: Mapping[str, Sequence[Any]] | None = None,
    engine_version: str | None = None,
    torch: bool = True,
    gethostname: Callable[[], str] = socket.gethostname,
    getfqdn: Callable[[], str] = socket.getfqdn,
) -> dict[str, Any]:
    """Every fact in :data:`FACTS`, private ones included. Missing sources give ``None``/``[]``."""
    facts: dict[str, Any] = {}
    facts.update(collect_cpu())
    facts.update(collect_memory())
    facts.update(collect_os())
    facts.update(collect_python())
    facts.update(collect_torch() if torch else {"torch_version": None, "torch_cuda_version": None})
    facts.update(collect_gpus(run))
    facts.update(collect_engine(engine_version))
    facts.update(collect_host(gethostname, getfqdn))
    facts.update(collect_user(environ))
    facts.update(collect_network(if_addrs))
    facts.update(collect_git(run))
    facts.update(collect_secret_env(environ))
    for f in FACTS:
        facts.setdefault(f.key, [] if f.type.startswith("list") else None)
    unknown = set(facts) - set(FACT_BY_KEY)
    if unknown:
        raise KeyError(f"collectors produced facts missing from the registry: {sorted(unknown)}")
    return facts


def node_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """What a measuring job records of the node it ran on (``private/hosts/<visit>.json``), so that
    publish, which may run elsewhere (a login node under Slurm), describes that node: every machine
    fact of *facts* (``collect(torch=False)`` is enough), private ones included, since they are
    identifiers to scrub, but no software fact and never a credential's value."""
    return {k: v for k, v in facts.items() if k in FACT_BY_KEY and k not in SOFTWARE_KEYS | NEVER_STORED}


def on_node(here: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
    """The facts of the run: the machine facts of *node* (:func:`node_facts` of the measuring job) in
    place of those of *here* (collected by the job that publishes), whose software facts are kept."""
    machine = [f for f in FACTS if f.key not in SOFTWARE_KEYS | NEVER_STORED]
    return {**here, **{f.key: node.get(f.key, [] if f.type.startswith("list") else None) for f in machine}}


def public(facts: Mapping[str, Any], inputs: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``environment.json`` body: the public facts only (an allowlist over the registry).

    GPUs keep only ``id`` (``gpu0``, ``gpu1``, in nvidia-smi index order), ``name`` and
    ``memory_total_bytes``. Write it with ``write_artifact(path, "environment", public(facts))``.
    """
    body: dict[str, Any] = {"inputs": dict(inputs or {})}
    for key in PUBLIC_KEYS:
        value = facts.get(key)
        if key == "gpus":
            value = [
                {"id": f"gpu{i}", "name": g.get("name"), "memory_total_bytes": g.get("memory_total_bytes")}
                for i, g in enumerate(value or [])
            ]
        body[key] = value
    return body


def identifiers(facts: Mapping[str, Any]) -> dict[str, list[str]]:
    """This machine's literal private identifiers, by category (see sanitize.scrub_text)."""
    def one(key: str) -> list[str]:
        v = facts.get(key)
        return [v] if isinstance(v, str) and v else []

    def many(key: str) -> list[str]:
        return [v for v in facts.get(key) or [] if isinstance(v, str) and v]

    fqdn = one("fqdn")
    host, domain = facts.get("hostname"), facts.get("domain")
    if fqdn and host and domain and fqdn[0].lower() == f"{host}.{domain}".lower():
        fqdn = []  # host and domain are replaced one by one: "host-1.domain-1", one pseudonym per name
    out = {
        "username": one("username"),
        "hostname": one("hostname"),
        "fqdn": fqdn,
        "domain": one("domain"),
        "home": one("home"),
        "email": one("git_user_email"),
        "git_name": one("git_user_name"),
        "ip": many("ip_addresses"),
        "mac": many("mac_addresses"),
        "secret": many("secret_env_values"),
        "gpu_uuid": many("gpu_uuids"),
        "pci_bus_id": many("gpu_pci_bus_ids"),
        "serial": many("gpu_serials"),
    }
    return {k: sorted(set(v)) for k, v in out.items()}


def merged_identifiers(*facts: Mapping[str, Any]) -> dict[str, list[str]]:
    """The identifiers of several machines (the publishing one and every measuring node), by category."""
    out: dict[str, set[str]] = {}
    for one in facts:
        for category, values in identifiers(one).items():
            out.setdefault(category, set()).update(values)
    return {k: sorted(v) for k, v in out.items()}
