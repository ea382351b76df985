"""Every `splitserve ...` command line the docs show names a real subcommand and only flags that
subcommand accepts (with a value from its choices where the flag has choices), checked against
the click parsers without running anything.

Read: README.md, docs/**/*.md and the operator/, router/, worker/ READMEs; fenced code blocks
(with `\\` continuations joined) and inline `code` spans (which may wrap onto the next line,
not out of a table row). A command ends at `#`, `&&`, `||`, `;`, `|`, `--` (what follows `--`
goes to vLLM) or a word opening a parenthesis (prose); `[`/`]` around optional parts are
dropped, `{a,b}` lists alternatives, and placeholders (`...`, `<x>`, `$X`, upper-case names such
as PAPER or DIR) stand for any value. Lines that name splitserve without running the command
(a pip or Helm line) are skipped by EXCEPTIONS below, each with its reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from splitserve.cli.main import cli

ROOT = Path(__file__).resolve().parents[3]
DOCS = (
    [ROOT / "README.md"]
    + sorted((ROOT / "docs").rglob("*.md"))
    + [ROOT / c / "README.md" for c in ("operator", "router", "worker")]
)
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"`([^`\n]+)`")
# `splitserve` as a program: at the start, after a path (.venv/bin/), after `--` of kubectl exec
# or after an environment assignment; not `splitserve_*`, `splitserve-sim` or `splitserve.x`.
PROGRAM = re.compile(r"(?:^|(?<=[\s/]))splitserve(?=\s+[a-z])")
SEPARATORS = {"&&", "||", ";", "|", "--", ">", ">>", "2>&1", "&"}
PLACEHOLDER = re.compile(r"^(\.\.\.|<.*>|\$.*|[A-Z][A-Z0-9_]*([=:,].*)?|.*\.\.\.)$")

EXCEPTIONS: dict[str, str] = {
    # `pip install splitserve ...` installs the package; `helm ... splitserve charts/...` names a
    # release; neither runs the splitserve command.
    "pip install splitserve": "a pip install line, not the splitserve command",
    "helm install splitserve": "a Helm release name",
    "helm upgrade splitserve": "a Helm release name",
    "helm uninstall splitserve": "a Helm release name",
}


@dataclass(frozen=True)
class Shown:
    where: str
    line: str


def _commands(text: str) -> list[str]:
    """The command lines of one Markdown file: fenced lines (continuations joined), and inline
    spans of the prose, a paragraph at a time (a span may wrap onto the next line)."""
    out: list[str] = []
    in_fence = False
    pending = ""
    paragraph: list[str] = []

    def spans() -> None:
        out.extend(m.group(1) for m in INLINE.finditer(" ".join(paragraph)))
        paragraph.clear()

    for line in text.splitlines():
        if FENCE.match(line):
            spans()
            in_fence = not in_fence
            pending = ""
            continue
        if in_fence:
            joined = (pending + " " + line.strip()) if pending else line
            if joined.rstrip().endswith("\\"):
                pending = joined.rstrip()[:-1]
                continue
            pending = ""
            out.append(joined)
        elif line.lstrip().startswith("|"):  # a table row: its spans end in its cells
            spans()
            paragraph.append(line.strip())
            spans()
        elif line.strip():
            paragraph.append(line.strip())
        else:
            spans()
    spans()
    return out


def shown_commands() -> list[Shown]:
    found: list[Shown] = []
    for path in DOCS:
        rel = path.relative_to(ROOT).as_posix()
        for line in _commands(path.read_text(encoding="utf-8")):
            if any(key in line for key in EXCEPTIONS):
                continue
            for match in PROGRAM.finditer(line):
                found.append(Shown(rel, line[match.start() :].strip()))
    return found


def _tokens(line: str) -> list[str]:
    """The arguments after `splitserve`, up to the end of this command."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = list(lexer)[1:]
    out: list[str] = []
    for word in words:
        if word in SEPARATORS or word.startswith("("):  # `... up (1 prefill, 1 decode)`: prose
            break
        word = word.strip("[]")
        if word:
            out.append(word)
    return out


