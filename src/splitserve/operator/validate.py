"""Validate custom resources offline, as the API server would (minus CEL), plus the models.

`kubernetes-validate` checks built-in kinds only; this checks `LLMService` / `LLMPool` objects
against the CRDs' `openAPIV3Schema` (JSON Schema draft 4 is the closest dialect to OpenAPI 3.0)
with unknown fields rejected, as `kubectl apply`'s strict field validation does, and then parses
the spec with the pydantic model, which also enforces the cross-field (CEL) rules.

    python -m splitserve.operator.validate --crds charts/splitserve/crds deploy/examples/*.yaml
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Any

import click
import jsonschema
import yaml
from pydantic import BaseModel, ValidationError

from splitserve.api import v1alpha1 as v1

FIELD_PREFIX = re.compile(r"^[A-Za-z][\w.\[\]]*: ")
"""A message that starts with the field it is about (`pools.decode: ...`)."""

SPEC_MODELS: Mapping[str, type[BaseModel]] = {
    "LLMService": v1.LLMServiceSpec,
    "LLMPool": v1.LLMPoolSpec,
}


def _strict(node: Any) -> Any:
    """Copy of a structural schema where objects with `properties` reject unknown fields."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def load_crd_schemas(crd_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """{(apiVersion, kind): strict openAPIV3Schema} for every CRD YAML in `crd_dir`."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = deepcopy(version["schema"]["openAPIV3Schema"])
            schemas[(f"{group}/{version['name']}", kind)] = _strict(schema)
    return schemas


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<root>"


def spec_errors(err: ValidationError) -> list[str]:
    """One line per mistake, naming the field under `spec`; no library boilerplate (links)."""
    out = []
    for e in err.errors(include_url=False, include_input=False):  # inputs may be credentials
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["loc"]:
            out.append(f"{_path(('spec', *e['loc']))}: {msg}")
        else:  # spec-level rules may name their field in the message ("pools.decode: ...")
            out.append(f"spec.{msg}" if FIELD_PREFIX.match(msg) else f"spec: {msg}")
    return out


def validate_object(obj: Mapping[str, Any], schemas: Mapping[tuple[str, str], Any]) -> list[str]:
    """Errors for one object, each naming the field (`spec.pools.decode.replicas: ...`)."""
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    name = obj.get("metadata", {}).get("name", "?")
    if key not in schemas:
        return [f"{key[1]}/{name}: no CRD for {key[0]} {key[1]}"]
    validator = jsonschema.Draft4Validator(schemas[key])
    errors = [
        f"{key[1]}/{name}: {_path(e.absolute_path)}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))
    ]
    model = SPEC_MODELS.get(key[1])
    if not errors and model is not None:
        try:
            model.model_validate(obj.get("spec", {}))
        except ValidationError as err:
            errors += [f"{key[1]}/{name}: {line}" for line in spec_errors(err)]
    return errors


def validate_files(paths: Sequence[Path], crd_dir: Path) -> list[str]:
    schemas = load_crd_schemas(crd_dir)
    errors: list[str] = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            if (doc.get("apiVersion") or "").split("/")[0] != v1.GROUP:
                continue
            errors += [f"{path}: {e}" for e in validate_object(doc, schemas)]
    return errors


@click.command()
@click.option(
    "--crds",
    "crd_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="Directory of CRD YAML files.",
)
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
def main(crd_dir: Path, paths: tuple[Path, ...]) -> None:
    """Validate splitserve custom resources in PATHS against the CRDs."""
    errors = validate_files(paths, crd_dir)
    for e in errors:
        click.echo(e, err=True)
    if errors:
        sys.exit(1)
    click.echo(f"{len(paths)} file(s) valid")


if __name__ == "__main__":
    main()
