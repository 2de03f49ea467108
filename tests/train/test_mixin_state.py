"""The trainer's mixins declare the state they share: every ``self.<name>`` a mixin reads or sets is a
method of the trainer or a name its class declares, and a built Trainer has every declared name."""

from __future__ import annotations

import ast
import inspect
import typing

import pytest

from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.policy import PolicyMixin
from pcpo_eval.train.rollout import RolloutMixin
from pcpo_eval.train.trainer import Trainer
from pcpo_eval.train.update import UpdateMixin
from tests.support.train import TINY

MIXINS = (PolicyMixin, RolloutMixin, UpdateMixin)


def _self_names(cls: type) -> set[str]:
    """Every ``self.<name>`` in the class body's source."""
    tree = ast.parse(inspect.getsource(cls))
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}


@pytest.mark.parametrize("mixin", MIXINS, ids=lambda m: m.__name__)
def test_every_shared_name_is_declared(mixin):
    callables = {name for name, v in inspect.getmembers(Trainer) if callable(v) or isinstance(v, property)}
    undeclared = _self_names(mixin) - set(mixin.__annotations__) - callables
    assert not undeclared, f"{mixin.__name__} uses undeclared trainer state: {sorted(undeclared)}"


def test_a_built_trainer_has_every_declared_name(tmp_path):
    tr = Trainer(config_from_dict({**TINY, "device": "cpu", "log_to": "none"}), tmp_path / "run")
    for mixin in MIXINS:
        missing = [n for n in mixin.__annotations__ if not hasattr(tr, n)]
        assert not missing, f"{mixin.__name__} declares {missing}, which the Trainer never sets"
    # the declarations agree between mixins that share a name
    seen: dict[str, str] = {}
    for mixin in MIXINS:
        for n, t in mixin.__annotations__.items():
            assert seen.setdefault(n, t) == t, f"{n} is declared as {seen[n]} and as {t}"
    assert typing.get_type_hints(PolicyMixin)["cfg"] is type(tr.cfg)
