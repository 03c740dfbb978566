"""The 64-process bench (bench/scale64.py) at a tiny size: 6 real node processes, a sparse
graph then the mesh; it measures every figure it declares, and the numbers hold together."""

import math

from bench import scale64


def test_the_scale_bench_runs_both_topologies_and_measures_every_key() -> None:
    said: list[str] = []
    out = scale64.measure(6, 3, 2, say=said.append)
    assert sorted(out) == sorted(scale64.keys())
    assert all(math.isfinite(v) and v >= 0 for v in out.values()), out
    assert (out["scale64_sparse_channels"], out["scale64_mesh_channels"]) == (18, 30)
    for label in ("sparse", "mesh"):
        assert out[f"scale64_{label}_snapshots_complete"] == 2
        assert 0 < out[f"scale64_{label}_snapshot_p50_ms"] <= out[f"scale64_{label}_snapshot_p99_ms"]
        assert 0 < out[f"scale64_{label}_node_rss_mib_median"] <= out[f"scale64_{label}_node_rss_mib_max"]
    assert [line.split()[0] for line in said] == ["random-regular:3:", "mesh:"]
