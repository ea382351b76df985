"""`splitserve profile`: measure a live worker's step times into a latency table (issue 4.2)."""

from __future__ import annotations

import click


@click.command()
def profile() -> None:
    """Measure a live worker's step times into a profile table (not implemented yet)."""
    raise click.ClickException("splitserve profile is not implemented yet")
