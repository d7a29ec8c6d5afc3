"""Bad arguments get a QlowerError naming the argument and what is accepted, before any work
starts, never a raw Python exception from deep inside PyTorch, PT2E or NumPy."""

import threading

import numpy as np
import pytest
import torch

import qlower
from qlower.errors import ConfigError, InputError, InvalidProgramError, QlowerError, UnknownTargetError
from qlower.ir.requant import RequantRangeError, quantize_multiplier

X = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()


def _compile(model=None, example=(X,), **kw):
    kw.setdefault("progress", False)
    return qlower.compile(_model() if model is None else model, example, **kw)


def _raises(cls, *fragments, fn):
    with pytest.raises(cls) as e:
        fn()
    assert isinstance(e.value, QlowerError)
    for f in fragments:
        assert f in str(e.value), (f, str(e.value))


def test_a_model_that_is_not_float32_or_not_a_module():
    _raises(ConfigError, "model parameter '0.weight' is torch.float64", "model.float()",
            fn=lambda: _compile(_model().double(), (X.double(),)))
    _raises(ConfigError, "model must be a torch.nn.Module, got function", "wrap the function",
            fn=lambda: _compile(lambda x: x + 1))
    _raises(ConfigError, "model must be a torch.nn.Module, got None", fn=lambda: qlower.compile(None, (X,)))


def test_example_inputs_must_be_a_tuple_not_a_bare_tensor():
    # a bare (1, 3, 8, 8) tensor used to compile an unbatched program of its rows
    _raises(ConfigError, "example_inputs must be a tuple", "bare tensor of shape (1, 3, 8, 8)", "pass (x,)",
            fn=lambda: _compile(example=X))
    _raises(InputError, "example_inputs[0] must be a torch.Tensor, got ndarray", "torch.from_numpy",
            fn=lambda: _compile(example=(X.numpy(),)))


@pytest.mark.parametrize("batch, fragments", [
    ((torch.zeros(1, 3, 9, 9),), ["calibration batch 1 input 0 is torch.float32[1, 3, 9, 9]",
                                  "the example input is torch.float32[1, 3, 8, 8]"]),
    ((X, X), ["calibration batch 1 has 2 input(s), the model takes 1"]),
    ((X.numpy(),), ["calibration batch 1 input 0 must be a torch.Tensor, got ndarray"]),
    ((torch.full((1, 3, 8, 8), float("nan")),), ["calibration batch 1 input 0 holds NaN: no quantization scale"]),
    ((X.double(),), ["calibration batch 1 input 0 is torch.float64"]),
    ("not a batch", ["calibration batch 1 must be a tuple of tensors, got str"]),
])
def test_calibration_batches_are_checked(batch, fragments):
    _raises(InputError, *fragments, fn=lambda: _compile(calibration=[(X,), batch]))


def test_calibration_must_be_a_list_of_batches():
    _raises(ConfigError, "calibration must be a list of input tuples", fn=lambda: _compile(calibration=X))


@pytest.mark.parametrize("quant", ["static", {}, 8])
def test_quant_must_be_a_quant_config(quant):
    _raises(ConfigError, "quant must be a QuantConfig or None", "QuantConfig(mode='static')",
            fn=lambda: _compile(quant=quant))


@pytest.mark.parametrize("kwargs, fragments", [
    ({"weight_qmin": 5}, ["weight range [weight_qmin, weight_qmax] = [5, 127]", "weight_qmin < 0 < weight_qmax"]),
    ({"act_qmin": "-128"}, ["QuantConfig.act_qmin must be an integer, got '-128'"]),
    ({"act_qmin": 10}, ["activation range [act_qmin, act_qmax] = [10, 127]", "contain 0"]),
    ({"per_channel": "yes"}, ["QuantConfig.per_channel must be True or False"]),
    ({"mode": "int4"}, ["QuantConfig.mode must be one of 'static', 'dynamic', got 'int4'"]),
    ({"fixed": {"output": (0.0, 0, -128, 127)}}, ["QuantConfig.fixed['output']", "scale must be a finite number > 0"]),
    ({"fixed": {"output": (0.1, 0)}}, ["QuantConfig.fixed['output'] must be (scale, zero_point, qmin, qmax)"]),
    ({"fixed": {"output": (0.1, 200, -128, 127)}}, ["qmin <= zero_point <= qmax", "zero_point=200"]),
    ({"fixed": [("output", (0.1, 0, -128, 127))]}, ["QuantConfig.fixed must be a dict"]),
])
def test_quant_config_fields_are_checked(kwargs, fragments):
    _raises(ConfigError, *fragments, fn=lambda: qlower.QuantConfig(**kwargs))
    assert issubclass(ConfigError, ValueError)   # code that caught the old ValueError still does


