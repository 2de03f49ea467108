"""Seed-controlled, resumable, sharded rendering of prompt x seed image sets.

Every quality metric compares sets rendered from the same prompts and seeds by the base model
and by each checkpoint (paper App. "Evaluation Details": 45 prompts x 1112 seeds per model), so
an image must depend only on ``(model, settings, prompt_id, seed)``:

1. Noise: image ``(prompt_id, seed)`` draws its initial noise and every stochastic step's noise
   from its own generator :func:`pcpo_eval.seeding.sample_generator` (diffusers' one generator
   per sample), never from a global RNG.
2. Arithmetic: CPU kernels may round differently for different batch shapes (checked: a
   diffusers UNet gives ~1e-6 differences between batch 1 and batch 16). The denoiser, text
   encoder and decoder therefore always run on fixed-size micro-batches of ``micro_batch`` rows
   (:class:`~.fixed_batch.FixedBatchAdapter`, the last one padded), so each row's computation
   never sees the user's batch size or the number of processes. ``micro_batch`` is part of the
   set's settings.
3. Work split: the plan lists items seed-major (all prompts for seed 0, then seed 1, ...);
   process ``rank`` of ``world`` renders items ``i`` with ``i % world == rank``.

Output layout (the image-set contract)::

    SET/images/p{prompt_id:05d}/s{seed:07d}.png   lossless PNG, text chunks "prompt", "pcpo_eval"
    SET/manifest.parquet                          one row per image (MANIFEST_COLUMNS)
    SET/set.json                                  every setting + run information
    SET/.progress/*.parquet                       per-process records while rendering

Bad input writes nothing: every check runs before the first write. :class:`GenerationRequest`
rejects bad numbers at construction, before a model is loaded (``batch_size``/``steps`` integers
>= 1, ``cfg`` finite, ``eta`` finite and >= 0, ``micro_batch`` >= 0; a NaN ``cfg`` would otherwise
render a complete set of black images); then seeds, prompts, model, sampler/schedule and an
existing ``out_dir`` (foreign files, other settings, other prompt texts) are checked. Each failure
is a one-line :class:`~pcpo_eval.errors.UserError` naming the flag.

Crash safety: each PNG is written to a temp file in its folder and renamed into place
(:func:`~.png.write_image_file`), so a PNG that exists is complete after any process death
(SIGKILL included); the re-run skips existing images and re-renders the rest. Unlike
:func:`pcpo_eval.io.atomic_write` the image write does not fsync each file: on this project's
machines that per-file fsync cost 7-11% of throughput. Durability against power loss is handled
in groups instead: every ``flush_every_s`` seconds each process calls ``os.sync()`` and then
atomically rewrites its records (path and hashes) of the images written so far; on resume,
images with a record are trusted, images without one are decoded and re-rendered if unreadable.
Rank 0 writes ``manifest.parquet`` and ``set.json`` through :mod:`pcpo_eval.io` after a barrier.

Implicit Reward Guidance (paper App. "Implicit Reward Guidance", Eq. irg-multi-mix)::

    eps_IRG = eps_ref + sum_i lambda_i (eps_theta_i - eps_ref)      (velocity alike for flows)

is the adapter :class:`~.irg.IRGAdapter`, selected with the model spec
``irg:CKPT_1=LAMBDA_1,CKPT_2=LAMBDA_2[@REFERENCE]`` (see :func:`~.irg.parse_irg_spec`).

:func:`~.runner.generate_set` is four steps, in the manner of a diffusers pipeline's ``__call__``::

    request = GenerationRequest(...)      # the 19 arguments, numbers checked
    1. _check_request(request)            # seeds, prompts, model, settings, out_dir: nothing written
    2. _open_set_dir(job)                 # plan, known records; rank 0 writes set.json ("rendering")
    3. _render_share(job, opened)         # this rank's images: sampler, PNG writer, record flushes
    4. _finish_set(job, opened, share)    # barrier; rank 0 writes manifest + set.json ("complete")

Modules, in the order of a run, and what each owns:

====================  ======================================================================
:mod:`.plan`          seeds (``parse_seeds``), ``WorkItem``, the seed-major plan, shards (no torch)
:mod:`.fixed_batch`   ``FixedBatchAdapter``, ``auto_micro_batch``, ``effective_batch_size``
:mod:`.irg`           the IRG spec, formula and adapter
:mod:`.loading`       ``--model`` spec -> adapter; ``model_hash``
:mod:`.png`           PNG bytes: encode, atomic write, read back, pixel hash
:mod:`.setdir`        the set directory: ``GenerationSettings``, records, pre-write and resume
                      checks, set.json, the manifest
:mod:`.runner`        ``GenerationRequest``, ``generate_set`` and its four steps, ``render_latents``
:mod:`.commands`      ``pcpo-eval generate``
====================  ======================================================================
"""
