"""Every value of the chart acts, and every value a template reads exists.

A key of values.yaml that no template reads is a value a user sets to no effect (the schema
accepts it, `helm install` renders as if it were not there); a `.Values` reference with no key
in values.yaml / values.schema.json renders an empty string (or fails only with the user's
values). No helm binary is needed: the templates' actions are scanned, following
`{{ with .Values.x }}` scopes (`.y` inside reads `x.y`, a bare `.` reads `x`) and
`$name := .Values.x` aliases (`$name.y` reads `x.y`). Reading a map (e.g. `toYaml` of
`operator.resources`) uses every key under it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts/splitserve"

ACTION = re.compile(r"\{\{-?(.*?)-?\}\}", re.S)
REF = re.compile(r"(\$[A-Za-z_]\w*|\$)?((?:\.[A-Za-z_]\w*)+)|(?<![\w.$)])\.(?![\w.])")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`')
# Helm's own value shared with subcharts: in the schema, not a value of this chart.
HELM_BUILTIN = {"global"}

Scope = tuple[str, ...] | None  # a values path the dot stands for; () is the root; None: other


def _first_word(action: str) -> str:
    words = action.strip().split()
    return words[0] if words else ""


def _refs(action: str, dot: Scope, aliases: dict[str, tuple[str, ...]]) -> Iterator[Scope]:
    """The values paths one action reads (None for what is not a values path)."""
    for m in REF.finditer(action):
        var, chain = m.group(1), m.group(2)
        if chain is None:  # a bare `.`
            yield dot if dot else None
            continue
        names = tuple(chain.lstrip(".").split("."))
        if var == "$" or (var is None and dot == ()):
            yield names[1:] if names[0] == "Values" and len(names) > 1 else None
        elif var is None:
            yield (dot + names) if dot else None
        else:
            base = aliases.get(var)
            yield (base + names) if base is not None else None


def template_reads(text: str) -> set[tuple[str, ...]]:
    """Values paths the template reads: every `.Values` reference, resolved through `with`
    scopes and `$var :=` aliases (the scope or alias itself is not a read)."""
    reads: set[tuple[str, ...]] = set()
    stack: list[Scope] = [()]
    aliases: dict[str, tuple[str, ...]] = {}
    for m in ACTION.finditer(text):
        action = m.group(1).strip()
        if action.startswith("/*"):
            continue
        action = STRING.sub('""', action)
        word = _first_word(action)
        dot = stack[-1]
        if word == "end":
            stack.pop()
            continue
        if word == "else":  # `else if .Values.x` reads x
            reads.update(r for r in _refs(action[len(word) :], dot, aliases) if r)
            continue
        assign = re.match(r"(\$\w+)\s*:=\s*(.*)$", action, re.S)
        if assign:
            target = list(_refs(assign.group(2), dot, aliases))
            if (
                len(target) == 1
                and target[0] is not None
                and assign.group(2).strip().startswith((".Values", "$.Values"))
            ):
                aliases[assign.group(1)] = target[0]
                continue
            reads.update(r for r in target if r)
            continue
        if word == "define" or word == "block":
            stack.append(())  # the templates include these with the root (`.` or `$`)
            continue
        if word == "with":
            header = action[len(word) :].strip()
            target = list(_refs(header, dot, aliases))
            simple = re.fullmatch(r"\$?\.[\w.]+", header)
            if simple and len(target) == 1:
                stack.append(target[0])
                continue
            reads.update(r for r in target if r)
            stack.append(None)
            continue
        if word == "range":
            reads.update(r for r in _refs(action[len(word) :], dot, aliases) if r)
            stack.append(None)
            continue
        if word == "if":
            stack.append(dot)
        reads.update(r for r in _refs(action, dot, aliases) if r)
    assert stack == [()], f"unbalanced template actions: {stack}"
    return reads


def all_reads() -> set[tuple[str, ...]]:
    reads: set[tuple[str, ...]] = set()
    for p in sorted((CHART / "templates").iterdir()):
        reads |= template_reads(p.read_text())
    return reads


def value_leaves(values: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, sub in values.items():
        where = (*path, key)
        if isinstance(sub, dict) and sub:
            yield from value_leaves(sub, where)
        else:
            yield where


def _in_values(values: Any, path: tuple[str, ...]) -> bool:
    for name in path:
        if not isinstance(values, dict) or name not in values:
            return False
        values = values[name]
    return True


def _in_schema(schema: dict[str, Any], path: tuple[str, ...]) -> bool:
    for name in path:
        props = schema.get("properties") or {}
        if name not in props:
            return False
        schema = props[name]
    return True


def test_every_value_is_read_by_a_template() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    reads = all_reads()
    unread = [
        ".".join(leaf)
        for leaf in value_leaves(values)
        if not any(leaf[: len(r)] == r for r in reads)
    ]
    assert unread == [], f"values.yaml keys no template reads (wire or remove them): {unread}"


def test_every_schema_value_is_in_values_yaml() -> None:
    """The schema (what `helm install` accepts) offers no key values.yaml does not document,
    so the check above covers every accepted key (a map's keys are the user's, e.g. labels)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def leaves(s: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
        for name, sub in (s.get("properties") or {}).items():
            where = (*path, name)
            yield from leaves(sub, where) if sub.get("properties") else iter([where])

    missing = [
        ".".join(p)
        for p in leaves(schema)
        if p[0] not in HELM_BUILTIN and not _in_values(values, p)
    ]
    assert missing == [], f"schema keys missing from values.yaml: {missing}"


def test_every_template_read_is_a_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    unknown = sorted(
        ".".join(r) for r in all_reads() if not (_in_values(values, r) and _in_schema(schema, r))
    )
    assert unknown == [], f"templates read values not in values.yaml / schema: {unknown}"


def test_the_scan_follows_scopes_and_aliases() -> None:
    """The scanner itself: a `with` scope, an alias, `$.Values` and a bare dot."""
    text = """
{{- $op := .Values.operator -}}
{{- if $op.a }}x{{ end }}
{{- with .Values.m.p }}{{ if .enabled }}{{ .interval }}{{ with .labels }}{{ toYaml . }}{{ end }}
{{ $.Values.m.q.r }}{{ end }}{{ end }}
{{- range .Values.list }}{{ .name }}{{ end }}
{{- define "t" }}{{ .Values.d }}{{ end }}
"""
    assert template_reads(text) == {
        ("operator", "a"),
        ("m", "p", "enabled"),
        ("m", "p", "interval"),
        ("m", "p", "labels"),
        ("m", "q", "r"),
        ("list",),
        ("d",),
    }
