"""One command from an experiment spec to a report: ``pcpo-eval study STUDY.yaml [--out DIR]``.

A study is the paper's evaluation protocol (Sec. 3.1, App. "Evaluation Details") as data, with
training runs (design cell x training seed) as the unit of replication:

1. **train**     every cell of a factorial design (e.g. algorithm x batch size) is trained once per
                 training seed (``seeds:``); each (cell, seed) is a run ``<cell>__seed-<s>`` with
                 its resolved train config (file < train.overrides < the cell's levels < seed and
                 ``paired_control``, on by default: the untrained model's reward on the same
                 prompts and noises every epoch), trained with
                 :func:`pcpo_eval.train.trainer.train` into ``OUT/runs/<run>`` (``parallel: N``
                 worker processes), or an existing run directory. Finished runs are skipped,
                 interrupted ones resumed. Afterwards every reward target must be reached by at
                 least one run.
2. **select**    per run, the reward-matched checkpoint at ``select_target`` (none if the run never
                 reaches it) and the checkpoint at the matched epoch (``select_epoch``).
3. **generate**  seed-controlled image sets (:func:`pcpo_eval.generate.runner.generate_set`) of the base
                 model and of each selected checkpoint, same prompts and seeds
                 (``OUT/sets/base``, ``OUT/sets/<run>/epoch_NNNN``); optional preference sets on
                 unseen prompts. The generator itself skips finished images.
4. **metrics**   per-prompt and overall metrics of every set against the base set
                 (:func:`pcpo_eval.metrics.workers.run_metrics`) into ``OUT/metrics/...``.
5. **stats**     the verdict over runs (paired gain, final reward, AUC, speed-up per informative
                 target; :mod:`pcpo_eval.stats.verdict`), the sampler offset of the controls,
                 speed-up tables (paper Tables 1 and 10), raw scores (Table 2) with significance, one LMM
                 per metric (Tables 3-4; ``(1|run)`` added with >= 2 runs per arm), training
                 traces, the credit figure: ``OUT/results.json`` + ``OUT/figures/``.
6. **report**    ``OUT/report.html`` (:mod:`pcpo_eval.report.html`), formatting ``results.json``.

Every stage skips finished work (``OUT/study_state.json`` holds a fingerprint of each stage's inputs),
so re-running the same command after a crash continues where it stopped. A failing stage is
named in the error and everything written before it is kept.

Spec validation (:func:`load_spec`) collects *every* problem (unknown keys, missing run
directories, bad levels or seeds, colliding run directories, unknown metrics, per-prompt metrics
undefined at the eval set's images per prompt, absent weights of metrics / rewards / models,
targets no existing run reaches) into one :class:`~pcpo_eval.errors.UserError` before any work
starts; targets of runs still to be trained are checked right after the train stage.

Modules: :mod:`.spec` (the spec and its validation; each run carries its resolved train config),
:mod:`.layout` (the paths of a study directory), :mod:`.runner` (the stages), :mod:`.training`
(the train stage and its worker processes), :mod:`.selection` (the select stage), :mod:`.verdicts`
(run-level results), :mod:`.results` (``results.json`` from the spec and the layout),
:mod:`.commands` (``study``, ``report``, ``demo``).
"""
