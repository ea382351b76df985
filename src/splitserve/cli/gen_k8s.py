"""`splitserve gen crds | schema | docs`: write the files generated from `splitserve.api`.

Each command writes into the repository (`--root`, default: the current directory); with
`--check` it writes nothing, lists the files that differ and exits 1 (CI runs it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import click

from splitserve.api import crds
from splitserve.api.chart import ChartValues

CRD_DIRS = ("charts/splitserve/crds", "deploy/crds")
VALUES_SCHEMA = "charts/splitserve/values.schema.json"
CRD_REFERENCE = "docs/crd-reference.md"


def crd_outputs() -> dict[str, str]:
    files = crds.crd_files()
    return {f"{d}/{name}": text for d in CRD_DIRS for name, text in files.items()}


def schema_outputs() -> dict[str, str]:
    return {VALUES_SCHEMA: crds.values_schema(ChartValues)}


def docs_outputs() -> dict[str, str]:
    return {CRD_REFERENCE: crds.reference_markdown()}


def drift(root: Path, outputs: Mapping[str, str]) -> list[str]:
    """Relative paths whose content differs from (or is missing under) `root`."""
    return sorted(
        rel
        for rel, text in outputs.items()
        if not (root / rel).is_file() or (root / rel).read_text() != text
    )


def write(root: Path, outputs: Mapping[str, str]) -> list[str]:
    changed = drift(root, outputs)
    for rel in changed:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(outputs[rel])
    return changed


def _run(root: Path, check: bool, outputs: Callable[[], dict[str, str]], what: str) -> None:
    files = outputs()
    if check:
        stale = drift(root, files)
        if stale:
            click.echo(f"{what} out of date (run `splitserve gen {what}`):", err=True)
            for rel in stale:
                click.echo(f"  {rel}", err=True)
            raise SystemExit(1)
        click.echo(f"{what}: {len(files)} file(s) up to date")
        return
    changed = write(root, files)
    click.echo(f"{what}: wrote {len(changed)} of {len(files)} file(s)")
    for rel in changed:
        click.echo(f"  {rel}")


_root = click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Repository root to write into.",
)
_check = click.option("--check", is_flag=True, help="Write nothing; exit 1 and list stale files.")


@click.group(name="gen-k8s")
def gen_k8s() -> None:
    """Generate the Kubernetes artefacts (CRDs, values schema, CRD reference) from the models."""


@gen_k8s.command(name="crds")
@_root
@_check
def crds_cmd(root: Path, check: bool) -> None:
    """CRDs into charts/splitserve/crds/ and deploy/crds/."""
    _run(root, check, crd_outputs, "crds")


@gen_k8s.command()
@_root
@_check
def schema(root: Path, check: bool) -> None:
    """The chart's values.schema.json."""
    _run(root, check, schema_outputs, "schema")


@gen_k8s.command()
@_root
@_check
def docs(root: Path, check: bool) -> None:
    """docs/crd-reference.md."""
    _run(root, check, docs_outputs, "docs")


@gen_k8s.command(name="k8s")
@_root
@_check
def all_k8s(root: Path, check: bool) -> None:
    """All of the above."""
    _run(root, check, lambda: {**crd_outputs(), **schema_outputs(), **docs_outputs()}, "k8s")


if __name__ == "__main__":  # `python -m splitserve.cli.gen_k8s crds` (the Makefile uses it)
    gen_k8s()
