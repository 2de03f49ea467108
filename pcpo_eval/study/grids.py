"""Image grids of a study: the same prompts and seeds for the base model, the baseline and PCPO.

A grid of counts (``grid: {prompts: 6, seeds: 4}``) shows the eval set's first prompts and seeds
at the reward-matched (or matched-epoch, ``match: epoch``) checkpoints, from the eval sets. A grid
that names its prompts, lists its seeds or states its epochs (the paper's figures: Fig. image_grid
(a) cat, bear, butterfly, chicken, bee, camel; Fig. naive-acceleration (b) "fish" with 4
consecutive seeds; Fig. comp-consecutive-seed "hedgehog" and "mouse" with 6 seeds; Fig. image_grid
(b) FLUX after 200 epochs) is rendered by the generate stage into its own small sets
(``OUT/grid_sets/<grid>/...``). A named prompt found in the eval prompt set keeps its eval prompt
id, so its images share the eval set's initial noise (:func:`pcpo_eval.seeding.sample_generator`).
"""

from __future__ import annotations

from typing import Any

from pcpo_eval.imageset import MANIFEST_FILE
from pcpo_eval.stats.select import matched_noun
from pcpo_eval.study.sections import GridSpec, grid_dir_name
from pcpo_eval.study.spec import StudySpec
from pcpo_eval.studydir import StudyLayout, set_label


def grid_prompt_set(sp: StudySpec, grid: GridSpec) -> Any:
    """The grid's prompts as a PromptSet: eval prompt ids where the text is in the eval set."""
    from pcpo_eval.prompts import PromptSet, load_prompts

    ev = load_prompts(sp.eval.prompts, limit=sp.eval.max_prompts)
    if isinstance(grid.prompts, int):
        n = min(grid.prompts, len(ev))
        return PromptSet(f"grid:{grid_dir_name(grid, 0)}", ev.prompt_ids[:n], ev.prompts[:n])
    known = {" ".join(p.split()).lower(): i for i, p in zip(ev.prompt_ids, ev.prompts, strict=True)}
    nxt = max(ev.prompt_ids, default=-1) + 1
    ids = []
    for p in grid.prompts:
        key = " ".join(p.split()).lower()
        if key in known:
            ids.append(known[key])
        else:
            ids.append(nxt)
            nxt += 1
    return PromptSet(f"grid:{grid.name or 'grid'}", tuple(ids), tuple(" ".join(p.split()) for p in grid.prompts))


def grid_seeds(sp: StudySpec, grid: GridSpec) -> list[int]:
    """The grid's seeds: its list, or the first N eval seeds."""
    from pcpo_eval.generate.plan import parse_seeds

    if isinstance(grid.seeds, int):
        return parse_seeds(sp.eval.seeds)[: grid.seeds]
    return list(grid.seeds)


def grid_models(sp: StudySpec, layout: StudyLayout, grid: GridSpec) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(label, model, selection row) of the grid's columns: base, then the stated or selected checkpoints."""
    from pcpo_eval.study.selection import explicit_sets

    if grid.epochs is not None:
        return explicit_sets(sp, layout, grid.epochs, f"grid {grid.name}".strip() + ".epochs")
    rows = layout.matched(grid.match)
    return [("base", sp.base_model, None), *((set_label(c["name"], c["epoch"]), c["path"], c) for c in rows)]


def _columns(sp: StudySpec, cell: str, models: list[tuple[str, str, dict[str, Any] | None]],
             set_root: str) -> list[dict[str, Any]]:
    cols = [{"label": "Base model", "role": "base", "set": f"{set_root}/base", "epoch": None, "reward": None}]
    for role in ("baseline", "pcpo"):
        c = next((c for _, _, c in models if c is not None and c["cell"] == cell and c["role"] == role), None)
        if c is not None:
            cols.append({"label": f"{c['arm']} seed {c['seed']} (E{int(c['epoch'])})", "role": role,
                         "set": f"{set_root}/{set_label(c['name'], c['epoch'])}", "epoch": int(c["epoch"]),
                         "reward": None if c.get("reward") is None else float(c["reward"]),
                         # what the checkpoint was matched on: a gain over the control is no reward
                         "reward_label": matched_noun(sp.select_on)})
    return cols


def grid_blocks(sp: StudySpec, layout: StudyLayout) -> list[dict[str, Any]]:
    """``results.json`` ``grids``: per grid and cell, the columns and the image paths (relative to OUT)."""
    import pandas as pd

    from pcpo_eval.imageset import image_rel_path

    out = []
    for i, g in enumerate(sp.grids or (sp.grid,)):
        if g.own_sets:
            ps = grid_prompt_set(sp, g)
            pids, prompts, seeds = list(ps.prompt_ids), dict(zip(ps.prompt_ids, ps.prompts, strict=True)), grid_seeds(sp, g)
            root, models = f"grid_sets/{grid_dir_name(g, i)}", grid_models(sp, layout, g)
        else:
            man = pd.read_parquet(layout.set_dir("base") / MANIFEST_FILE)
            pids = sorted(man["prompt_id"].unique().tolist())[: g.prompts]
            seeds = sorted(man["seed"].unique().tolist())[: g.seeds]
            prompts = dict(zip(man["prompt_id"], man["prompt"], strict=False))
            root, models = "sets", grid_models(sp, layout, g)
        for cell in sp.cells():
            cols = _columns(sp, cell, models, root)
            rows = [{"prompt_id": int(p), "prompt": str(prompts[p]), "seeds": [int(s) for s in seeds],
                     "images": [[f"{col['set']}/{image_rel_path(int(p), int(s))}" for s in seeds] for col in cols]}
                    for p in pids]
            out.append({"cell": cell, "grid": g.name, "caption": g.caption, "columns": cols, "rows": rows})
    return out
