"""``pcpo-eval bertscore-server``: the BERTScore reward served on LLaVA-server's protocol (:mod:`.server`)."""

from __future__ import annotations

import typer

from pcpo_eval.flags import DEVICE_HELP


def bertscore_server_cmd(
    options: list[str] = typer.Argument(
        None, help="vlm_bertscore options as KEY=VALUE (captioner=llava, scorer=roberta, captioner_dtype=bf16, ...)"
    ),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    host: str = typer.Option("127.0.0.1", "--host", help="interface to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8085, "--port", help="TCP port (8085: the llava_bertscore client's default URL)"),
) -> None:
    """Caption and BERTScore images for every training process's `reward: llava_bertscore`, with the models of
    `reward: vlm_bertscore` loaded once, on a GPU of their own (the paper's setups 3-4); until interrupted."""
    from pcpo_eval.dist import resolve_device
    from pcpo_eval.errors import UserError
    from pcpo_eval.io import check_keys_once, parse_overrides
    from pcpo_eval.rewards import make_reward
    from pcpo_eval.rewards.server import make_server

    if not 0 <= port < 65536:  # before the models load (minutes), not after; 0: any free port
        raise UserError(f"--port {port}; use a TCP port between 1 and 65535 (0: any free port)")
    check_keys_once(options or [], "option")
    opts = parse_overrides(options or [], "option", "captioner=llava")
    if "jpeg_quality" in opts or "device" in opts:
        raise UserError("jpeg_quality and device are the server's own (the client sends JPEGs; use --device)")
    reward = make_reward("vlm_bertscore", **opts, device=resolve_device(device), jpeg_quality=None)
    server = make_server(reward, host, port)
    url = f"http://{host}:{server.server_address[1]}"
    typer.echo(f"[pcpo-eval] bertscore-server on {url} ({reward.settings.get('captioner')} "
               f"{reward.settings.get('captioner_dtype')}, scorer {reward.settings.get('scorer')}); "
               f"training processes: reward: llava_bertscore with PCPO_LLAVA_URL={url}", err=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def register(app: typer.Typer) -> None:
    """Add ``bertscore-server`` to the ``pcpo-eval`` app."""
    app.command("bertscore-server")(bertscore_server_cmd)
