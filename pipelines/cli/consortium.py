"""``fedauc consortium ...``: provision an NVIDIA FLARE consortium's startup kits and run a hospital's client."""

from __future__ import annotations

import typer

from pipelines.cli.application import fail

consortium_app = typer.Typer(help="An NVIDIA FLARE consortium: provision its kits, start its server or a hospital's client.",
                             no_args_is_help=True)


@consortium_app.command("provision")
def consortium_provision(
    federation: str = typer.Argument(..., help="The federation YAML: one client kit per hospital it lists."),
    out: str = typer.Option(..., "--out", help="Folder for project.yml, the root CA state and the kits."),
    server_host: str = typer.Option("localhost", "--server-host", help="The name the hospitals dial (the server's FQDN)."),
    port: int = typer.Option(8002, "--port", min=1, max=65535, help="The server's one port (mutual TLS)."),
    admin: str = typer.Option("admin@fedauc.org", "--admin", help="The project admin who submits trainings."),
) -> None:
    """Write the consortium's project file and startup kits (server, one per hospital, one admin) and say
    what to send to whom."""
    from pathlib import Path

    from common.errors import FedaucError
    from federated.flare.centre.provision import project, provision
    from preprocessing.federation import load_federation

    try:
        kits = provision(project(load_federation(federation), server_host, port, admin), Path(out))
    except FedaucError as err:
        fail(err)
    typer.echo(kits.summary(server_host, port))


@consortium_app.command("renew")
def consortium_renew(
    out: str = typer.Option(..., "--out", help="The folder `fedauc consortium provision` wrote (project.yml, state)."),
    root_valid_days: int = typer.Option(360, "--root-valid-days", min=31,
                                        help="A new root certificate's validity (made only when the root expires within 30 days)."),
) -> None:
    """Re-issue every kit from the same identities (names, organisations, roles; the same root CA key, so old and
    new kits trust each other) in a new provisioning folder, and say what to send to whom, as at provision."""
    import datetime as dt

    import yaml

    from common.errors import FedaucError
    from federated.flare.centre.certificates import kit_expiries
    from federated.flare.centre.provision import renew

    try:
        kits = renew(out, dt.timedelta(days=root_valid_days))
    except FedaucError as err:
        fail(err)
    expiries = kit_expiries(kits.server.parent)
    typer.echo(f"Renewed every kit with the same names: certificates valid until {min(expiries.values()):%Y-%m-%d %H:%M} "
               "UTC. Each participant stops its fedauc, puts its new kit in place of the old one and starts again "
               "(the old kits keep working until they expire).\n")
    server = next(p for p in yaml.safe_load(kits.project_file.read_text())["participants"] if p["type"] == "server")
    typer.echo(kits.summary(server["name"], server["fed_learn_port"]))


@consortium_app.command("start-server")
def consortium_start_server(
    kit: str = typer.Argument(..., help="The server's startup kit (from `fedauc consortium provision`)."),
) -> None:
    """Check the server's kit (its private key its owner's alone), keep its job store in its own workspace,
    then run the consortium's NVFlare server in the foreground until it stops."""
    from common.errors import FedaucError
    from federated.flare.lockdown import STORES
    from federated.flare.server.start import prepare_server, run_server

    try:
        root = prepare_server(kit)
    except FedaucError as err:
        fail(err)
    typer.echo(f"server {root.name}: jobs and snapshots in {root / STORES} (owner-only)")
    raise typer.Exit(code=run_server(root))


@consortium_app.command("start-site")
def consortium_start_site(
    kit: str = typer.Argument(..., help="This hospital's startup kit (from `fedauc consortium provision`)."),
    site_yaml: str = typer.Option(..., "--site-yaml", help="This hospital's site YAML (its name must be the kit's)."),
    shards: str = typer.Option(..., "--shards", help="Where `fedauc preprocess` wrote this site's shards (OUT of --out)."),
) -> None:
    """Check the kit, its certificate, the server and the shards, then run this hospital's NVFlare client
    in the foreground until it stops. The client and its jobs end with this command, however it ends."""
    from common.errors import FedaucError
    from federated.flare.centre.certificates import expiry_warnings
    from federated.flare.site.start import check_certificate, prepare_site, run_site
    from pipelines.lifeline import guard_children

    guard_children()  # after a kill -9 of this process, its guardian ends what the client started too

    try:
        client = prepare_site(kit, site_yaml, shards)
    except FedaucError as err:
        fail(err)
    expires = check_certificate(client)
    typer.echo(f"site {client.name}: certificate valid until {expires:%Y-%m-%d %H:%M} UTC; "
               f"dialling {client.server_host}:{client.server_port}")
    for line in expiry_warnings({client.name: expires}):
        typer.echo(line, err=True)
    raise typer.Exit(code=run_site(client))


@consortium_app.command("status")
def consortium_status(
    kit: str = typer.Option(..., "--kit", help="The admin's startup kit (the admin@... folder of `provision`)."),
    announce: str = typer.Option(None, "--announce",
                                 help="The fedauc version the centre announces (default: the one it runs); "
                                      "the hospitals that report another are named."),
) -> None:
    """The connected sites (since when, their last heartbeat, the fedauc version each runs, which lag behind the
    centre's) and the running jobs with their round, from the consortium's server; a warning for each kit
    certificate or root CA that expires within 30 days."""
    from pathlib import Path

    from federated.flare.centre.certificates import expiry_warnings, kit_expiries
    from federated.flare.centre.operate import consortium_status as status

    # The admin's kit sits in the provisioning folder with every other kit (on the admin's machine).
    for line in expiry_warnings(kit_expiries(Path(kit).resolve().parent)):
        typer.echo(line, err=True)
    from federated.version import code_version

    found = status(kit)
    typer.echo(found.markdown())
    typer.echo("")
    typer.echo(found.versions(announce or code_version()))


@consortium_app.command("stop-server")
def consortium_stop_server(
    kit: str = typer.Option(..., "--kit", help="The admin's startup kit (the admin@... folder of `provision`)."),
    timeout: float = typer.Option(60.0, "--timeout", min=1.0, help="Seconds to wait for the server to stop."),
) -> None:
    """Stop the consortium's server (no question asked) and wait until it no longer answers. Refused while a
    hospital's client still heartbeats (the command names them); one silent for 25 s (stopped without
    logging out) is dropped from the server's list first."""
    from common.errors import FedaucError
    from federated.flare.centre.operate import SILENT_S, stop_server

    try:
        dropped = stop_server(kit, timeout)
    except FedaucError as err:
        fail(err)
    for name in dropped:
        typer.echo(f"hospital {name}: silent for over {SILENT_S:.0f} s (stopped without logging out), dropped from the "
                   "server's list")
    typer.echo("the consortium's server stopped")
