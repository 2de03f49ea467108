"""Model loading and hashing for generation: ``--model`` specs -> adapters, ``model_hash``.

Owns :func:`load_generation_model` (a plain model / checkpoint spec through
:func:`pcpo_eval.train.checkpoints.load_model_from_spec`, or ``irg:...`` through :mod:`.irg`),
:func:`adapter_hash` (the set's ``model_hash``: the denoiser's weights, recursively for IRG) and
:func:`module_sha256`.
"""

import hashlib
import json

import torch
from torch import nn

from pcpo_eval.errors import UserError
from pcpo_eval.generate.fixed_batch import FixedBatchAdapter
from pcpo_eval.generate.irg import IRGAdapter, default_irg_reference, parse_irg_spec
from pcpo_eval.models.base import ModelAdapter


def module_sha256(module: nn.Module) -> str:
    """SHA-256 over a module's state dict (sorted names, dtype, shape and raw bytes).

    The bytes go to the hash through the buffer protocol, without a ``tobytes`` copy: the same digest,
    1.2-1.3x faster on SD-1.5's bf16 UNet (1.72 GB; ``benchmarks/bench_model_hash.py``)."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def adapter_hash(adapter: ModelAdapter) -> str:
    """The ``model_hash`` of a set: the denoiser's weights (what fine-tuning changes).

    For IRG: a hash of the reference's and each component's hash with its lambda.
    """
    if isinstance(adapter, FixedBatchAdapter):
        return adapter_hash(adapter.inner)
    if isinstance(adapter, IRGAdapter):
        doc = {
            "irg": [[adapter_hash(c), lam] for c, lam in zip(adapter.components, adapter.lambdas, strict=True)],
            "reference": adapter_hash(adapter.reference),
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    den = adapter.denoiser
    return module_sha256(getattr(den, "_orig_mod", den))  # a torch.compile'd denoiser: its original module


def _load_single(spec: str, device: str, dtype: torch.dtype) -> ModelAdapter:
    """One model spec -> adapter, via the checkpoint resolver (base models, runs, checkpoints)."""
    from pcpo_eval.train.checkpoints import load_model_from_spec

    return load_model_from_spec(spec, device=device, dtype=dtype)


def load_generation_model(spec: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> ModelAdapter:
    """Resolve ``--model``: a plain model / checkpoint spec, or ``irg:...`` (:func:`parse_irg_spec`).

    ``dtype`` is the weights' dtype of the set's precision (:func:`pcpo_eval.precision.precision_dtype`).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UserError("empty --model; use base, toy, sd1:PATH, RUN/checkpoints/epoch_NNNN or irg:...")
    if spec.startswith("irg:"):
        irg = parse_irg_spec(spec)
        ref_spec = irg.reference or default_irg_reference(irg.components[0][0])
        reference = _load_single(ref_spec, device, dtype)
        comps = [(_load_single(p, device, dtype), lam) for p, lam in irg.components]
        return IRGAdapter(reference, comps)
    return _load_single(spec, device, dtype)
