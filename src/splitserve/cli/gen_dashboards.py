"""`splitserve gen dashboards`: write the Grafana dashboards (`splitserve.obs.dashboards`) to
`deploy/grafana/` and the chart; `--check` writes nothing and fails on drift (CI runs it)."""

from __future__ import annotations

from pathlib import Path

import click

from splitserve.cli.gen_k8s import drift, write


@click.command("dashboards")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Repository root to write into.",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 and list stale files.")
def gen_dashboards(root: Path, check: bool) -> None:
    """Grafana dashboards (JSON) into deploy/grafana/ and charts/splitserve/dashboards/."""
    from splitserve.obs.dashboards import outputs

    files = outputs()
    if check:
        stale = drift(root, files)
        if stale:
            click.echo("dashboards out of date (run `splitserve gen dashboards`):", err=True)
            for rel in stale:
                click.echo(f"  {rel}", err=True)
            raise SystemExit(1)
        click.echo(f"dashboards: {len(files)} file(s) up to date")
        return
    changed = write(root, files)
    click.echo(f"dashboards: wrote {len(changed)} of {len(files)} file(s)")
    for rel in changed:
        click.echo(f"  {rel}")
