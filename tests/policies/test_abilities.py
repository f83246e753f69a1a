"""`abilities.can`: a Protocol check remembered per class, refused for Protocols an instance answers."""

from __future__ import annotations

import pytest

from meshsched.policies.abilities import Admits, KeepsShareLog, PlansStarts, can


class _Plans:
    def plan_start(self, view, start):
        return start


def test_can_answers_as_isinstance_per_class():
    assert can(_Plans(), PlansStarts) and isinstance(_Plans(), PlansStarts)
    assert not can(_Plans(), Admits) and not can(None, Admits)
    assert can(_Plans(), PlansStarts)  # (remembered: the same answer)


def test_can_refuses_a_protocol_with_data_members():
    with pytest.raises(TypeError, match="data members"):
        can(object(), KeepsShareLog)
