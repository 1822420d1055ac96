"""Run the Snakemake pipeline in a throwaway copy of this checkout (tracked + untracked files)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def copy_checkout(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if rel == "resources" or rel.startswith("resources/") or not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    (dest / "resources").symlink_to((REPO / "resources").resolve())
    return dest


def snakemake(cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def finished_run(tmp_path_factory, config: str, label: str, timeout: float = 900) -> tuple[Path, Path]:
    """A throwaway checkout after a whole run of *config*: ``(checkout, results/<label>)``; a failed
    run fails the test with the end of its stderr."""
    checkout = copy_checkout(tmp_path_factory.mktemp("checkout"))
    proc = snakemake(checkout, "--configfile", config, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return checkout, checkout / "results" / label
