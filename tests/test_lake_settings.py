"""The ``[lake]`` table of a broker's config: defaults, validation, and what reaches the lake service."""
from __future__ import annotations

from pathlib import Path

import pytest

from sparkmq.pipelines.lake_service import LAKE_JOBS, LakeSettings


def test_defaults_and_what_a_broker_service_gets(tmp_path: Path) -> None:
    settings = LakeSettings.from_mapping({"enabled": True, "spark_master": "local[1]", "trigger_interval_s": 0.5,
                                          "max_messages_per_trigger": 2000, "jobs": ["dispatch"]})
    assert settings.enabled and settings.nice == "idle" and settings.jobs == ("dispatch",)
    service = settings.service_for_broker(tmp_path, "broker-a", "127.0.0.1:10911")
    assert service.lake_root == tmp_path / "lake" and service.checkpoint_root == tmp_path / "lake" / "_checkpoints"
    assert service.endpoints == {"broker-a": "127.0.0.1:10911"} and service.job_name == "broker-a"
    assert service.trigger == {"processingTime": "0.5 seconds"} and service.max_messages_per_trigger == 2000
    assert service.spark_conf == {"spark.master": "local[1]"}
    default = LakeSettings.from_mapping(None)
    assert not default.enabled and default.jobs == LAKE_JOBS and default.max_messages_per_trigger == 500_000
    assert LakeSettings.from_mapping({"nice": 10}).nice == 10


@pytest.mark.parametrize(("values", "message"), [
    ({"trigger_interval": 1}, "unknown \\[lake\\] settings \\['trigger_interval'\\]"),
    ({"trigger_interval_s": 0}, "trigger_interval_s must be a finite number of seconds > 0, got 0"),
    ({"enabled": "yes"}, "enabled must be true or false, got 'yes'"),
    ({"nice": 20}, 'nice must be "idle" or an integer from 0 to 19'),
    ({"nice": "lowest"}, 'nice must be "idle" or an integer from 0 to 19'),
    ({"max_messages_per_trigger": 0}, "max_messages_per_trigger must be an integer >= 1"),
    ({"max_messages_per_trigger": "1000"}, "max_messages_per_trigger must be an integer >= 1"),
    ({"jobs": ["dispatch", "index"]}, "unknown lake jobs \\['index'\\]"),
])
def test_bad_settings_are_refused_by_name(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LakeSettings.from_mapping(values)
