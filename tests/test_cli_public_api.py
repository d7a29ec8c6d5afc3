"""What the command line needs beyond compile/verify is public API (issue 26): the LiteRT kernels an
exported .tflite is exact under, and saving a run's outputs at exactly the path given."""

from __future__ import annotations

import numpy as np

import qlower
from qlower.cli import main


def test_save_arrays_writes_npy_or_npz_at_exactly_the_path(tmp_path):
    a, b = np.arange(6, dtype=np.int8).reshape(2, 3), np.ones(4, np.float32)
    assert qlower.save_arrays(str(tmp_path / "one"), [a]) == ".npy"
    np.testing.assert_array_equal(np.load(tmp_path / "one"), a)
    assert qlower.save_arrays(str(tmp_path / "two"), [a, b]) == ".npz"
    with np.load(tmp_path / "two") as both:
        np.testing.assert_array_equal(both["arr_0"], a)
        np.testing.assert_array_equal(both["arr_1"], b)


def test_tflite_export_says_which_kernels_it_is_exact_under(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    code = main(["compile", "zoo:tiny_cnn", "--size", "16", "--target", "litert", "--format", "tflite",
                 "-o", str(path)])
    out = capsys.readouterr().out
    assert code == 0 and path.exists()
    assert "bit-exact with the reference interpreter under LiteRT's reference" in out
    prog = qlower.compile(*qlower.zoo.get("tiny_cnn", size=16)[:2], target="litert", progress=False)
    assert "reference" in qlower.tflite_exact_kernels(prog)
