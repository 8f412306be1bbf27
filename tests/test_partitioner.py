"""Partitioning across EPs with toy EPs written against the public plugin contract."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal import errors
from tests.conftest import PLUGINS, library_module
from tests.models import add_mul_model, add_mul_reference, make, vi

TOY = os.path.join(PLUGINS, "toy_fusing_ep.py")


@pytest.fixture
def toy(register):
    mod = library_module(register(TOY, "toy_fusing"))
    mod.LOG.clear()
    return mod


def _session(model, *eps, fallback=True, record=True, device_index=0):
    so = onnxhal.SessionOptions()
    # the assignments below name the model's own nodes: no ElementwiseChain over the CPU EP's share
    so.add_session_config_entry("optimization.disable_passes", "fuse_elementwise_chains")
    if record:
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if not fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for name, opts in eps:
        devs = [d for d in onnxhal.get_ep_devices() if d.ep_name == name]
        so.add_provider_for_devices([devs[device_index]], opts)
    return onnxhal.InferenceSession(model, so)


def _assignment(sess):
    """(EP, node names) per assigned subgraph: a fused group is one, every node an EP takes singly
    (the CPU EP's, a kernel EP's) is one of its own, as onnxruntime reports them."""
    return [(s.ep_name, sorted(n.name for n in s.get_nodes())) for s in sess.get_provider_graph_assignment_info()]


X = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)


def test_fused_group_compiles_and_runs(toy):
    sess = _session(add_mul_model(), ("ToyA", {"ops": "Add,Mul"}))
    assert _assignment(sess) == [("ToyA", ["add1", "add2", "mul"])]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))
    (event,) = [e for e in toy.LOG if e[0] == "compile"]
    (inputs, outputs, n), = event[3]
    assert inputs == ["x"] and outputs == ["y"] and n == 3  # constants dropped into the EP


def test_compile_gets_the_graph_planned_while_claiming(toy):
    # EpGraphSupportInfo.filtered_graph is the object compile receives: what the EP built from it in
    # get_capability is kept (the toy counts the groups it did not build again).
    sess = _session(add_mul_model(), ("ToyA", {"ops": "Add,Mul"}))
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))
    assert [e[3] for e in toy.LOG if e[0] == "trials_kept"] == [1]


def test_partial_claim_leaves_the_rest_to_cpu(toy):
    sess = _session(add_mul_model(), ("ToyA", {"ops": "Mul"}))
    assert _assignment(sess) == [("ToyA", ["mul"]), ("CPUExecutionProvider", ["add1"]), ("CPUExecutionProvider", ["add2"])]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))


def test_single_nodes_run_through_kernels(toy):
    sess = _session(add_mul_model(), ("ToyA", {"ops": "Add", "mode": "single"}))
    assert _assignment(sess) == [("ToyA", ["add1"]), ("ToyA", ["add2"]), ("CPUExecutionProvider", ["mul"])]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))


def _diamond():
    """a = x + 1; r = Relu(a); y = a * r: claiming {Add, Mul} as one group is not one partition."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [3], [1, 1, 1])
    nodes = [helper.make_node("Add", ["x", "one"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Mul", ["a", "r"], ["y"], name="mul")]
    return make(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])], [one])


def test_group_with_an_outside_node_between_members_is_rejected(toy, caplog):
    with caplog.at_level(logging.INFO, logger="onnxhal.partitioner"):
        sess = _session(_diamond(), ("ToyA", {"ops": "Add,Mul", "mode": "group"}))
    assert "not one partition" in caplog.text and "'relu'" in caplog.text
    assert _assignment(sess) == [("CPUExecutionProvider", ["add"]), ("CPUExecutionProvider", ["relu"]), ("CPUExecutionProvider", ["mul"])]
    a = X + 1
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], a * np.maximum(a, 0))


def test_first_ep_wins(toy):
    sess = _session(add_mul_model(), ("ToyA", {"ops": "Mul"}), ("ToyB", {"ops": "Add,Mul", "mode": "single"}))
    assert sess.get_providers() == ["ToyA", "ToyB", "CPUExecutionProvider"]
    assert _assignment(sess) == [("ToyA", ["mul"]), ("ToyB", ["add1"]), ("ToyB", ["add2"])]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))


def test_a_group_overlapping_another_eps_nodes_is_skipped(toy):
    sess = _session(add_mul_model(), ("ToyA", {"ops": "Mul", "mode": "single"}), ("ToyB", {"ops": "Add,Mul", "mode": "group"}))
    assert _assignment(sess) == [("ToyA", ["mul"]), ("CPUExecutionProvider", ["add1"]), ("CPUExecutionProvider", ["add2"])]


