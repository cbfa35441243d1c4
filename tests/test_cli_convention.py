"""One flag style across ``kv-sidecar``'s subcommands, and one table of subcommands.

The style (CONTRIBUTING.md, "Command-line flags"): a flag that sets a key of the sidecar's configuration
file is spelled ``--section.key`` as the file spells it, with hyphens for underscores (Prometheus' own
style: ``--web.listen-address``, ``--config.file``, ``--log.level``); every other flag is kebab-case
(``--prometheus-url``); flags that copy an inference server's own (``capacity`` and ``simulate`` take
vLLM's ``--gpu-memory-utilization``, ``--max-model-len``) keep its spelling, which is kebab-case too.
No underscores, no capitals, no single-dash long options.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from sidecar import cli
from sidecar.settings import ALERT_SETTINGS, SETTINGS

KEBAB = r"[a-z0-9]+(?:-[a-z0-9]+)*"
FLAG = re.compile(rf"--{KEBAB}(?:\.{KEBAB})*")
#: dotted flags that are not rows of the settings table: the files themselves and their reload
FILE_FLAGS = {"--config.file", "--web.config.file", "--config.auto-reload-interval"}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    out: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = sub
                out.update({f"{name} {k}": v for k, v in _subparsers(sub).items()})
    return out


def _long_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


def test_every_flag_of_every_subcommand_follows_the_one_style():
    settings = {f"--{s.section}.{s.key}".replace("_", "-") for s in SETTINGS + ALERT_SETTINGS}
    parsers = _subparsers(cli.build_parser())
    assert {"run", "report", "reporter", "capacity", "simulate", "rules", "dashboards", "demo"} <= set(parsers)
    bad, unknown_dotted = [], []
    for name, parser in parsers.items():
        for flag in _long_flags(parser):
            if not FLAG.fullmatch(flag):
                bad.append(f"{name}: {flag}")
            elif "." in flag and flag not in settings | FILE_FLAGS:
                unknown_dotted.append(f"{name}: {flag}")
    assert not bad, f"flags outside the style (kebab-case, dots only for configuration keys): {bad}"
    assert not unknown_dotted, f"dotted flags that name no configuration key: {unknown_dotted}"


def test_the_table_names_every_subcommand_once_and_each_row_adds_exactly_its_names():
    names = [n for row, _ in cli.SUBCOMMANDS for n in row]
    assert len(names) == len(set(names))
    for row, add in cli.SUBCOMMANDS:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        add(sub)
        assert set(sub.choices) == set(row), (row, sorted(sub.choices))


def test_run_builds_only_the_daemons_parser_and_imports_no_other_subcommand():
    code = (
        "import sys\n"
        "from sidecar import cli\n"
        "cli.build_parser('run').parse_args(['run', '--scrape.interval', '5s'])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('sidecar.report', 'sidecar.simulator',"
        " 'sidecar.artifacts', 'sidecar.demo'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
