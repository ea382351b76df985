"""A file's pydantic validation errors as one line per problem (shared by the CLI's config files
and the router's API key file; was one copy in each).

`path: key.path: why (got value)`: the file, the key path as the file writes it, pydantic's
message, and the value given. The value is echoed only when it is a plain scalar (a missing
key's "value" is the whole mapping around it), its key is one the file may have (an unknown
key may be a misspelled secret: `key: sk-...` for `keys`) and no part of its key path is one of
`secret` (a key in clear, or its digest, is never printed, whichever spelling the file used).

`one_line` is the same errors in one line (`key=value: why; ...`) for a flag's value or a
scenario file, `yaml_problem` yaml's own (several-line) report as one line, and `utf8_problem`
a file that is not text.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError


def validation_lines(
    path: Path,
    err: ValidationError,
    prefix: str = "",
    names: Mapping[str, str] | None = None,
    secret: Collection[str] = (),
) -> str:
    """One line per problem of `err`, joined by newlines. `prefix` goes before every key path;
    `names` renames a top-level model field to the file's key; a value whose key path holds a
    name in `secret`, or under an unknown key, is never echoed (give both spellings, `keySha256`
    and `key_sha256`)."""
    lines = []
    for e in err.errors():
        loc = [str(part) for part in e["loc"]]
        hidden = e["type"] == "extra_forbidden" or any(part in secret for part in loc)
        if names and loc and loc[0] in names:
            loc[0] = names[loc[0]]
        key = prefix + ".".join(loc) or "(top level)"
        line = f"{path}: {key}: {str(e['msg']).removeprefix('Value error, ')}"
        value = e.get("input")
        if loc and not hidden and isinstance(value, str | int | float | bool):
            line += f" (got {value!r})"
        lines.append(line)
    return "\n".join(lines)


def one_line(err: ValidationError) -> str:
    """Pydantic's errors as `key=value: why; ...` (it was pydantic's block, with its URL; the
    value left out where it adds nothing: a missing or unknown key, a whole-model check)."""
    parts = []
    for e in err.errors():
        loc = ".".join(map(str, e["loc"]))
        msg = str(e["msg"]).removeprefix("Value error, ")
        if not loc:
            parts.append(msg)
        elif e["type"] in ("missing", "extra_forbidden"):
            parts.append(f"{loc}: {msg}")
        else:
            parts.append(f"{loc}={e['input']!r}: {msg}")
    return "; ".join(parts)


def yaml_problem(err: yaml.YAMLError) -> str:
    """`not YAML (line N): what` in one line (yaml's own report is several, with a caret)."""
    mark = getattr(err, "problem_mark", None)
    at = f" (line {mark.line + 1})" if mark is not None else ""
    why = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"not YAML{at}: {why}"


def utf8_problem(err: UnicodeDecodeError) -> str:
    """`not UTF-8 text (why at byte N)`: a file that is not text (the codec's own message)."""
    return f"not UTF-8 text ({err.reason} at byte {err.start})"
