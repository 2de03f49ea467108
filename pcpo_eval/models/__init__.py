"""Model adapters: one interface for the toy model, Stable Diffusion 1.x, SD3 and FLUX.

Everything beyond an adapter (samplers, trainer, generator) is shared code. Adapters are
created through :data:`pcpo_eval.models.registry.REGISTRY` / :func:`load_model`.
"""
