"""`python -m engine.serve`'s engine flags agree with the engine: every live field has a flag, each
flag's default is ``EngineConfig()``'s and its choices the config's tuples, and the flags with no
value given build the default config (the weights aside: the lab serves ``lab_weights``)."""

from __future__ import annotations

import dataclasses

import pytest

from engine.core.config import DTYPES, FLAGS, KV_LAYOUTS, LIVE_FIELDS, RUNNERS, EngineConfig
from engine.serve import config_from, parse_args


@pytest.fixture(scope="module")
def defaults():
    return parse_args([])


def test_every_live_field_has_a_flag_with_the_configs_default(defaults):
    config = EngineConfig()
    assert set(LIVE_FIELDS) <= set(FLAGS)
    for name in FLAGS:
        assert getattr(defaults, name) == getattr(config, name), name


def test_choices_are_the_configs_tuples():
    assert FLAGS["runner"][1] == RUNNERS
    assert FLAGS["kv_layout"][1] == KV_LAYOUTS
    assert FLAGS["dtype"][1] == DTYPES
    with pytest.raises(SystemExit):
        parse_args(["--runner", "turbo"])


def test_no_flags_build_the_default_config_but_its_weights(monkeypatch):
    monkeypatch.delenv("FLUXO_DEVICE", raising=False)
    monkeypatch.delenv("FLUXO_ENGINE_CPUS", raising=False)
    built = config_from(parse_args([]))
    assert dataclasses.replace(built, weights="fp32") == EngineConfig()


def test_flags_set_their_fields():
    args = ["--slots", "3", "--kv-blocks", "77", "--no-prefix-cache", "--host-work-ms", "2.5"]
    args += ["--kv-layout", "reserved", "--fill-timeout-s", "0"]
    built = config_from(parse_args(args))
    assert (built.max_slots, built.kv_blocks, built.prefix_cache) == (3, 77, False)
    assert (built.host_work_ms, built.kv_layout, built.fill_timeout_s) == (2.5, "reserved", 0.0)
