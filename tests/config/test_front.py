"""[server] front_processes: "auto" from the usable CPUs or a count; a bad value names the key."""
from __future__ import annotations

import pytest

from inferd.config.front import resolve_front_processes
from inferd.config.root import ConfigError, ServerConfig, parse_config


def test_the_default_sizes_the_writers_from_the_cpus():
    # (tests/conftest.py gives the suite's own configs 0: the class holds the product's default)
    assert ServerConfig().front_processes == "auto"


@pytest.mark.parametrize(("cpus", "writers"), [(1, 0), (2, 0), (3, 0), (4, 1), (8, 2), (15, 3), (16, 4), (128, 4)])
def test_auto_is_one_writer_per_four_cpus_none_below_four_at_most_four(cpus, writers):
    assert resolve_front_processes("auto", cpus=cpus) == writers


def test_a_count_is_taken_as_given_whatever_the_cpus():
    assert resolve_front_processes(0, cpus=64) == 0
    assert resolve_front_processes(3, cpus=1) == 3


@pytest.mark.parametrize("value", [-1, "many", 1.5, True])
def test_a_bad_value_is_an_error_naming_the_key(value):
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"front_processes": value}})
    assert any("server.front_processes" in e for e in info.value.errors)


@pytest.mark.parametrize("value", ["auto", 0, 2])
def test_auto_and_counts_validate(value):
    assert parse_config({"server": {"front_processes": value}}).server.front_processes == value
