"""``pcpo-eval credit ddim|flow``: print, export and plot native vs PCPO credit weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pcpo_eval.credit.ddim import (
    DEFAULT_CONVENTION,
    DEFAULT_FALLBACK,
    DDIMSchedulerConfig,
    ddim_schedule,
    pcpo_ddim_credit,
    read_scheduler_config,
)
from pcpo_eval.errors import UserError
from pcpo_eval.io import check_out_path

credit_app = typer.Typer(help="Per-timestep credit weights: native vs PCPO (paper Fig. 2).", no_args_is_help=True)


def _emit(summary: dict[str, Any], as_json: bool, columns: list[str], header: str) -> None:
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    typer.echo(header)
    typer.echo("  ".join(f"{c:>14}" for c in columns))
    for st in summary["steps"]:
        typer.echo("  ".join(f"{st[c]:>14.6g}" if isinstance(st[c], float) else f"{st[c]!s:>14}" for c in columns))


_SD1 = DDIMSchedulerConfig()


def _check_plot(plot: Path | None) -> None:
    """``--plot`` must be a writable ``.png`` path (its .svg and .pdf are written beside it)."""
    if plot is None:
        return
    check_out_path(plot, "--plot", folder=False)
    if plot.suffix.lower() != ".png":
        raise UserError(f"--plot {plot} must end in .png (the .svg and .pdf are written beside it); "
                        f"e.g. --plot {plot.with_suffix('.png')}")


@credit_app.command("ddim")
def ddim_cmd(
    steps: Annotated[int, typer.Option(help="Number of DDIM inference steps.")] = 50,
    eta: Annotated[float, typer.Option(help="DDIM eta (> 0).")] = 1.0,
    beta_schedule: Annotated[
        str, typer.Option(help="linear | scaled_linear | squaredcos_cap_v2")
    ] = _SD1.beta_schedule,
    beta_start: Annotated[float, typer.Option()] = _SD1.beta_start,
    beta_end: Annotated[float, typer.Option()] = _SD1.beta_end,
    train_steps: Annotated[int, typer.Option("--num-train-timesteps", help="the scheduler's num_train_timesteps (diffusers)")] = _SD1.train_steps,
    spacing: Annotated[str, typer.Option(help="leading | trailing | linspace")] = _SD1.spacing,
    offset: Annotated[int, typer.Option(help="steps_offset")] = _SD1.offset,
    set_alpha_to_one: Annotated[bool, typer.Option()] = _SD1.set_alpha_to_one,
    scheduler_config: Annotated[
        Path | None, typer.Option(help="A diffusers scheduler_config.json (overrides the beta/spacing flags).")
    ] = None,
    convention: Annotated[
        str, typer.Option(help="residual (w = C/sigma^2, paper Fig. 2) | unit (w = C/sigma, Eq. logrho)")
    ] = DEFAULT_CONVENTION,
    w_target: Annotated[float | None, typer.Option(help="Target weight w*; default: mean native weight.")] = None,
    fallback: Annotated[
        str, typer.Option(help="Steps no sigma brings to w*: cap (weight w*) | exclude | nearest | native.")
    ] = DEFAULT_FALLBACK,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summary.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Write Figure 2 (a)-(d) to this PNG (300 dpi), with .svg and .pdf beside it.")] = None,
) -> None:
    """DDIM native weights w(t) and PCPO's re-solved sigma~_t (paper Prop. 1, Fig. 2a-b; docs/credit.md).

    Per step: sigma, sigma~, their ratio, native and PCPO (effective) weights, each step's share of the
    total weight, and the fallback steps.
    """
    _check_plot(plot)
    if scheduler_config is not None:
        cfg = read_scheduler_config(scheduler_config)
    else:
        cfg = DDIMSchedulerConfig(train_steps=train_steps, beta_start=beta_start, beta_end=beta_end,
                                  beta_schedule=beta_schedule, spacing=spacing, offset=offset,
                                  set_alpha_to_one=set_alpha_to_one).to_dict()
    credit = pcpo_ddim_credit(ddim_schedule(cfg, steps, eta), convention, w_target, fallback)  # type: ignore[arg-type]
    summary = credit.to_dict()
    if plot is not None:
        from pcpo_eval.credit.plot import save_credit_figure

        save_credit_figure(plot, ddim=credit)
    _emit(
        summary,
        as_json,
        ["index", "timestep", "sigma", "pcpo_sigma", "sigma_ratio", "native_weight", "native_share",
         "effective_weight", "pcpo_share", "fallback"],
        f"DDIM {steps} steps, eta={eta}, convention={convention}: mean native weight "
        f"{summary['mean_native_weight']:.4f}, w*={summary['w_target']:.4f}, "
        f"fallback ({fallback}) at steps {summary['fallback_steps']} carrying "
        f"{summary['fallback_weight_share']:.1%} of the weight, max weight {summary['max_effective_weight_over_w_target']:.3g} w*",
    )


@credit_app.command("flow")
def flow_cmd(
    sde: Annotated[str, typer.Option(help="dance (sigma=eta) | flowgrpo (sigma=eta*sqrt(t/(1-t)))")] = "dance",
    steps: Annotated[int, typer.Option(help="Number of SDE steps N.")] = 16,
    eta: Annotated[float, typer.Option(help="Noise level eta (> 0).")] = 0.3,
    shift: Annotated[float, typer.Option(help="Time shift (> 0).")] = 3.0,
    t1: Annotated[str, typer.Option(help="Flow-GRPO t=1 weight: neighbor | sigma_max")] = "neighbor",
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summary.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Write Figure 2 (a)-(d) to this PNG (300 dpi), with .svg and .pdf beside it.")] = None,
) -> None:
    """Flow SDE native weights and PCPO's proportional weights zeta*dt (paper Prop. 2, Fig. 2c-d)."""
    from pcpo_eval.credit.flow import flow_credit

    _check_plot(plot)
    credit = flow_credit(sde, steps, eta, shift, t1=t1)
    summary = credit.to_dict()
    if plot is not None:
        from pcpo_eval.credit.plot import save_credit_figure

        save_credit_figure(plot, flows=[credit])
    _emit(
        summary,
        as_json,
        ["index", "t", "dt", "sigma", "native_weight", "pcpo_weight"],
        f"{sde} SDE, N={steps}, eta={eta}, shift={shift}: zeta = {summary['zeta']:.4f}",
    )


def register(app: typer.Typer) -> None:
    app.add_typer(credit_app, name="credit")
