"""The scenario-runner driver: the Vulkan environment it builds (emulation layers in the order
the loader must stack them, lavapipe unless the caller chose a driver) and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qlower.backends.vgf import runner
from qlower.backends.vgf.container import read_vgf
from qlower.backends.vgf.converter import tosa_to_vgf
from qlower.backends.vgf.runner import TensorSpec, VulkanUnavailable, run_vgf
from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph


def test_layer_path_stacks_the_graph_layer_above_the_tensor_layer():
    env = runner.vulkan_environment({})
    dirs = env["VK_LAYER_PATH"].split(":")
    assert len(dirs) == 2
    names = []
    for d in dirs:
        (manifest,) = Path(d).glob("*.json")
        layer = json.loads(manifest.read_text())["layer"]
        assert Path(layer["library_path"]).is_absolute() and Path(layer["library_path"]).is_file()
        names.append(layer["name"])
    # first directory = found first = nearest the application
    assert names == ["VK_LAYER_ML_Graph_Emulation", "VK_LAYER_ML_Tensor_Emulation"]
    assert env["VK_INSTANCE_LAYERS"] == "VK_LAYER_ML_Graph_Emulation:VK_LAYER_ML_Tensor_Emulation"


def test_lavapipe_unless_the_caller_chose_a_driver():
    lavapipe = sorted(Path("/usr/share/vulkan/icd.d").glob("lvp_icd.*.json"))
    if not lavapipe:
        pytest.fail("Mesa's lavapipe driver is not installed: scripts/setup_vulkan.sh installs mesa-vulkan-drivers")
    assert runner.vulkan_environment({})["VK_DRIVER_FILES"] == str(lavapipe[0])
    mine = runner.vulkan_environment({"VK_ICD_FILENAMES": "/opt/my_icd.json"})
    assert mine["VK_ICD_FILENAMES"] == "/opt/my_icd.json" and "VK_DRIVER_FILES" not in mine


def test_missing_emulation_layer_is_reported(monkeypatch):
    monkeypatch.setattr(runner, "package_dirs", lambda name: [])
    with pytest.raises(VulkanUnavailable, match="emulation layer for Vulkan is not installed.*setup_vulkan.sh"):
        runner._layer_manifest_dir()


@pytest.fixture(scope="module")
def clamp_vgf():
    from qlower.backends.tosa import TosaBackend

    b = GraphBuilder("clamp")
    x = b.input("x", TensorType((3, 4), DType.INT8, QuantSpec.per_tensor(0.1, 0)))
    g = verify_graph(b.build([b.op("clamp", x, min=-2, max=6)]))
    data = tosa_to_vgf(TosaBackend().lower(g, "tosa-1.0+int").blobs["graph.tosa"]).vgf
    model = read_vgf(data)
    specs = [TensorSpec(t.binding, t.shape, t.vk_format, np.dtype(t.dtype.numpy)) for t in model.inputs + model.outputs]
    return data, specs[0], specs[1]


def test_run_vgf_directly(clamp_vgf):
    data, spec_in, spec_out = clamp_vgf
    x = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
    result = run_vgf(data, [(spec_in, x)], [spec_out])
    assert result.outputs[0].tolist() == [[-2, -2, -2, -2], [-2, -1, 0, 1], [2, 3, 4, 5]]
    assert result.device


def test_scenario_runner_failure_is_an_execution_error_with_its_log(clamp_vgf):
    data, spec_in, spec_out = clamp_vgf
    wrong = TensorSpec(spec_out.binding, (3, 4), "VK_FORMAT_R32_SINT", np.dtype(np.int32))  # VGF writes int8
    with pytest.raises(ExecutionError, match="(?s)scenario runner failed \\(exit code .*ERROR"):
        run_vgf(data, [(spec_in, np.zeros((3, 4), np.int8))], [wrong], "probe")


def test_inputs_must_match_the_vgf_tensors(clamp_vgf):
    data, spec_in, spec_out = clamp_vgf
    with pytest.raises(ExecutionError, match=r"input 0 is int16\[3, 4\], the VGF binds VK_FORMAT_R8_SINT\[3, 4\]"):
        run_vgf(data, [(spec_in, np.zeros((3, 4), np.int16))], [spec_out])


def test_no_vulkan_driver_is_an_execution_error_naming_the_failure(clamp_vgf, monkeypatch):
    """The caller's driver choice is kept; a driver that doesn't exist fails instance creation."""
    data, spec_in, spec_out = clamp_vgf
    monkeypatch.setenv("VK_DRIVER_FILES", "/nonexistent/no_icd.json")
    with pytest.raises(ExecutionError, match="createInstance: ErrorIncompatibleDriver"):
        run_vgf(data, [(spec_in, np.zeros((3, 4), np.int8))], [spec_out])
