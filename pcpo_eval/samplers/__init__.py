"""Samplers with per-step log-probabilities: DDIM (``ddim``) and flow-matching SDEs (``flow``)."""
