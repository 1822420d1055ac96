"""pairbench command line: ``python -m pairbench <command> ...``.

The benchmark itself runs through Snakemake (``snakemake --cores 1``); these commands read a config
or a finished run. ``--help`` prints :data:`DESCRIPTION` (plain text); ``--version`` the package's.

Commands:

- ``plan [<config> ...] [--config KEY=VALUE ...]``: check a config as ``snakemake`` would (every
  error at once, each at its file and line) and print the plan in words
  (:func:`pairbench.stages.summary.plan_summary`); exit status 2 with the errors if it cannot run.
- ``verify <bundle> [--source <clean source dir>] [--run <run dir>]``: offline check of a publication
  bundle (:func:`pairbench.publish.verify.verify_bundle`), and of the cost channel's verdicts of the
  run folder it was made from (its parent, by default); exit status 1 and one line per problem if it fails.
- ``audit <run dir> [--extra FILE] [--out audit.json]``: re-validate every artifact of
  ``results/<label>`` and walk its hash chain (:func:`pairbench.integrity.audit.audit_run`); exit status 1 and
  one ``FAIL <file>: [check] ...`` line per finding if anything was tampered with or corrupted.
- ``llama-tree [--version V] [--cache DIR]``: make (once) the local llama.cpp git repository with the
  tag ``llama-cpp-python-<V>-vendor`` from the llama-cpp-python sdist on PyPI
  (:func:`pairbench.arms.llamacpp_tree.ensure_tree`); prints its path, tag and commit as JSON.
- ``scan <dir>``: run the leak gate over a folder with this machine's identifiers
  (:func:`pairbench.publish.leakgate.scan`); prints ``file:line: detector`` per finding, never the values.
- ``html-report <report.html> --out <public.html>``: the page ``snakemake --report`` wrote, its text and
  every embedded file scrubbed and put through the leak gate with this machine's identifiers
  (:func:`pairbench.publish.htmlreport.publish`); written only when the gate finds nothing, exit
  status 1 and ``file:line: detector`` per finding otherwise.
- ``gate <run dir> [--configfile FILE ...] [--config KEY=VALUE ...] [--markdown F] [--junit F] [--json F]``:
  the CI decision over a finished run (:func:`pairbench.integrity.gate.check_run`, the published
  ``gate.json``): exit status 0 no regression, 1 a regression, 2 inconclusive under a policy that
  fails it, 3 the run is not valid; the reason on one line of stderr, the Markdown summary on stdout
  (and appended to ``--markdown``, e.g. ``$GITHUB_STEP_SUMMARY``), JUnit XML to ``--junit``. docs/ci.md.

Other stages add their subcommands to :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from pairbench import __version__

DESCRIPTION = """\
pairbench: paired A/B benchmarks of LLM inference engines.

Run a benchmark with Snakemake, from the repository root:
  snakemake --cores 1                            the default config (config/config.yaml)
  snakemake --cores 1 --configfile my.yaml       your config (it replaces config/config.yaml)
  snakemake -n --configfile my.yaml              the plan and the jobs, nothing run

These commands read a config or a finished run (README.md):"""

EPILOG = "Each command has its own --help, e.g. python -m pairbench plan --help."


def _plan(args: argparse.Namespace) -> int:
    from pairbench.stages import runconfig
    from pairbench.stages.summary import plan_summary

    files = args.config or [runconfig.DEFAULT_FILE]
    try:
        cli = dict(_key_value(item) for item in args.set)
        given, sources = runconfig.read_config(files, cli)
        if "study" in given:
            print("pairbench plan: a study: run `snakemake -n --configfile <it>` to see each comparison's plan",
                  file=sys.stderr)
            return 2
        config = runconfig.load_config(given=given, sources=sources, root=Path(args.root))
    except runconfig.ConfigErrors as exc:
        print(exc, file=sys.stderr)
        return 2
    except ValueError as exc:  # a --config pair that is not KEY=VALUE
        print(f"pairbench plan: {exc}", file=sys.stderr)
        return 2
    print(plan_summary(config, sources.describe()))
    return 0


def _key_value(item: str) -> tuple[str, object]:
    """``KEY=VALUE`` read as Snakemake's --config reads it (YAML), lists and maps included."""
    import yaml

    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"--config {item!r}: write KEY=VALUE")
    return key, yaml.safe_load(value) if value else None


