"""EP selection exactly as ORT: device order, policies, delegate, explicit devices, options."""

from __future__ import annotations

import os

import numpy as np
import pytest

import onnxhal
from onnxhal import errors
from onnxhal.runtime.env.selection import order_devices
from tests.conftest import PLUGINS, library_module
from tests.models import add_mul_model, add_mul_reference

P = onnxhal.OrtExecutionProviderDevicePolicy
SEL = os.path.join(PLUGINS, "selection_eps.py")


@pytest.fixture
def four_eps(register):
    mod = library_module(register(SEL, "selection_eps"))
    mod.CREATED.clear()
    return mod


def _label(d: onnxhal.OrtEpDevice) -> str:
    if d.ep_name == "GpuEP":
        return "GpuEP:" + d.ep_metadata["which"]
    return d.ep_name


def test_sorted_order_matches_ort(four_eps):
    order = [_label(d) for d in order_devices(onnxhal.get_ep_devices())]
    assert order == ["ZNpuEP", "GpuEP:discrete", "GpuEP:integrated", "AmdCpuEP", "OtherCpuEP",
                     "CPUExecutionProvider"]


@pytest.mark.parametrize("policy, expected", [
    (P.DEFAULT, ["AmdCpuEP", "CPUExecutionProvider"]),
    (P.PREFER_CPU, ["AmdCpuEP", "CPUExecutionProvider"]),
    (P.PREFER_GPU, ["GpuEP", "AmdCpuEP", "CPUExecutionProvider"]),
    (P.MAX_PERFORMANCE, ["GpuEP", "AmdCpuEP", "CPUExecutionProvider"]),
    (P.PREFER_NPU, ["ZNpuEP", "AmdCpuEP", "CPUExecutionProvider"]),
    (P.MAX_EFFICIENCY, ["ZNpuEP", "AmdCpuEP", "CPUExecutionProvider"]),
    (P.MIN_OVERALL_POWER, ["ZNpuEP", "AmdCpuEP", "CPUExecutionProvider"]),
])
def test_policies(four_eps, policy, expected):
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy(policy)
    sess = onnxhal.InferenceSession(add_mul_model(), so)
    assert sess.get_providers() == expected
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], add_mul_reference(x))
    if policy in (P.PREFER_GPU, P.MAX_PERFORMANCE):  # at most one GPU, the discrete one
        gpu = [c for c in four_eps.CREATED if c[0] == "GpuEP"]
        assert len(gpu) == 1 and len(gpu[0][1]) == 1 and gpu[0][1][0].metadata["Discrete"] == "1"


@pytest.mark.parametrize("policy", list(P))
def test_every_policy_gives_the_cpu_ep_alone_when_it_is_the_only_one(policy):
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy(policy)
    assert onnxhal.InferenceSession(add_mul_model(), so).get_providers() == ["CPUExecutionProvider"]


def test_out_of_range_policy_is_an_error_not_a_crash():
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy(P(99))  # accepted, as ORT's enum accepts it
    with pytest.raises(errors.InvalidArgument, match="99"):
        onnxhal.InferenceSession(add_mul_model(), so)


@pytest.mark.parametrize("bad", [3, "PREFER_GPU", None])
def test_policy_must_be_the_enum(bad):
    with pytest.raises(TypeError):
        onnxhal.SessionOptions().set_provider_selection_policy(bad)


def test_auto_selection_applies_device_options_as_defaults(four_eps):
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy(P.PREFER_NPU)
    sess = onnxhal.InferenceSession(add_mul_model(), so)
    assert sess.get_provider_options()["ZNpuEP"] == {"npu_opt": "default"}
    so.add_session_config_entry("ep.znpuep.npu_opt", "mine")
    sess = onnxhal.InferenceSession(add_mul_model(), so)
    assert sess.get_provider_options()["ZNpuEP"] == {"npu_opt": "mine"}  # the user's value wins


def test_disable_cpu_ep_fallback_drops_the_trailing_cpu_ep(four_eps):
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy(P.PREFER_GPU)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    with pytest.raises(errors.Fail, match="fallback to CPU EP has been explicitly disabled") as e:
        onnxhal.InferenceSession(add_mul_model(), so)
    assert "add1" in str(e.value)  # names the nodes left over
    assert [c[0] for c in four_eps.CREATED] == ["GpuEP", "AmdCpuEP"]


# -- the delegate ----------------------------------------------------------------------------------------

