"""protogen compiles the service protos, and the examples' when the tree has them."""

from __future__ import annotations

from snapmesh.commands import protogen


def test_a_tree_without_examples_still_generates_the_service_code(tmp_path, monkeypatch):
    # An image's build context holds snapmesh/ but not examples/: the link dangles, no example proto is found.
    monkeypatch.setattr(protogen, "EXAMPLES", tmp_path / "no-examples")
    (tmp_path / "out").mkdir()
    assert protogen.generate(tmp_path / "out") == 0
    assert (tmp_path / "out" / "snapmesh" / "v1" / "snapmesh_pb2_grpc.py").is_file()
    assert not list((tmp_path / "out").rglob("shop_pb2.py"))


def test_the_examples_protos_are_compiled_when_present(tmp_path):
    (tmp_path / "out").mkdir()
    assert protogen.generate(tmp_path / "out") == 0
    assert list((tmp_path / "out").rglob("shop_pb2_grpc.py"))