def test_two_instances_of_one_ep_on_different_devices(toy):
    s0 = _session(add_mul_model(), ("ToyA", {"ops": "Add,Mul"}), device_index=0)
    s1 = _session(add_mul_model(), ("ToyA", {"ops": "Mul"}), device_index=1)
    created = [(e[1], e[2]) for e in toy.LOG if e[0] == "create_ep"]
    assert created == [("ToyA", 0), ("ToyA", 1)]
    assert _assignment(s0) == [("ToyA", ["add1", "add2", "mul"])]
    assert _assignment(s1) == [("ToyA", ["mul"]), ("CPUExecutionProvider", ["add1"]), ("CPUExecutionProvider", ["add2"])]
    for s in (s0, s1):
        np.testing.assert_allclose(s.run(None, {"x": X})[0], add_mul_reference(X))


def test_disabled_fallback_with_nodes_left_names_them(toy):
    with pytest.raises(errors.Fail, match=r"disabled by the user.*Add 'add1'"):
        _session(add_mul_model(), ("ToyA", {"ops": "Mul"}), fallback=False)
    sess = _session(add_mul_model(), ("ToyA", {"ops": "Add,Mul"}), fallback=False)
    assert sess.get_providers() == ["ToyA"]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))


def test_compile_failure_falls_back_to_cpu(toy, caplog):
    with caplog.at_level(logging.WARNING):
        sess = _session(add_mul_model(), ("ToyA", {"ops": "Add,Mul", "fail": "compile"}))
    assert "program build failed" in caplog.text
    assert _assignment(sess) == [("CPUExecutionProvider", ["add1", "add2", "mul"])]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))


def test_failing_get_capability_gets_no_nodes(toy):
    sess = _session(add_mul_model(), ("ToyA", {"fail": "capability"}))
    assert _assignment(sess) == [("CPUExecutionProvider", ["add1"]), ("CPUExecutionProvider", ["mul"]), ("CPUExecutionProvider", ["add2"])]


def _if_model():
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"], name="then_add")], "then_branch", [],
                               [vi("t", [2, 3])])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["e"], name="else_mul")], "else_branch", [],
                               [vi("e", [2, 3])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    return make(nodes, [vi("c", [], TensorProto.BOOL), vi("x", [2, 3])], [vi("y", [2, 3])])


def test_subgraphs_are_offered_nested_first(toy):
    sess = _session(_if_model(), ("ToyA", {"ops": "Add,Mul", "mode": "single"}))
    graphs = [e[3] for e in toy.LOG if e[0] == "capability"]
    assert graphs[-1] == "g" and set(graphs[:-1]) == {"then_branch", "else_branch"}
    # One assignment entry per EP per graph.
    assert sorted(_assignment(sess)) == [("CPUExecutionProvider", ["if"]), ("ToyA", ["else_mul"]),
                                         ("ToyA", ["then_add"])]
    np.testing.assert_allclose(sess.run(None, {"c": np.array(True), "x": X})[0], X + X)
    np.testing.assert_allclose(sess.run(None, {"c": np.array(False), "x": X})[0], X * X)


def test_assignment_info_needs_the_config_entry(toy):
    sess = _session(add_mul_model(), ("ToyA", {}), record=False)
    with pytest.raises(errors.Fail, match="record_ep_graph_assignment_info"):
        sess.get_provider_graph_assignment_info()


# -- a device lost mid-session ---------------------------------------------------------------------------

def _lossy(failover: bool):
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_session_config_entry("optimization.disable_passes", "fuse_elementwise_chains")
    if failover:
        so.add_session_config_entry("session.ep_failover", "1")
    so.add_provider_for_devices([d for d in onnxhal.get_ep_devices() if d.ep_name == "ToyA"][:1],
                                {"ops": "Add,Mul", "lose_after": "2"})
    return onnxhal.InferenceSession(add_mul_model(), so)


def test_ep_failover_repartitions_onto_the_remaining_eps(toy, caplog):
    sess = _lossy(failover=True)
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))
    assert sess.get_providers() == ["ToyA", "CPUExecutionProvider"]
    with caplog.at_level(logging.WARNING):
        np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))  # meets the lost device
    assert "EP failover: ToyA failed" in caplog.text
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert [f[0] for f in sess.failovers] == ["ToyA"]
    for _ in range(3):  # later runs stay on what is left
        np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))
    assert _assignment(sess) == [("CPUExecutionProvider", ["add1"]), ("CPUExecutionProvider", ["mul"]), ("CPUExecutionProvider", ["add2"])]


def test_lost_device_without_failover_is_a_typed_error_and_the_session_survives(toy):
    sess = _lossy(failover=False)
    sess.disable_fallback()
    for _ in range(2):
        sess.run(None, {"x": X})
    for _ in range(2):  # the device stays lost: each run fails cleanly, nothing crashes or hangs
        with pytest.raises(errors.EPFail, match="device lost"):
            sess.run(None, {"x": X})
    sess.enable_fallback()  # onnxruntime's behaviour: fall back to the CPU EP once, then stay
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))
    assert sess.get_providers() == ["CPUExecutionProvider"]


def _runs_from_threads(sess, threads: int = 4, runs: int = 20) -> list:
    """Each of ``threads`` threads runs ``sess`` ``runs`` times against the reference; the errors."""
    import threading

    bad: list = []

    def worker():
        for _ in range(runs):
            try:
                np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))
            except Exception as e:  # noqa: BLE001 - collected and asserted by the caller
                bad.append(e)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return bad


