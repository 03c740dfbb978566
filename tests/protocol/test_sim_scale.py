"""The simulator at scale (snapmesh/sim/scale.py) with its latency model (snapmesh/sim/latency.py)."""

import random

import pytest

from snapmesh.protocol.appstate import CHECKED
from snapmesh.sim.latency import LatencyError, LatencyModel
from snapmesh.sim.scale import ScaleRun, diameter, run_scale


def _figures(result) -> dict:
    return {k: v for k, v in result.row().items() if not k.endswith("cpu_s")}


def test_same_seed_same_run_figure_for_figure_and_another_seed_differs() -> None:
    a, b = run_scale("random-regular:8", 40, 7), run_scale("random-regular:8", 40, 7)
    assert _figures(a) == _figures(b)
    assert _figures(run_scale("random-regular:8", 40, 8)) != _figures(a)


def test_a_link_delay_is_drawn_from_its_span_and_a_bad_model_is_refused() -> None:
    model = LatencyModel(rack_size=2, regions=2)
    rng = random.Random(1)
    assert [model.span(0, 1), model.span(0, 2), model.span(0, 4)] == ["rack", "region", "zone"]
    for a, b, (low, high) in [(0, 1, model.rack_ms), (0, 2, model.region_ms), (0, 4, model.zone_ms)]:
        assert all(low / 1000 <= model.delay(a, b, rng) <= high / 1000 for _ in range(200))
    with pytest.raises(LatencyError, match="region_ms must be 0 <= low <= high, got 80-20"):
        LatencyModel(region_ms=(80.0, 20.0))
    with pytest.raises(LatencyError, match="rack_size"):
        LatencyModel(rack_size=0)


def test_the_diameter_of_each_shape() -> None:
    ids = [f"n{i}" for i in range(6)]
    ring = {ids[i]: [ids[(i + 1) % 6]] for i in range(6)}
    mesh = {a: [b for b in ids if b != a] for a in ids}
    assert (diameter(ids, ring), diameter(ids, mesh)) == (5, 1)


def test_a_snapshot_takes_at_least_a_hop_per_hop_of_the_diameter() -> None:
    """The marker crosses the ring hop by hop: its duration grows with the diameter, each hop at least 1 ms."""
    ring, regular = run_scale("ring", 200, 3), run_scale("random-regular:8", 200, 3)
    assert (ring.diameter, regular.diameter) == (199, 4)
    assert ring.duration_s >= ring.diameter * LatencyModel().rack_ms[0] / 1000
    assert ring.duration_s > 3 * regular.duration_s


def test_reports_list_only_the_channels_that_recorded_messages_and_the_answer_lists_every_one() -> None:
    result = run_scale("mesh", 40, 2, traffic=8)
    assert 0 < result.recorded_channels < result.channels
    assert result.report_channels == result.recorded_channels
    assert result.answer_channels == result.channels == 40 * 39
    assert result.steps == 41  # the trigger and one report a node


def test_report_bytes_grow_with_nodes_plus_recorded_channels_not_with_all_channels() -> None:
    mesh, regular = run_scale("mesh", 60, 4), run_scale("random-regular:8", 60, 4)
    assert mesh.channels == 7 * regular.channels + 60 * 3  # 3,540 against 480
    per_mesh = mesh.report_bytes / (mesh.nodes + mesh.recorded_channels)
    per_regular = regular.report_bytes / (regular.nodes + regular.recorded_channels)
    assert 0.8 < per_mesh / per_regular < 1.25
    assert mesh.report_bytes < 2 * regular.report_bytes


def test_the_controller_checks_the_snapshot_as_a_bank_clusters_with_the_bank_apps_checker() -> None:
    """The scale run's nodes report as the bank app's nodes do (state bytes, payloads),
    and the controller judges the COMPLETE snapshot through the bank app's checker."""
    run = ScaleRun("random-regular:8", 30, 5, traffic=8)
    result = run.run()
    answer = run.answer
    assert result.recorded_items > 0
    assert answer.app.name == "bank" and answer.app.status == CHECKED
    assert [(i.name, i.ok) for i in answer.app.invariants] == [("conserved", True)]
    assert answer.conserved and answer.total == answer.expected_total == 30 * 8
    assert all(n.state == str(n.balance).encode() for n in answer.nodes)
