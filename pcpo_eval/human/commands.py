"""CLI commands ``human design|bundle|raters|serve|export|simulate|analyze`` (thin shell over :mod:`pcpo_eval.human`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from pcpo_eval.errors import UserError

human_app = typer.Typer(help="Human preference study: pair design, rating web app, analysis (docs/human.md).",
                    no_args_is_help=True)

DB_HELP = "database URL (default sqlite:///HUMAN/human.db; PostgreSQL: postgresql+psycopg://user@host/db)"


def _url(folder: Path, database_url: str | None) -> str:
    from pcpo_eval.human import HumanLayout

    return database_url or HumanLayout(folder).database_url


def _database(folder: Path, database_url: str | None) -> str:
    """The study's database, migrated to the newest schema and holding the design's pairs.

    Any database failure (unreachable server, missing driver, read-only or non-SQLite file) is one
    ``error:`` line (:func:`pcpo_eval.human.db.database_errors`)."""
    from pcpo_eval.human.bundle import served_pairs
    from pcpo_eval.human.db import database_errors, load_pairs, upgrade

    pairs = served_pairs(folder)
    url = _url(folder, database_url)
    with database_errors(url):
        upgrade(url)
        load_pairs(url, pairs)
    return url


def _base_url(folder: Path, base_url: str | None) -> str:
    """``--base-url`` (checked; :func:`_remember_base_url` stores it once the command has succeeded), else
    the one remembered in HUMAN/server.json, else a UserError."""
    from pcpo_eval.human import HumanLayout
    from pcpo_eval.human.app import origin_of

    lay = HumanLayout(folder)
    if base_url is not None:
        if origin_of(base_url) is None or not base_url.lower().startswith(("http://", "https://")):
            raise UserError(f"--base-url {base_url!r}: give the address raters open, e.g. https://rate.example.org "
                            "or http://HOST:8000/PREFIX")
        return base_url.rstrip("/")
    saved = lay.remembered_base_url()
    if saved is not None and origin_of(saved):
        return saved
    raise UserError("no address for the rater links yet; pass --base-url with the address raters open "
                    "(e.g. https://rate.example.org, or http://HOST:8000 on your network); it is remembered")


def _remember_base_url(folder: Path, base_url: str | None) -> None:
    """Store a given ``--base-url`` in HUMAN/server.json, after the command's checks and work succeeded (a
    refused command leaves the remembered address as it was)."""
    from pcpo_eval.human import HumanLayout
    from pcpo_eval.io import atomic_write_json

    if base_url is not None:
        atomic_write_json(HumanLayout(folder).server, {"base_url": base_url.rstrip("/")})


@human_app.command("design")
def design_cmd(
    study: Path = typer.Argument(..., help="finished study folder (holds selection.json)"),
    out: Path = typer.Option(..., "--out", help="human study folder to create (pairs, images, database)"),
    config: Path | None = typer.Option(None, "--config", help="design file (YAML), e.g. analysis/human/toy_human.yaml"),
    device: str = typer.Option("auto", "--device", help="device that renders the images: auto, cpu or cuda:N"),
) -> None:
    """Choose the checkpoints (bracketing the matched reward), render them, and write the pairs."""
    import dataclasses

    from pcpo_eval.dist import resolve_device
    from pcpo_eval.human.design import load_design_spec, make_design

    ds = dataclasses.replace(load_design_spec(config), device=resolve_device(device))
    d = make_design(study, out, ds, log=typer.echo, progress=True)
    secret = d.get("seed_draw") == "secret"  # their seeds stay in design.json, off the console and its logs
    seeds = {} if secret else d.get("comparison_seed_ranges") or {}
    typer.echo(f"design: {d['n_pairs']} pairs ({d['n_main']} compared, {d['n_pairs'] - d['n_main']} attention "
               f"checks) over {', '.join(f'{c} (seeds {seeds[c]})' if c in seeds else c for c in d['comparisons'])}"
               f"{' (secret seeds: design.json)' if secret else ''}; {d['n_images']} images in {out}")


@human_app.command("bundle")
def bundle_cmd(
    folder: Path = typer.Argument(..., help="human study (design) folder"),
    out: Path = typer.Option(..., "--out", help="serving bundle folder to create (new or empty)"),
) -> None:
    """Write what the rating app needs, and nothing that unblinds, to deploy on the serving machine."""
    from pcpo_eval.human.bundle import make_bundle

    make_bundle(folder, out, log=typer.echo)


@human_app.command("raters")
def raters_cmd(
    folder: Path = typer.Argument(..., help="human study folder or serving bundle"),
    add: list[str] = typer.Option([], "--add", help="add a rater by name (repeat the flag for several)"),
    revoke: list[str] = typer.Option([], "--revoke", help="revoke a rater's link now (their answers are kept)"),
    rotate: list[str] = typer.Option([], "--rotate", help="give a rater a new link (the old one stops working)"),
    base_url: str | None = typer.Option(None, "--base-url", help="address raters open, with any --root-path, "
                                        "e.g. https://rate.example.org/study (remembered in HUMAN/server.json)"),
    database_url: str | None = typer.Option(None, "--database-url", help=DB_HELP),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Add, revoke or rotate raters, and print every rater's private link with their progress."""
    from pcpo_eval.human import HumanLayout
    from pcpo_eval.human.db import add_raters, database_errors, progress, rater_links
    from pcpo_eval.human.db import revoke as revoke_rater
    from pcpo_eval.human.db import rotate as rotate_rater
    from pcpo_eval.human.settings import read_settings

    if add or rotate:  # a new link would show a closed study's pairs, which its report labels, to a rater
        HumanLayout(folder).require_open("add raters or give new links")
    url = _database(folder, database_url)
    base = _base_url(folder, base_url)
    settings = read_settings(HumanLayout(folder))
    with database_errors(url):
        _check_rater_names(add, revoke, rotate, {name for name, _ in rater_links(url, base)})
        if add:
            add_raters(url, add)
        for name in revoke:
            revoke_rater(url, name)
        for name in rotate:
            rotate_rater(url, name)
        links = rater_links(url, base)
        prog = progress(url, per_rater=settings.per_rater).set_index("rater") if links else None
    _remember_base_url(folder, base_url)
    rows = [{"rater": name, "link": link, **({k: int(v) for k, v in prog.loc[name].items()
                                               if k not in ("rater_id", "revoked")}
                                              if prog is not None and name in prog.index else {}),
             "revoked": link == "revoked"}
            for name, link in links]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no raters yet; add them with --add NAME")
    for r in rows:
        typer.echo(f"{r['rater']}: {r['link']}  ({r.get('answered', 0)} of {r.get('total', '?')} answered)")


