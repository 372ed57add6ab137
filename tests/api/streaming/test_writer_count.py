"""[server] front_processes: a number is taken as it is; "auto" follows the CPUs this process may use."""
from __future__ import annotations

import pytest

from inferd.api.streaming.writers import writer_count
from inferd.config.root import ConfigError, parse_config


@pytest.mark.parametrize(("cpus", "writers"), [(1, 0), (2, 0), (3, 0), (4, 1), (8, 2), (15, 3), (16, 4), (192, 4)])
def test_auto_gives_a_writer_per_four_cpus_none_below_four_and_at_most_four(cpus, writers):
    assert writer_count("auto", cpus) == writers


def test_a_number_is_used_as_it_is_whatever_the_cpus():
    assert writer_count(0, 64) == 0
    assert writer_count(3, 1) == 3


def test_the_default_is_auto():
    assert parse_config({}).server.front_processes == "auto"


@pytest.mark.parametrize("value", [-1, 65, "many"])
def test_a_bad_value_is_refused_naming_the_setting(value):
    with pytest.raises(ConfigError, match="server.front_processes"):
        parse_config({"server": {"front_processes": value}})
