"""The `splitserve` command group: up | router | worker | gen (| sim | operator).

Imported by `splitserve.cli.main.main` (the console script), which turns Ctrl-C during these
imports into a quiet exit 130.
"""

from __future__ import annotations

import os
from pathlib import Path

# transformers announces at import that PyTorch is absent; the router only needs its tokenizers.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import click

from splitserve import __version__
from splitserve.cli.dashboard import dashboard
from splitserve.cli.gen_dashboards import gen_dashboards
from splitserve.cli.gen_k8s import gen_k8s
from splitserve.cli.gen_model import tiny_model
from splitserve.cli.gen_openai_doc import openai_doc
from splitserve.cli.operator import operator
from splitserve.cli.plan import plan
from splitserve.cli.profile import profile
from splitserve.cli.router import router
from splitserve.cli.sim import sim
from splitserve.cli.up import up
from splitserve.cli.worker import worker


@click.group()
@click.version_option(__version__, prog_name="splitserve")
def cli() -> None:
    """splitserve: disaggregated prefill/decode LLM serving."""


@cli.group()
def gen() -> None:
    """Generate committed artefacts (proto stubs, CRDs, schemas) and local assets."""


@gen.command("proto")
@click.option("--check", is_flag=True, help="Fail if the committed stubs differ.")
@click.option("--proto-root", type=click.Path(path_type=Path), default=Path("proto"))
@click.option("--dest", type=click.Path(path_type=Path), default=Path("src/splitserve/_gen/v1"))
def gen_proto_cmd(check: bool, proto_root: Path, dest: Path) -> None:
    """gRPC stubs from proto/splitserve/v1 into src/splitserve/_gen/v1."""
    from splitserve.cli import gen_proto

    if check:
        changed = gen_proto.drift(proto_root, dest)
        if changed:
            raise click.ClickException(
                "generated stubs drifted from proto/ (run `make gen`): " + ", ".join(changed)
            )
        click.echo("proto stubs are up to date")
        return
    for name in gen_proto.write(proto_root, dest):
        click.echo(f"wrote {dest / name}")


gen.add_command(tiny_model, "tiny-model")
gen.add_command(gen_dashboards, "dashboards")
gen.add_command(openai_doc, "openai-doc")
for name, command in gen_k8s.commands.items():  # crds | schema | docs | k8s
    gen.add_command(command, name)
cli.add_command(up)
cli.add_command(dashboard)
cli.add_command(router)
cli.add_command(operator)
cli.add_command(plan)
cli.add_command(profile)
cli.add_command(sim)
cli.add_command(worker)
