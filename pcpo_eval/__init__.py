"""pcpo-eval: train, render, measure and test PCPO against DDPO / DanceGRPO / Flow-GRPO.

Data flows through the package in this order (one module, one job):

``credit`` (PCPO credit math) -> ``samplers`` / ``objectives`` -> ``trainer`` -> ``generate``
-> ``features`` -> ``metrics`` -> ``stats`` -> ``report``.
"""

__version__ = "0.1.0"
