"""The peers benchmark's pure parts (benchmarks/bench_peers.py): medians over rounds, ratios, a figure's fields and
status, the markdown table, the targets it quotes and the chart.  No JVM, no broker."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from conftest import need_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_peers as bp  # noqa: E402  (benchmarks/ is not a package)

TARGETS = """# comment line
peers.rocketmq_produce_batch ratio >= 1.5
peers.rocketmq_e2e p99_ratio <= 1.0
messaging.produce msgs_per_s >= 1
"""


def rounds(*values: float, key: str = "msgs_per_s") -> list[bp.Measure]:
    return [bp.Measure({key: v}) for v in values]


def test_median_of_skips_failed_rounds_and_is_nan_without_any() -> None:
    measures = [*rounds(10.0, 30.0, 20.0), bp.Measure.unavailable("error")]
    assert bp.median_of(measures, "msgs_per_s") == 20.0
    assert math.isnan(bp.median_of([bp.Measure.unavailable("error")], "msgs_per_s"))
    assert math.isnan(bp.median_of(rounds(1.0), "p99_ms"))


@pytest.mark.parametrize(("ours", "theirs", "want"), [(3.0, 2.0, 1.5), (0.0, 2.0, 0.0)])
def test_ratio(ours: float, theirs: float, want: float) -> None:
    assert bp.ratio(ours, theirs) == want


@pytest.mark.parametrize(("ours", "theirs"), [(1.0, 0.0), (float("nan"), 1.0), (1.0, float("nan"))])
def test_ratio_is_nan_without_both_sides(ours: float, theirs: float) -> None:
    assert math.isnan(bp.ratio(ours, theirs))


def test_throughput_fields_are_medians_of_each_side_and_their_ratio() -> None:
    fields = bp.figure_fields("rocketmq_produce_batch", rounds(100.0, 300.0, 200.0), rounds(50.0, 100.0, 400.0), 1e5)
    assert fields["sparkmq_msgs_per_s"] == 200.0 and fields["rocketmq_msgs_per_s"] == 100.0
    assert fields["ratio"] == 2.0 and fields["status"] == "ok" and fields["rounds"] == 3
    assert fields["sparkmq_rounds"] == "100/300/200" and fields["rocketmq_rounds"] == "50/100/400"


def test_kafka_figures_name_kafka_as_the_peer() -> None:
    fields = bp.figure_fields("kafka_consume", rounds(3.0), rounds(2.0), 1.0)
    assert fields["kafka_msgs_per_s"] == 2.0 and "rocketmq_msgs_per_s" not in fields
    assert bp.peer_of("kafka_spark_source") == "kafka" and bp.peer_of("rocketmq_pop") == "rocketmq"


def test_e2e_fields_give_p50_and_p99_of_both_and_the_p99_ratio() -> None:
    ours = [bp.Measure({"p50_ms": 1.0, "p99_ms": 4.0}), bp.Measure({"p50_ms": 3.0, "p99_ms": 6.0})]
    theirs = [bp.Measure({"p50_ms": 2.0, "p99_ms": 10.0}), bp.Measure({"p50_ms": 2.0, "p99_ms": 10.0})]
    fields = bp.figure_fields("rocketmq_e2e", ours, theirs, 1.0)
    assert fields["sparkmq_p50_ms"] == 2.0 and fields["sparkmq_p99_ms"] == 5.0
    assert fields["rocketmq_p99_ms"] == 10.0 and fields["p99_ratio"] == 0.5 and fields["p50_ratio"] == 1.0
    assert "ratio" not in fields and fields["sparkmq_rounds"] == "4/6"


def test_a_failed_round_on_either_side_shows_in_the_status_and_its_rounds() -> None:
    ours = [bp.Measure({"msgs_per_s": 5.0}), bp.Measure.unavailable("error")]
    fields = bp.figure_fields("rocketmq_consume", ours, rounds(5.0, 5.0), 1.0)
    assert fields["status"] == "sparkmq_error" and fields["ratio"] == 1.0 and fields["sparkmq_rounds"] == "5/error"
    fields = bp.figure_fields("rocketmq_consume", rounds(5.0), [bp.Measure.unavailable("error")], 1.0)
    assert fields["status"] == "peer_error" and math.isnan(fields["ratio"])  # type: ignore[arg-type]


def test_report_line_prints_one_line_named_as_the_targets(capsys: pytest.CaptureFixture[str]) -> None:
    bp.report_line("rocketmq_sync_flush", rounds(3.0), rounds(2.0), 7.0)
    [printed] = capsys.readouterr().out.splitlines()
    assert printed.startswith("peers.rocketmq_sync_flush ratio=1.5 sparkmq_msgs_per_s=3 rocketmq_msgs_per_s=2")


def test_parse_targets_keeps_the_peers_lines_only() -> None:
    assert bp.parse_targets(TARGETS) == {"rocketmq_produce_batch": "ratio >= 1.5", "rocketmq_e2e": "p99_ratio <= 1.0"}


def test_every_figure_of_the_setups_has_a_target_line() -> None:
    figures = {f for fs in bp.SETUPS.values() for f in fs}
    assert len(figures) == 12
    if bp.TARGETS.exists():  # shared/ beside the repository
        assert figures == set(bp.parse_targets(bp.TARGETS.read_text()))


def test_render_table_has_a_row_per_figure_with_its_target_and_the_chart_values() -> None:
    rows = {"rocketmq_produce_batch": bp.figure_fields("rocketmq_produce_batch", rounds(150_000.0),
                                                       rounds(100_000.0), 1.0),
            "rocketmq_e2e": bp.figure_fields("rocketmq_e2e", [bp.Measure({"p50_ms": 1.0, "p99_ms": 2.0})],
                                             [bp.Measure({"p50_ms": 2.0, "p99_ms": 8.0})], 1.0),
            "kafka_consume": bp.figure_fields("kafka_consume", rounds(1.0), [bp.Measure.unavailable("error")], 1.0)}
    text, labels, ratios = bp.render_table(rows, stamp="2026-11-29 01:00 UTC", echo=150_000.0,
                                           sizes=bp.Sizes.of(True), rounds=1, targets=bp.parse_targets(TARGETS),
                                           load="1.0/2.0/3.0")
    lines = text.splitlines()
    assert "2026-11-29 01:00 UTC; python_echo 150,000 msgs/s; medians of 1 rounds" in lines[2]
    assert lines[2].endswith("load average 1.0/2.0/3.0")
    assert lines[4] == "| figure | sparkmq | peer | ratio (sparkmq/peer) | target | met | measured |"
    assert lines[6] == ("| peers.rocketmq_produce_batch | 150,000 msgs/s | 100,000 msgs/s | 1.5 | ratio >= 1.5 | yes "
                        "| ok |")
    assert lines[7] == ("| peers.rocketmq_e2e | p50 1 / p99 2 ms | p50 2 / p99 8 ms | 0.25 | p99_ratio <= 1.0 "
                        "| yes | ok |")
    assert lines[8].startswith("| peers.kafka_consume | 1 msgs/s | nan msgs/s | nan |  |  | peer_error")
    assert labels == ["rocketmq_produce_batch", "rocketmq_e2e", "kafka_consume"]
    assert ratios[:2] == [1.5, 0.25] and math.isnan(ratios[2])


def test_write_chart_writes_a_png(tmp_path: Path) -> None:
    need_module("matplotlib")
    path = tmp_path / "chart.png"
    bp.write_chart(["a", "b"], [1.5, float("nan")], "title", [path])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sizes_quick_are_smaller_and_the_default_drains_a_million() -> None:
    full, quick = bp.Sizes.of(False), bp.Sizes.of(True)
    assert full.drain == full.kafka == full.spark == 1_000_000
    assert quick.drain < full.drain and quick.seconds < full.seconds


def test_target_met_reads_the_bound_and_its_direction() -> None:
    assert bp.target_met(1.49, "ratio >= 1.5") == "no" and bp.target_met(1.5, "ratio >= 1.5") == "yes"
    assert bp.target_met(0.4, "p99_ratio <= 1.0") == "yes" and bp.target_met(1.2, "p99_ratio <= 1.0") == "no"
    assert bp.target_met(float("nan"), "ratio >= 1.0") == "" and bp.target_met(2.0, "") == ""
