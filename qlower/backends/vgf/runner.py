"""Running a VGF file for real: the ML SDK scenario runner on Vulkan, with the ML
emulation layer providing the Vulkan ML extensions (VK_ARM_tensors and
VK_ARM_data_graph) on any Vulkan 1.3 device, here Mesa's CPU driver (lavapipe).

A run is one ``scenario-runner`` subprocess (PyPI ``ai-ml-sdk-scenario-runner``)
on a scenario JSON written to a temporary directory: the VGF as a ``graph``
resource, one ``tensor`` resource per model input (read from a ``.npy`` file)
and output (written to one), and a ``dispatch_vgf`` command binding them to
the model's binding numbers (descriptor set 0). A subprocess keeps a crash in
a Vulkan driver or layer out of the Python process.

The emulation layer (PyPI ``ai-ml-emulation-layer-for-vulkan``) is two
explicit layers. The graph layer needs VK_ARM_tensors from the layer below it,
so it must sit above the tensor layer. The Vulkan loader of Debian 12 (1.3.239)
orders explicit layers by where it found their manifests, not by their order
in VK_INSTANCE_LAYERS; with both manifests in the wheel's one directory the
graph layer can land below and device creation fails ("ML Emulation Layer for
Vulkan requires extension: VK_ARM_tensors"). So each manifest is copied, with
an absolute library path, into a directory of its own, and VK_LAYER_PATH lists
the graph layer's first. Unless the caller chose a driver (VK_DRIVER_FILES or
VK_ICD_FILENAMES), the lavapipe driver is selected when installed, so runs do
not depend on which GPU drivers happen to be present.
"""

from __future__ import annotations

import atexit
import functools
import glob
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qlower.backends.vgf.container import FORMATS
from qlower.backends.vgf.converter import diagnostics, package_dirs, packaged_binary
from qlower.errors import ExecutionError

LAYERS = ("VK_LAYER_ML_Graph_Emulation", "VK_LAYER_ML_Tensor_Emulation")   # top to bottom
_MANIFESTS = {"VK_LAYER_ML_Graph_Emulation": "VkLayer_Graph.json", "VK_LAYER_ML_Tensor_Emulation": "VkLayer_Tensor.json"}
LAVAPIPE_ICDS = "/usr/share/vulkan/icd.d/lvp_icd.*.json"
SETUP_HINT = ("run scripts/setup_vulkan.sh (Debian: libvulkan1 mesa-vulkan-drivers; PyPI: "
              "ai-ml-sdk-scenario-runner ai-ml-emulation-layer-for-vulkan)")
TIMEOUT_SECONDS = 900


class VulkanUnavailable(Exception):
    """The tools or the Vulkan device needed to run VGF files are missing here (message: what and how to fix)."""


@dataclass(frozen=True)
class TensorSpec:
    """A model input/output as the scenario binds it."""

    binding: int
    shape: tuple[int, ...]
    vk_format: str
    dtype: np.dtype


