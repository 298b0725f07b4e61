"""`bkctl cluster`: initialize a cluster's metadata, and a one-screen summary of it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bkctl.commands.autorecovery import auditor_fields
from bkctl.commands.options import MetadataOption, Problems, confirm, open_layout
from bkctl.commands.output import OutputOption, message, resolve, write_mapping

app = typer.Typer(help="Cluster metadata: init and info.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="cluster")


@app.command("init")
def init(
    force: Annotated[
        bool,
        typer.Option("--force", help="Wipe an existing cluster's metadata (every ledger!) and start anew."),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before --force wipes.")] = False,
    instance_id: Annotated[
        str | None, typer.Option("--instance-id", help="The cluster's instance id (default: a new UUID).")
    ] = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Create the cluster's metadata (LAYOUT, INSTANCEID, available, cookies, underreplication).

    Exit 10 if a cluster is already there (unless --force).
    """
    fmt = resolve(output)
    with open_layout(metadata, initialized=False) as layout:
        existing = layout.instance_id()
        if force and existing is not None and not yes:
            _confirm_wipe(layout.root, existing)
        created = layout.init_cluster(instance_id=instance_id, force=force)
        root = layout.root
    message(f"cluster initialized at {root}")
    write_mapping({"instance_id": created, "root": root}, fmt)


def _confirm_wipe(root: str, existing: str) -> None:
    confirm(
        f"Delete all metadata under {root} (cluster {existing}), every ledger included?",
        declined="nothing deleted",
        needs_yes="wipe the existing cluster with --force",
    )


@app.command("info")
def info(metadata: MetadataOption = None, output: OutputOption = None) -> None:
    """Instance id, layout, bookies, ledger and under-replicated counts, auditor, autorecovery state."""
    fmt = resolve(output)
    problems = Problems()
    with open_layout(metadata) as layout:
        manager = layout.check_initialized()
        document: dict[str, Any] = {
            "instance_id": layout.instance_id(),
            "root": layout.root,
            "layout": f"{manager.manager_factory_class}:{manager.manager_version}",
            "bookies_rw": layout.bookies(),
            "bookies_ro": layout.bookies(readonly=True),
            "ledger_count": sum(1 for _ in layout.ledger_ids(problems)),
            "underreplicated_count": sum(1 for _ in layout.underreplicated_ids(problems)),
        }
        document.update(auditor_fields(layout, problems))
        document["autorecovery_enabled"] = layout.autorecovery_enabled()
        document["lost_bookie_recovery_delay_s"] = layout.lost_bookie_recovery_delay()
    write_mapping(document, fmt)
    problems.raise_if_any()