def test_delegate_receives_sorted_devices_and_model_metadata(four_eps):
    seen = {}

    def delegate(devices, model_metadata, runtime_metadata, max_selections):
        seen.update(devices=[_label(d) for d in devices], md=model_metadata, rt=runtime_metadata, max=max_selections)
        cpu = [d for d in devices if d.ep_name == "CPUExecutionProvider"][0]
        gpu = [d for d in devices if d.ep_name == "GpuEP"][0]
        return [cpu, gpu]

    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy_delegate(delegate)
    model = add_mul_model()
    model.producer_name = "tester"
    sess = onnxhal.InferenceSession(model, so)
    assert seen["devices"][0] == "ZNpuEP" and seen["devices"][-1] == "CPUExecutionProvider"
    assert seen["md"]["producer_name"] == "tester" and seen["md"]["graph_name"] == "g"
    assert seen["md"]["model_version"] == str(2**63 - 1)
    assert seen["rt"] == {} and seen["max"] == 8
    assert sess.get_providers() == ["CPUExecutionProvider", "GpuEP"]  # fold order, no implicit re-append


def test_delegate_duplicates_are_kept(four_eps):
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy_delegate(
        lambda devs, md, rt, n: [[d for d in devs if d.ep_name == "ZNpuEP"][0]] * 2)
    onnxhal.InferenceSession(add_mul_model(), so)
    assert len([c for c in four_eps.CREATED if c[0] == "ZNpuEP"][0][1]) == 2


@pytest.mark.parametrize("delegate, message", [
    (lambda devs, md, rt, n: (_ for _ in ()).throw(RuntimeError("no luck")), "EP selection delegate failed: .*no luck"),
    (lambda devs, md, rt, n: [], "EP selection delegate did not select anything."),
    (lambda devs, md, rt, n: [devs[-1]] * 9,
     r"EP selection delegate selected too many EP devices \(9\). The limit is 8 EP devices."),
    (lambda devs, md, rt, n: "cpu", "Unable to cast"),
])
def test_delegate_errors(delegate, message):
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy_delegate(delegate)
    with pytest.raises(errors.Fail, match=message):
        onnxhal.InferenceSession(add_mul_model(), so)


def test_policy_and_delegate_share_one_slot():
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy_delegate(lambda *a: [])
    so.set_provider_selection_policy(P.PREFER_CPU)
    assert onnxhal.InferenceSession(add_mul_model(), so).get_providers() == ["CPUExecutionProvider"]


# -- explicit devices ------------------------------------------------------------------------------------

def test_explicit_devices_win_over_a_policy(four_eps):
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy(P.PREFER_NPU)
    so.add_provider_for_devices([d for d in onnxhal.get_ep_devices() if d.ep_name == "OtherCpuEP"], {"Key": "V"})
    sess = onnxhal.InferenceSession(add_mul_model(), so)
    assert sess.get_providers() == ["OtherCpuEP", "CPUExecutionProvider"]
    assert so.get_session_config_entry("ep.othercpuep.Key") == "V"
    with pytest.raises(errors.InvalidArgument):
        so.get_session_config_entry("ep.OtherCpuEP.Key")  # stored lower-case only, as ORT


def test_add_provider_for_devices_errors(four_eps):
    so = onnxhal.SessionOptions()
    with pytest.raises(errors.InvalidArgument, match="Must provide one or more OrtEpDevice instances."):
        so.add_provider_for_devices([], {})
    with pytest.raises(TypeError):
        so.add_provider_for_devices(None, {})
    with pytest.raises(TypeError):
        so.add_provider_for_devices(["CPUExecutionProvider"], {})
    two = [d for d in onnxhal.get_ep_devices() if d.ep_name in ("GpuEP", "ZNpuEP")]
    with pytest.raises(errors.InvalidArgument, match="must have the same execution provider"):
        so.add_provider_for_devices(two, {})
    assert not so.has_providers()


def test_same_ep_twice_fails_at_session_creation(four_eps):
    so = onnxhal.SessionOptions()
    d = [d for d in onnxhal.get_ep_devices() if d.ep_name == "ZNpuEP"]
    so.add_provider_for_devices(d, {})
    so.add_provider_for_devices(d, {})
    with pytest.raises(errors.Fail, match="Provider ZNpuEP has already been registered."):
        onnxhal.InferenceSession(add_mul_model(), so)


def test_explicit_cpu_ep_conflicts_with_disabled_fallback():
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices([onnxhal.get_ep_devices()[0]], {})
    with pytest.raises(errors.InvalidArgument, match="Conflicting session configuration"):
        onnxhal.InferenceSession(add_mul_model(), so)


def test_has_providers():
    so = onnxhal.SessionOptions()
    assert not so.has_providers()
    so.set_provider_selection_policy(P.DEFAULT)
    assert so.has_providers()


def test_legacy_provider_list(four_eps):
    sess = onnxhal.InferenceSession(add_mul_model(), providers=[("ZNpuEP", {"a": "1"}), "CPUExecutionProvider"])
    assert sess.get_providers() == ["ZNpuEP", "CPUExecutionProvider"]
    assert sess.get_provider_options()["ZNpuEP"] == {"a": "1", "npu_opt": "default"}
    with pytest.raises(errors.InvalidArgument, match="'NoSuchExecutionProvider' is unknown.*Available providers"):
        onnxhal.InferenceSession(add_mul_model(), providers=["NoSuchExecutionProvider"])
