"""``joynexus tenants new-store``: a new tenant store over a lost or damaged one.

``joynexus serve`` refuses to start when ``tenants.sqlite`` is missing, empty or damaged
beside existing state; restoring the file from a backup keeps every key. This command
is the other way out, asked for explicitly: see
:mod:`joynexus.server.tenant_store_reset`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from joynexus.cli.serve import _fail, console, tenants_app


@tenants_app.command("new-store")
def tenants_new_store(
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="The server's run directory (server stopped).")
    ],
    admin_key_file: Annotated[
        Path | None,
        typer.Option("--admin-key-file", help="Where the admin key is kept (default: run dir)."),
    ] = None,
) -> None:
    """Start a new, empty tenant store where tenants.sqlite is lost or damaged.

    The old store and admin key file are kept aside (renamed), a new admin key is
    written, and the tenants to re-create are listed: every tenant gets new keys
    (and its quotas again); its workloads and checkpoints are kept.
    """
    from joynexus.errors import JoyNexusError
    from joynexus.server.tenant_store_reset import start_new_tenant_store

    key_file = admin_key_file or run_dir / "admin.key"
    try:
        done = start_new_tenant_store(run_dir, admin_key_file=key_file)
    except JoyNexusError as exc:
        raise _fail(exc) from None
    for old in done.kept_aside:
        console.print(f"kept aside: {old}", highlight=False)
    console.print(f"new tenant store {done.store}; admin API key written to {done.admin_key_file}")
    if done.tenants:
        console.print(
            "re-create each tenant and give it its new key (quotas too, if it had any): "
            + "; ".join(f"joynexus tenants create {t}" for t in done.tenants),
            highlight=False,
            soft_wrap=True,
        )