def specs_from_meta(entries: object, n_inputs: int, n_outputs: int, what: str
                    ) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Input and output TensorSpecs from a payload's JSON IO description (``VgfTensor.as_meta``
    entries with a "kind"); ExecutionError when it is malformed (e.g. an edited program file)."""
    kinds = ["input"] * n_inputs + ["output"] * n_outputs
    dtypes = {name: dtype for name, dtype in FORMATS.values() if dtype is not None}

    def ok(e: object, kind: str) -> bool:
        return (isinstance(e, dict) and e.get("kind") == kind and type(e.get("binding")) is int
                and isinstance(e.get("shape"), list) and all(type(d) is int and d > 0 for d in e["shape"])
                and e.get("format") in dtypes)

    if not isinstance(entries, list) or len(entries) != len(kinds) or not all(map(ok, entries, kinds)):
        raise ExecutionError(f"{what}: its IO description does not list {n_inputs} input(s) and {n_outputs} "
                             "output(s) with binding numbers, shapes and tensor formats; recompile the program")
    specs = [TensorSpec(e["binding"], tuple(e["shape"]), e["format"], dtypes[e["format"]].numpy) for e in entries]
    return specs[:n_inputs], specs[n_inputs:]


def scenario_runner_path() -> str:
    path = packaged_binary("scenario_runner", "binaries/bin/scenario-runner", "scenario-runner")
    if path is None:
        raise VulkanUnavailable(f"the ML SDK scenario runner (scenario-runner) is not installed: {SETUP_HINT}")
    return path


def _layer_manifest_dir() -> Path:
    for root in package_dirs("emulation_layer"):
        d = root / "deploy" / "share" / "vulkan" / "explicit_layer.d"
        if all((d / m).is_file() for m in _MANIFESTS.values()):
            return d
    raise VulkanUnavailable(f"the ML emulation layer for Vulkan is not installed: {SETUP_HINT}")


@functools.lru_cache(maxsize=1)
def _ordered_layer_path() -> str:
    """VK_LAYER_PATH with one directory per emulation layer, the graph layer's first (see module doc)."""
    src = _layer_manifest_dir()
    lib_dir = src.parent.parent.parent / "lib"
    root = Path(tempfile.mkdtemp(prefix="qlower-vk-layers-"))
    atexit.register(shutil.rmtree, root, True)
    dirs = []
    for i, layer in enumerate(LAYERS):
        manifest = json.loads((src / _MANIFESTS[layer]).read_text())
        lib = Path(manifest["layer"]["library_path"])
        if not lib.is_absolute():
            lib = lib_dir / lib.name
        if not lib.is_file():
            raise VulkanUnavailable(f"the ML emulation layer's library {lib} is missing: {SETUP_HINT}")
        manifest["layer"]["library_path"] = str(lib)
        d = root / f"{i}_{layer}"
        d.mkdir()
        (d / _MANIFESTS[layer]).write_text(json.dumps(manifest, indent=1))
        dirs.append(str(d))
    return os.pathsep.join(dirs)