def _add_plan(sub) -> None:
    p = sub.add_parser("plan", help="check a config and print its plan in words (what snakemake -n also prints)")
    p.add_argument("config", nargs="*", help="config file(s), merged in order as --configfile merges them "
                   "(default config/config.yaml)")
    p.add_argument("--config", dest="set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key, as snakemake's --config does; repeatable")
    p.add_argument("--root", default=".", help="the repository root that paths in the config are relative to "
                   "(default: the current folder)")
    p.set_defaults(func=_plan)


def _verify(args: argparse.Namespace) -> int:
    from pairbench.publish import costcheck
    from pairbench.publish.verify import bundle_versions, verify_bundle

    run_dir = args.run if args.run is not None else _run_of(args.bundle)
    problems = verify_bundle(args.bundle, clean_source=args.source, run_dir=run_dir or None)
    for p in problems:
        print(p)
    if problems:
        print(f"FAILED: {len(problems)} problem(s) in {args.bundle}", file=sys.stderr)
        return 1
    checked = ("MANIFEST hashes, schemas, fixture hashes, scripts, every verdict and number recomputed from "
               "tables/measurements.csv" + (", patches and patched-file hashes" if args.source else "")
               + (f", the cost channel's verdicts of {run_dir} recomputed"
                  if run_dir and costcheck.published_by(args.bundle) else ""))
    versions = ", ".join(f"{k} v{v}" for k, v in bundle_versions(args.bundle).items())
    print(f"OK: {args.bundle} verified ({checked}); schemas: {versions}")
    return 0


def _run_of(bundle: str) -> str | None:
    """The run folder a bundle at ``results/<label>/publish`` was made from, when it is there."""
    parent = Path(bundle).resolve().parent
    return str(parent) if (parent / "plan.json").is_file() else None


def _scan(args: argparse.Namespace) -> int:
    from pairbench.publish import envfacts
    from pairbench.publish import leakgate

    ids = envfacts.identifiers(envfacts.collect(torch=False))
    findings = leakgate.scan(args.dir, ids)
    for f in findings:
        print(f)
    print(leakgate.report_line(len(findings), leakgate.detector_names(ids), len(leakgate.bundle_files(args.dir))))
    return 1 if findings else 0


def _html_report(args: argparse.Namespace) -> int:
    from pairbench.publish import envfacts, htmlreport

    ids = envfacts.identifiers(envfacts.collect(torch=False))
    try:
        result = htmlreport.publish(args.report, args.out, ids)
    except (htmlreport.HtmlReportError, OSError) as exc:
        print(f"html-report: {exc}", file=sys.stderr)
        return 1
    print(f"OK: {result['report']}: 0 findings over the page and {result['embedded']} embedded file(s)")
    return 0


def _add_html_report(sub) -> None:
    p = sub.add_parser("html-report", help="scrub and leak-gate the page snakemake --report wrote, for sharing")
    p.add_argument("report", help="the page snakemake --report wrote (report.html)")
    p.add_argument("--out", required=True, help="where the publishable page goes (written only if the gate passes)")
    p.set_defaults(func=_html_report)


def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="verify a publication bundle offline")
    p.add_argument("bundle", help="the bundle folder (results/<label>/publish)")
    p.add_argument("--source", default=None, help="clean source tree at the measured tag; re-applies the patches")
    p.add_argument("--run", default=None, metavar="DIR", help="the run folder the bundle was made from: the cost "
                   "channel's verdicts (stats/cost.json, not bundled) are recomputed from its cost/<arm>.json, "
                   "build/<arm>.json, plan.json and stats/summary.json (default: the bundle's parent, when it is "
                   "a run folder; --run '' checks the bundle alone)")
    p.set_defaults(func=_verify)


def _add_scan(sub) -> None:
    p = sub.add_parser("scan", help="run the leak gate over a folder with this machine's identifiers")
    p.add_argument("dir")
    p.set_defaults(func=_scan)


def _add_audit(sub) -> None:
    p = sub.add_parser("audit", help="re-validate every artifact of a run folder and walk its hash chain")
    p.add_argument("run_dir", help="the run folder, results/<label>")
    p.add_argument("--extra", action="append", default=[],
                   help="a file outside the run folder that inputs may name (patch, model); repeatable")
    p.add_argument("--out", help="also write the audit artifact (audit.json) here")
    p.set_defaults(func=_audit)