def _is_placeholder(value: str) -> bool:
    return bool(PLACEHOLDER.match(value))


def _check_value(param: click.Parameter, value: str, where: str) -> list[str]:
    if not isinstance(param.type, click.Choice) or _is_placeholder(value):
        return []
    choices = {str(c) for c in param.type.choices}
    if value.startswith("{") and value.endswith("}"):  # `{distserve,splitwise,...}`: each
        value = value[1:-1].replace(",", "|")
    bad = [v for v in value.split("|") if v not in choices]
    return [f"{where}: {param.name}={v!r} is not one of {sorted(choices)}" for v in bad]


def problems(line: str) -> list[str]:
    """What is wrong with one shown command line (empty when the parsers accept it)."""
    args = _tokens(line)
    command: click.Command = cli
    path = ["splitserve"]
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        if _is_placeholder(args[0]):
            return []
        sub = command.commands.get(args[0])
        if sub is None:
            return [f"`{' '.join(path)}` has no subcommand {args[0]!r}"]
        command = sub
        path.append(args.pop(0))
    name = " ".join(path)
    options: dict[str, click.Option] = {}
    for param in command.params:
        if isinstance(param, click.Option):
            for opt in (*param.opts, *param.secondary_opts):
                options[opt] = param
    options["--help"] = click.Option(["--help"], is_flag=True)
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    out: list[str] = []
    positional: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if word.startswith("-") and word != "-":
            flag, eq, value = word.partition("=")
            option = options.get(flag)
            if option is None:
                out.append(f"`{name}` has no option {flag}")
                continue
            if option.is_flag or option.count:
                if eq:
                    out.append(f"`{name} {flag}` is a flag and takes no value")
                continue
            if not eq:
                if i >= len(args):  # `--backend` named in prose, its value left out
                    continue
                value = args[i]
                i += 1
            out.extend(_check_value(option, value, f"`{name} {flag}`"))
        elif word != "...":  # `--worker HOST:PORT ...`: more of the same
            positional.append(word)
    if isinstance(command, click.Group):
        return out
    takes = sum(-1_000 if a.nargs == -1 else a.nargs for a in arguments)
    if positional and takes >= 0 and len(positional) > takes:
        out.append(f"`{name}` takes {takes} argument(s), the doc gives {positional}")
    for argument, value in zip(arguments, positional, strict=False):
        out.extend(_check_value(argument, value, f"`{name}` {argument.name}"))
    return out


SHOWN = shown_commands()


def test_the_docs_show_commands() -> None:
    """The reader found the command lines (a broken reader would pass everything)."""
    assert len(SHOWN) > 150
    assert {s.where for s in SHOWN} >= {"README.md", "docs/simulator.md", "docs/slo.md"}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("splitserve up --prefill 2 --decode 2 --port 8000", []),
        ("splitserve up --prefil 2", ["`splitserve up` has no option --prefil"]),
        ("splitserve sim reproduce PAPER [--quick] [--latency roofline|gpu]", []),
        ("splitserve sim reproduce distserve --latency cpu", ["not one of"]),
        ("splitserve sim reproduce {distserve,bros}", []),
        ("splitserve sim reproduce {distserve,vidur}", ["'vidur' is not one of"]),
        ("splitserve sim reproduc x", ["has no subcommand 'reproduc'"]),
        ("splitserve up --engine vllm --model DIR -- --dtype bfloat16", []),
        ("splitserve up --autoscale=1", ["is a flag and takes no value"]),
        ("splitserve sim run a.yaml b.yaml", ["takes 1 argument(s)"]),
    ],
)
def test_the_checker_itself(line: str, expected: list[str]) -> None:
    got = problems(line)
    assert len(got) == len(expected), got
    for text, want in zip(got, expected, strict=True):
        assert want in text


def test_every_shown_command_parses() -> None:
    bad = [f"{s.where}: {s.line}\n    {p}" for s in SHOWN for p in problems(s.line)]
    assert not bad, "\n".join(bad)