def test_failover_from_many_threads_at_once(toy):
    sess = _lossy(failover=True)
    bad = _runs_from_threads(sess)
    assert bad == [] and sess.get_providers() == ["CPUExecutionProvider"] and len(sess.failovers) == 1


def test_fallback_from_many_threads_at_once_falls_back_once(toy, caplog):
    """One recovery policy for failover and fallback: threads that meet the lost device together
    rebuild the session once, on the CPU EP, and every run answers."""
    sess = _lossy(failover=False)
    with caplog.at_level(logging.WARNING):
        bad = _runs_from_threads(sess)
    assert bad == [] and sess.get_providers() == ["CPUExecutionProvider"] and sess.failovers == []
    assert caplog.text.count("Falling back to ['CPUExecutionProvider']") == 1


def test_optimizer_keeps_plain_ops_for_eps_that_cannot_run_fused_ones(toy):
    """Conv -> Relu would become a com.onnxhal FusedConv, which ToyA cannot claim: with ToyA in the
    session the fusion is not made, so ToyA still gets its Relu."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1, 3, 3], rng.standard_normal(18).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = make(nodes, [vi("x", [1, 1, 4, 4])], [vi("y", [1, 2, 4, 4])], [w])
    sess = _session(model, ("ToyA", {"ops": "Relu", "mode": "single"}))
    assert sorted(_assignment(sess)) == [("CPUExecutionProvider", ["conv"]), ("ToyA", ["relu"])]
    cpu_only = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_only.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


# -- found by a random partitioning test (10,000 seeds of random claims by toy EPs) -----------
def _crossed():
    """Two groups that are each one partition but feed each other: {relu, sig} reads c from
    {neg, abs}, which reads a from {relu, sig}. Fusing both would make a cycle."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Mul", ["x", "x"], ["c"], name="neg"),
             helper.make_node("Add", ["a", "c"], ["b"], name="abs"), helper.make_node("Relu", ["c"], ["d"], name="sig")]
    return make(nodes, [vi("x", [2, 3])], [vi("b", [2, 3]), vi("d", [2, 3])])


def _crossed_reference(x):
    return [np.maximum(x, 0) + x * x, np.maximum(x * x, 0)]


@pytest.mark.parametrize("eps", [
    [("ToyA", {"mode": "script", "groups": "relu+sig;neg+abs"})],
    [("ToyA", {"mode": "script", "groups": "relu+sig"}), ("ToyB", {"mode": "script", "groups": "neg+abs"})],
])
def test_a_group_that_would_close_a_cycle_with_a_fused_group_is_rejected(toy, caplog, eps):
    with caplog.at_level(logging.INFO, logger="onnxhal.partitioner"):
        sess = _session(_crossed(), *eps)  # built: no cycle
    assert "or in a group fused before it" in caplog.text
    assert _assignment(sess) == [("ToyA", ["relu", "sig"]), ("CPUExecutionProvider", ["neg"]), ("CPUExecutionProvider", ["abs"])]
    for got, want in zip(sess.run(None, {"x": X}), _crossed_reference(X)):
        np.testing.assert_allclose(got, want)


def test_a_node_claimed_twice_is_assigned_once(toy):
    sess = _session(add_mul_model(), ("ToyA", {"mode": "script", "singles": "add1,add1", "ops": "Add"}))
    assert _assignment(sess) == [("ToyA", ["add1"]), ("CPUExecutionProvider", ["mul"]), ("CPUExecutionProvider", ["add2"])]
    assert sess.partition_summary == {"ToyA": 1, "CPUExecutionProvider": 2}
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], add_mul_reference(X))


def test_a_device_lost_inside_a_subgraph_fails_over_the_ep_that_lost_it(toy, caplog):
    """The If runs on the CPU EP, its then-branch Add on ToyA, whose device is lost: failover
    must remove ToyA (blamed on the If's EP, the error would make nothing fail over)."""
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"], name="then_add")], "then", [],
                               [vi("t", [2, 3])])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["e"], name="else_mul")], "else", [],
                               [vi("e", [2, 3])])
    model = make([helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)],
                 [vi("c", [], TensorProto.BOOL), vi("x", [2, 3])], [vi("y", [2, 3])])
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.ep_failover", "1")
    so.add_provider_for_devices([d for d in onnxhal.get_ep_devices() if d.ep_name == "ToyA"][:1],
                                {"ops": "Add", "lose_after": "1"})
    sess = onnxhal.InferenceSession(model, so)
    feeds = {"c": np.array(True), "x": X}
    np.testing.assert_allclose(sess.run(None, feeds)[0], X + X)
    with caplog.at_level(logging.WARNING):
        np.testing.assert_allclose(sess.run(None, feeds)[0], X + X)  # meets the lost device
    assert "EP failover: ToyA failed" in caplog.text
    assert [f[0] for f in sess.failovers] == ["ToyA"] and sess.get_providers() == ["CPUExecutionProvider"]