def _audit(args: argparse.Namespace) -> int:
    from pairbench.integrity.audit import main as audit_main

    argv = [args.run_dir, *(f"--extra={e}" for e in args.extra)] + ([f"--out={args.out}"] if args.out else [])
    return audit_main(argv)


def _add_llama_tree(sub) -> None:
    from pairbench.arms.llamacpp_tree import DEFAULT_VERSION

    p = sub.add_parser("llama-tree", help="make the local llama.cpp repository (tag "
                       "llama-cpp-python-<version>-vendor) from the llama-cpp-python sdist, once")
    p.add_argument("--version", default=DEFAULT_VERSION, help="llama-cpp-python version (default %(default)s)")
    p.add_argument("--cache", default=None, help="cache root (default $PAIRBENCH_CACHE or ~/.cache/pairbench)")
    p.set_defaults(func=_llama_tree)


def _llama_tree(args: argparse.Namespace) -> int:
    import json

    from pairbench.arms.llamacpp_tree import TreeError, ensure_tree

    try:
        info = ensure_tree(args.version, args.cache)
    except TreeError as exc:
        print(f"llama-tree: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=2, sort_keys=True))
    return 0


def _add_gate(sub) -> None:
    p = sub.add_parser("gate", help="the CI decision over a finished run: exit 0 no regression, 1 regression, "
                       "2 inconclusive (when the policy fails it), 3 the run is not valid")
    p.add_argument("run_dir", help="the run folder, results/<label>")
    p.add_argument("--configfile", action="append", default=[], metavar="FILE",
                   help="the config the run was made with (as snakemake's --configfile; repeatable): the run "
                   "must be of it and at its refs now, and its gate: policy applies. Without one, the policy the "
                   "run published applies")
    p.add_argument("--config", dest="set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of --configfile, as snakemake's --config does; repeatable")
    p.add_argument("--root", default=".", help="the repository root the config's paths are relative to "
                   "(default: the current folder)")
    p.add_argument("--markdown", metavar="FILE", help="append the Markdown summary here too "
                   "(e.g. \"$GITHUB_STEP_SUMMARY\")")
    p.add_argument("--junit", metavar="FILE", help="write the JUnit XML here (one test case per gated cell)")
    p.add_argument("--json", metavar="FILE", help="write the gate record (gate.json) here")
    p.set_defaults(func=_gate)


def _gate(args: argparse.Namespace) -> int:
    from pairbench.core.artifacts import write_artifact
    from pairbench.integrity.gate import GateResult, check_run, invalid_record
    from pairbench.publish.gateviews import junit, markdown

    try:
        config = _run_config(args.configfile, args.set, Path(args.root)) if args.configfile or args.set else None
        result = check_run(args.run_dir, config, root=args.root)
    except Exception as exc:  # never exit 0, or with a traceback, on a run that could not be judged
        label = Path(args.run_dir).name or "run"
        result = GateResult(invalid_record(label, [f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)]),
                            published=False)
    record = result.record
    summary = markdown(record)
    print(summary, end="")
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as fh:
            fh.write(summary + "\n")
    if args.junit:
        Path(args.junit).write_text(junit(record), encoding="utf-8")
    if args.json:
        write_artifact(args.json, "gate", {k: v for k, v in record.items() if k != "schema"})
    print(f"pairbench gate: {record['decision']} (exit {record['exit_code']}): {record['reason']}", file=sys.stderr)
    return record["exit_code"]


def _run_config(files: list[str], pairs: list[str], root: Path) -> dict:
    """The config the pipeline would read from *files* and ``--config`` *pairs*
    (:func:`pairbench.stages.runconfig.load_config`: checked whole, defaulted, normalized); its
    problems, each at its file and line, as one :class:`ValueError`."""
    from pairbench.stages import runconfig

    try:
        return runconfig.load_config(files or [runconfig.DEFAULT_FILE], dict(_key_value(i) for i in pairs), root=root)
    except runconfig.ConfigErrors as exc:
        raise ValueError(str(exc).replace("\n", " ")) from None


COMMANDS: list[Callable] = [_add_plan, _add_verify, _add_scan, _add_html_report, _add_audit, _add_llama_tree, _add_gate]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pairbench", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"pairbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    for add in COMMANDS:
        add(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
