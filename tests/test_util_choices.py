"""kvtier.util.choices.member: the one rule turning a mode setting into its enum member."""
import enum

import pytest

from kvtier.store.config import IoEngineKind, StoreConfig
from kvtier.tiering.policy.breakeven_options import BreakEvenOptions, Lease
from kvtier.util.choices import member


class Colour(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_a_member_or_its_value_is_the_member():
    assert member(Colour, Colour.BLUE, field="colour") is Colour.BLUE
    assert member(Colour, "red", field="colour") is Colour.RED


def test_anything_else_names_the_field_and_lists_the_values():
    with pytest.raises(ValueError) as e:
        member(Colour, "green", field="Paint.colour")
    assert str(e.value) == "Paint.colour must be one of 'red', 'blue', got 'green'"
    with pytest.raises(ValueError, match="must be one of 'red', 'blue', got None"):
        member(Colour, None, field="colour")


def test_the_store_config_and_the_policy_options_use_it(tmp_path):
    assert StoreConfig(root=tmp_path, io_engine="threads").io_engine is IoEngineKind.THREADS
    with pytest.raises(ValueError) as e:
        StoreConfig(root=tmp_path, io_engine="bogus")
    assert str(e.value) == "StoreConfig.io_engine must be one of 'auto', 'io_uring', 'threads', got 'bogus'"
    assert BreakEvenOptions(lease=Lease.QUANTILE.value).lease is Lease.QUANTILE
    with pytest.raises(ValueError) as e:
        BreakEvenOptions(lease="bogus")
    assert str(e.value).startswith("lease must be one of ") and str(e.value).endswith(", got 'bogus'")