def _check_rater_names(add: list[str], revoke: list[str], rotate: list[str], existing: set[str]) -> None:
    """Every name of one ``human raters`` call checked before the database changes (a bad name after a good
    one left the good change applied behind an error), and no name both revoked and rotated (rotating after
    revoking handed the revoked rater a new live link)."""
    both = sorted(set(revoke) & set(rotate))
    if both:
        raise UserError(f"{', '.join(both)} given to both --revoke and --rotate: a rotation issues a new live link, "
                        "so the revocation would not hold; nothing was changed: revoke, or rotate, not both")
    again = sorted({n for n in add if n in existing} | {n for n in add if add.count(n) > 1})
    if again:
        raise UserError(f"--add {', '.join(again)}: already a rater (or named twice); nothing was changed: "
                        "choose another name, or --rotate to give them a new link")
    unknown = sorted({n for n in (*revoke, *rotate) if n not in existing and n not in add})
    if unknown:
        raise UserError(f"no rater named {', '.join(map(repr, unknown))}; nothing was changed (raters: "
                        f"{', '.join(sorted(existing)) or 'none yet'})")


@human_app.command("serve")
def serve_cmd(
    folder: Path = typer.Argument(..., help="human study folder or serving bundle (`human bundle`)"),
    host: str = typer.Option("127.0.0.1", "--host", help="interface to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8000, "--port", help="TCP port"),
    root_path: str = typer.Option("", "--root-path", help="path prefix a reverse proxy serves the app under, "
                                  "e.g. /rate (the proxy may strip it or not)"),
    base_url: str | None = typer.Option(None, "--base-url", help="public address raters open (answers from its "
                                        "origin are accepted; remembered for `human raters`)"),
    database_url: str | None = typer.Option(None, "--database-url", help=DB_HELP),
) -> None:
    """Serve the rating web app (uvicorn) until interrupted; answers are stored as they arrive."""
    from pcpo_eval.human import HumanLayout
    from pcpo_eval.human.app import normalize_root_path, serve

    if not 0 < port < 65536:
        raise UserError(f"--port {port}; use a TCP port between 1 and 65535")
    HumanLayout(folder).require_open("serve pairs")
    normalize_root_path(root_path)
    if base_url is not None:
        _base_url(folder, base_url)
    _check_port(host, port)
    _remember_base_url(folder, base_url)
    serve(folder, host=host, port=port, database_url=database_url, root_path=root_path,
          base_url=base_url)  # migrates, loads the pairs and checks the database is writable itself


def _check_port(host: str, port: int) -> None:
    """A one-line error when ``host:port`` cannot be listened on (in use, or not this machine's)."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port or "
                        "--host") from None


@human_app.command("export")
def export_cmd(
    folder: Path = typer.Argument(..., help="human study folder or serving bundle"),
    output: Path | None = typer.Option(None, "--output", "-o", help="Parquet file [HUMAN/responses.parquet]"),
    database_url: str | None = typer.Option(None, "--database-url", help=DB_HELP),
) -> None:
    """Export every stored response to Parquet (one row per rater and pair)."""
    from pcpo_eval.human import HumanLayout
    from pcpo_eval.human.db import database_errors, export_parquet, require_stored, sqlite_files
    from pcpo_eval.io import check_out_path

    url = _url(folder, database_url)
    path = check_out_path(output or HumanLayout(folder).responses, "--output", folder=False,
                          inputs=[*HumanLayout(folder).data_paths(responses=False), *sqlite_files(url)])
    require_stored(url, folder, "analyse an export with `human analyze --responses`")
    url = _database(folder, database_url)
    with database_errors(url):
        written = export_parquet(url, path)
    typer.echo(f"wrote {len(written)} responses to {path}")


@human_app.command("simulate")
def simulate_cmd(
    folder: Path = typer.Argument(..., help="human study folder"),
    output: Path = typer.Option(..., "--output", "-o", help="Parquet file of simulated responses"),
    raters: int = typer.Option(15, "--raters", help="number of simulated raters"),
    per_rater: int = typer.Option(None, "--per-rater", help="main-pair answers per simulated rater (default: the "
                                  "main pairs of one rater's block in the design, else 20)"),
    prefer: list[str] = typer.Option([], "--prefer", help="LABEL=P: raters pick checkpoint LABEL with probability P"),
    rng_seed: int = typer.Option(0, "--rng-seed", help="seed of the simulation"),
) -> None:
    """Simulated raters (planted preferences) to rehearse the analysis; never written to the database.

    The file is marked simulated (a ``simulated`` column): `human analyze --responses` on it writes
    to HUMAN/rehearsal/ and labels everything SIMULATED, never the study's report."""
    from pcpo_eval.human import HumanLayout
    from pcpo_eval.human.design import read_design
    from pcpo_eval.human.simulate import simulate_responses
    from pcpo_eval.io import atomic_write_parquet, check_out_path

    design, pairs = read_design(folder)
    p = _parse_prefer(prefer, set(pairs["left_method"]) | set(pairs["right_method"]))
    check_out_path(output, "--output", folder=False, inputs=HumanLayout(folder).data_paths())
    kinds = pairs["kind"].value_counts()
    n_main = int(kinds.get("main", 0))
    if per_rater is None:  # rehearse the design: the main pairs of one rater's block, as the app cuts it
        from pcpo_eval.human.db import block_counts

        block = design.get("per_rater")
        per_rater = block_counts(n_main, int(kinds.get("identical", 0)), int(kinds.get("degraded", 0)),
                                 int(block))[0] if block else min(20, n_main)
        typer.echo(f"{per_rater} main-pair answers per simulated rater ("
                   + (f"the main pairs of a block of the design's per_rater {block}" if block
                      else "the design sets no per_rater")
                   + "; --per-rater to change)")
    if raters < 1 or per_rater < 1:
        raise UserError("--raters and --per-rater must be >= 1")
    if per_rater > n_main:  # said, not silent (a review found 5000 capped without a word)
        typer.echo(f"--per-rater {per_rater}: the design has {n_main} main pairs, so each simulated rater answers "
                   f"all {n_main}")
        per_rater = n_main
    df = simulate_responses(pairs, raters, per_rater, p or 0.5, rng_seed)
    atomic_write_parquet(output, df, private=True)  # a planted preference's answers name each pair's side
    typer.echo(f"wrote {len(df)} SIMULATED responses of {raters} raters to {output} (for rehearsals: `pcpo-eval "
               f"human analyze {folder} --responses {output}` writes to {folder}/rehearsal/)")


def _parse_prefer(items: list[str], labels: set[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        label, _, p = item.rpartition("=")
        try:
            val = float(p)
        except ValueError:
            val = float("nan")
        if not label or label not in labels or not 0 <= val <= 1:
            raise UserError(f"--prefer {item!r}: write LABEL=P with P in [0, 1] and LABEL one of "
                            f"{', '.join(sorted(labels))}")
        out[label] = val
    return out


@human_app.command("analyze")
def analyze_cmd(
    folder: Path = typer.Argument(..., help="human study folder"),
    responses: Path | None = typer.Option(None, "--responses", help="analyse this Parquet export instead of the database"),
    bootstrap: int = typer.Option(1000, "--bootstrap", help="bootstrap resamples of the Bradley-Terry CIs"),
    database_url: str | None = typer.Option(None, "--database-url", help=DB_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the analysis as JSON"),
    exclude_revoked: bool = typer.Option(False, "--exclude-revoked", help="drop every answer of a rater whose "
                                         "link is revoked (default: keep those given before the revocation)"),
    final: bool = typer.Option(False, "--final", help="the study is closed (no rater will be shown more pairs): "
                               "add example pairs, the shown images labelled by checkpoint, to the report"),
) -> None:
    """Win rates, Bradley-Terry, mixed logistic model, agreement, attention checks; the report section."""
    from pcpo_eval.human.report import analyze_folder

    res = analyze_folder(folder, responses=responses, database_url=database_url, bootstrap=bootstrap,
                         log=(lambda s: None) if as_json else typer.echo, exclude_revoked=exclude_revoked,
                         final=final)
    if as_json:
        typer.echo(json.dumps(res, indent=2))


def register(app: typer.Typer) -> None:
    """Add the ``human`` command group to the ``pcpo-eval`` app."""
    app.add_typer(human_app, name="human")
