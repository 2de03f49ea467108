"""Credit assignment: native per-step weights and PCPO's proportional replacements.

:mod:`.ddim` (Prop. 1), :mod:`.flow` (Prop. 2), :mod:`.plot` (Fig. 2), :mod:`.commands` (``pcpo-eval credit``)."""