def vulkan_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a scenario-runner process needs for the emulation layers (and lavapipe)."""
    env = dict(os.environ if base is None else base)
    env["VK_LAYER_PATH"] = _ordered_layer_path()
    env["VK_INSTANCE_LAYERS"] = ":".join(LAYERS)
    env.pop("VK_ADD_LAYER_PATH", None)
    if not env.get("VK_DRIVER_FILES") and not env.get("VK_ICD_FILENAMES"):
        icds = sorted(glob.glob(LAVAPIPE_ICDS))
        if icds:
            env["VK_DRIVER_FILES"] = env["VK_ICD_FILENAMES"] = icds[0]
    return env


def _device_name(log: str) -> str | None:
    for line in log.splitlines():
        if "INFO: Device:" in line:
            return line.split("INFO: Device:", 1)[1].split(", Type:")[0].strip()
    return None


@dataclass(frozen=True)
class RunResult:
    outputs: list[np.ndarray]
    device: str | None
    log: str


def run_vgf(vgf: bytes, inputs: Sequence[tuple[TensorSpec, np.ndarray]], outputs: Sequence[TensorSpec],
            what: str = "VGF model") -> RunResult:
    """Dispatch ``vgf`` once on ``inputs``; returns the outputs with the specs' dtypes and shapes.

    Raises VulkanUnavailable when the tools are missing, ExecutionError when the run fails.
    """
    exe = scenario_runner_path()
    env = vulkan_environment()
    arrays = []
    for i, (spec, x) in enumerate(inputs):
        x = np.ascontiguousarray(x)
        if x.dtype != spec.dtype or tuple(x.shape) != spec.shape:
            raise ExecutionError(f"{what}: input {i} is {x.dtype}{list(x.shape)}, the VGF binds "
                                 f"{spec.vk_format}{list(spec.shape)}")
        arrays.append(x)
    bound = _shared_bindings([s for s, _ in inputs], outputs, what)
    with tempfile.TemporaryDirectory(prefix="qlower-vgf-run-") as tmp:
        d = Path(tmp)
        (d / "model.vgf").write_bytes(vgf)
        resources: list[dict] = [{"graph": {"uid": "model", "src": str(d / "model.vgf")}}]
        bindings = []
        for i, (spec, x) in enumerate(zip((s for s, _ in inputs), arrays)):
            np.save(d / f"input_{i}.npy", x)
            resources.append({"tensor": {"uid": f"input_{i}", "dims": list(spec.shape), "format": spec.vk_format,
                                         "shader_access": "readonly", "src": str(d / f"input_{i}.npy")}})
            bindings.append({"set": 0, "id": spec.binding, "resource_ref": f"input_{i}"})
        for i, spec in enumerate(outputs):
            if bound[i] is not None:
                continue
            resources.append({"tensor": {"uid": f"output_{i}", "dims": list(spec.shape), "format": spec.vk_format,
                                         "shader_access": "writeonly", "dst": str(d / f"output_{i}.npy")}})
            bindings.append({"set": 0, "id": spec.binding, "resource_ref": f"output_{i}"})
        scenario = {"resources": resources,
                    "commands": [{"dispatch_vgf": {"graph_ref": "model", "bindings": bindings,
                                                   "shader_substitutions": []}}]}
        (d / "scenario.json").write_text(json.dumps(scenario, indent=1))
        cmd = [exe, "--scenario", str(d / "scenario.json"), "--output", str(d), "--log-level", "info"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, cwd=d,
                                  timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            raise ExecutionError(f"{what}: the scenario runner did not finish within {TIMEOUT_SECONDS} s") from None
        except OSError as e:
            raise VulkanUnavailable(f"can't start the scenario runner ({exe}): {e}; {SETUP_HINT}") from None
        log = proc.stderr + proc.stdout
        if proc.returncode != 0:
            raise ExecutionError(f"{what}: the ML SDK scenario runner failed (exit code {proc.returncode}, "
                                 f"command {' '.join(cmd)}):\n{_errors(log)}")
        results: list[np.ndarray] = []
        for i, spec in enumerate(outputs):
            if bound[i] is not None:
                kind, j = bound[i]
                results.append((arrays[j] if kind == "input" else results[j]).copy())
                continue
            path = d / f"output_{i}.npy"
            if not path.is_file():
                raise ExecutionError(f"{what}: the scenario runner exited 0 but wrote no output {i}:\n{_errors(log)}")
            y = np.load(path, allow_pickle=False)
            if y.dtype != spec.dtype or tuple(y.shape) != spec.shape:
                raise ExecutionError(f"{what}: output {i} came back as {y.dtype}{list(y.shape)}, the VGF declares "
                                     f"{spec.vk_format}{list(spec.shape)}")
            results.append(y)
    return RunResult(results, _device_name(log), log)


def _shared_bindings(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], what: str
                     ) -> list[tuple[str, int] | None]:
    """For each output, the earlier input/output whose binding it shares, or None.

    The model converter gives an output that *is* a graph input (or an output listed
    twice) the binding of that tensor: one resource, bound once. The output's value is
    then that input's (or that earlier output's) value.
    """
    first: dict[int, tuple[str, int]] = {}
    for i, spec in enumerate(inputs):
        if spec.binding in first:
            raise ExecutionError(f"{what}: inputs {first[spec.binding][1]} and {i} share binding {spec.binding}")
        first[spec.binding] = ("input", i)
    shared: list[tuple[str, int] | None] = []
    for i, spec in enumerate(outputs):
        other = first.get(spec.binding)
        if other is not None:
            o = inputs[other[1]] if other[0] == "input" else outputs[other[1]]
            if (o.shape, o.vk_format) != (spec.shape, spec.vk_format):
                raise ExecutionError(f"{what}: output {i} shares binding {spec.binding} with {other[0]} {other[1]} "
                                     f"but is {spec.vk_format}{list(spec.shape)}, not {o.vk_format}{list(o.shape)}")
        else:
            first[spec.binding] = ("output", i)
        shared.append(other)
    return shared


def _errors(log: str) -> str:
    """The runner's and the layers' error lines (the whole log when there are none)."""
    keep = [line for line in log.splitlines() if "ERROR" in line or "[Error]" in line or "error" in line]
    return diagnostics("\n".join(keep) if keep else log)
