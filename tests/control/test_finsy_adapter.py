"""finsy's private names that the control plane relies on (finsy_adapter.py) are still where it reaches for
them, and the installed finsy is in the range pyproject.toml pins: a new finsy that moved one fails here,
by name, before a reconcile fails in some subtler way."""

from __future__ import annotations

import tomllib
from importlib.metadata import version

import finsy as fy
import pytest
from finsy.p4arbitrator import Arbitrator
from packaging.specifiers import SpecifierSet

from dpu_limiter import finsy_adapter
from helpers.paths import ROOT


@pytest.mark.parametrize(("cls", "name"), finsy_adapter.RELIED_ON, ids=lambda x: getattr(x, "__name__", x))
def test_a_relied_on_finsy_name_is_there(cls: type, name: str) -> None:
    assert callable(getattr(cls, name, None)), f"finsy {version('finsy')}: {cls.__name__}.{name} is gone"


def test_instances_still_have_the_attributes_relied_on() -> None:
    for cls, names in finsy_adapter.RELIED_ON_INSTANCE:
        if cls is fy.Switch:
            made = fy.Switch("probe", "127.0.0.1:1")
        elif cls is Arbitrator:
            made = Arbitrator(1)
        else:
            made = cls("127.0.0.1:1")
        for name in names:
            assert hasattr(made, name), f"finsy {version('finsy')}: {cls.__name__}().{name} is gone"


def test_the_installed_finsy_is_in_the_pinned_range() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("finsy"))
    assert version("finsy") in SpecifierSet(spec.removeprefix("finsy")), (spec, version("finsy"))
