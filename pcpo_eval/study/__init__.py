"""One command from an experiment spec to a report: ``pcpo-eval study STUDY.yaml [--out DIR]``.

A study is the paper's evaluation protocol (Sec. 4, App. "Evaluation Details") as data:

1. **train**     every cell of a factorial design (e.g. algorithm x batch size x seed) is a run:
                 the resolved train config (file < train.overrides < the cell's levels), trained with
                 :func:`pcpo_eval.train.trainer.train` into ``OUT/runs/<run>``, or an existing run
                 directory. Finished runs are skipped, interrupted ones resumed (``--resume``).
                 Afterwards every reward target must be reached by at least one run.
2. **select**    reward-matched checkpoint per run at ``select_target``
                 (:func:`pcpo_eval.stats.select_checkpoints`, smoothed reward, window 5).
3. **generate**  seed-controlled image sets (:func:`pcpo_eval.generate.runner.generate_set`) of the base
                 model and of each selected checkpoint, same prompts and seeds
                 (``OUT/sets/base``, ``OUT/sets/<run>/epoch_NNNN``); optional preference sets on
                 unseen prompts. The generator itself skips finished images.
4. **metrics**   per-prompt and overall metrics of every set against the base set
                 (:func:`pcpo_eval.metrics.workers.run_metrics`) into ``OUT/metrics/...``.
5. **stats**     speed-up tables (paper Table 1/5), raw scores per condition (Table 2) with
                 simple-effect significance, one LMM per metric (Tables 3-4; e.g.
                 ``value ~ algorithm * batch + (1|prompt)``) with Holm/BH across metrics, training
                 traces, the credit figure: ``OUT/results.json`` + ``OUT/figures/``.
6. **report**    ``OUT/report.html`` (:mod:`pcpo_eval.report.html`), formatting ``results.json``.

Every stage skips finished work (``OUT/study_state.json`` holds a fingerprint of each stage's inputs),
so re-running the same command after a crash continues where it stopped. A failing stage is
named in the error and everything written before it is kept.

Spec validation (:func:`load_spec`) collects *every* problem (unknown keys, missing run
directories, bad levels, unknown metrics, absent weights of metrics / rewards / models, targets no
existing run reaches) into one :class:`~pcpo_eval.errors.UserError` before any work starts;
targets of runs still to be trained are checked right after the train stage.

Modules: :mod:`.spec` (the spec and its validation; each run carries its resolved train config),
:mod:`.layout` (the paths of a study directory), :mod:`.runner` (the stages), :mod:`.results`
(``results.json`` from the spec and the layout), :mod:`.commands` (``study``, ``report``, ``demo``).
"""