@pytest.mark.parametrize("threads", [0, -1, "4", 2.0, True, 4096])
def test_threads_are_checked_at_compile_not_at_run(threads):
    _raises(ConfigError, "threads", "expected None or" if not isinstance(threads, (str, float, bool)) else
            "must be None or a positive integer", fn=lambda: _compile(threads=threads))


def test_the_thread_limit_can_be_raised(monkeypatch):
    _raises(ConfigError, "threads=300: expected None or an integer in [1, 256]", "set QLOWER_MAX_THREADS",
            fn=lambda: _compile(threads=300, target="cpu"))
    monkeypatch.setenv("QLOWER_MAX_THREADS", "512")
    prog = _compile(threads=300, target="cpu")
    assert prog.meta["threads"] == 300


def test_a_saved_program_with_too_many_threads_is_refused_at_load_with_the_limit(tmp_path):
    prog = _compile(target="cpu")
    prog.meta["threads"] = 4000   # a file may say so: loading it checks the same bound as a run (issue 30)
    prog.save(tmp_path / "p.qlp")
    _raises(InvalidProgramError, "threads", "4000", "QLOWER_MAX_THREADS", fn=lambda: qlower.load(tmp_path / "p.qlp"))


def test_concurrent_runs_with_different_thread_counts_leave_torch_as_it_was():
    before = torch.get_num_threads()
    plans = [_compile(target="cpu", threads=n) for n in (1, 2)]
    expected = plans[0].run(X)[0]
    errors = []

    def work(p):
        for _ in range(30):
            if not np.array_equal(p.run(X)[0], expected):
                errors.append("wrong numbers")
    threads = [threading.Thread(target=work, args=(plans[i % 2],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and torch.get_num_threads() == before


@pytest.mark.parametrize("bad, fragments", [
    (X.bfloat16(), ["input 0 is a torch.bfloat16 tensor", "pass float32"]),
    (torch.empty(1, 3, 8, 8, device="meta"), ["input 0 is a tensor on device 'meta'"]),
    (X[0], ["input 0 (%", "has shape (3, 8, 8), expected (1, 3, 8, 8)"]),
])
def test_run_inputs_numpy_cant_hold_are_input_errors(bad, fragments):
    prog = _compile(target="cpu")
    _raises(InputError, *fragments, fn=lambda: prog.run(bad))


def test_targets_and_options():
    _raises(UnknownTargetError, "unknown target 'tosa'", "known targets:", fn=lambda: _compile(target="tosa"))
    assert issubclass(UnknownTargetError, ValueError)
    _raises(UnknownTargetError, "target must be a target name (str)", fn=lambda: _compile(target=None))
    _raises(ConfigError, "has no backend option 'turbo'", fn=lambda: _compile(target="ethos-u55-128",
                                                                              backend_options={"turbo": 1}))
    _raises(ConfigError, "backend_options must be a dict", fn=lambda: _compile(target="ethos-u55-128",
                                                                               backend_options=["turbo"]))


def test_a_u85_system_config_is_refused_for_a_u55():
    _raises(ConfigError, "system_config='Ethos_U85_SYS_DRAM_High' is not a system config of ethos-u55-128",
            "Ethos_U55_High_End_Embedded",
            fn=lambda: _compile(target="ethos-u55-128", backend_options={"system_config": "Ethos_U85_SYS_DRAM_High"}))
    prog = _compile(target="ethos-u55-128", backend_options={"system_config": "Ethos_U55_Deep_Embedded"})
    assert prog.partitions[0].payload.meta["system_config"] == "Ethos_U55_Deep_Embedded"


def test_requant_range_error_is_a_qlower_error():
    _raises(RequantRangeError, "scale ratio must be finite", fn=lambda: quantize_multiplier(float("nan")))
    assert issubclass(RequantRangeError, ValueError)


def test_vgf_on_vulkan_refuses_nan_like_every_other_target():
    """The emulation layer reads NaN as -inf: a silent wrong number; every target raises instead."""
    nan = X.clone()
    nan[0, 1, 2, 3] = float("nan")
    for target, options in (("reference", None), ("cpu", None), ("tosa-1.0+int", None),
                            ("vgf", {"execution": "vulkan"})):
        prog = _compile(target=target, backend_options=options)
        with pytest.raises(QlowerError, match="NaN"):
            prog.run(nan)
