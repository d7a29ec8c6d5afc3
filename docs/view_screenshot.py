"""Makes docs/view_mobilenet_v2_ethos-u55-128.png, the README's picture of `qlower view`.

MobileNetV2 (the zoo's, 96x96) returning its five best scores: `topk` has no integer rule, so
it runs in float on the host after the NPU partition. Compiled for ethos-u55-128, verified,
saved, shown by `qlower view --report` and photographed by headless Chromium.

    .venv/bin/python docs/view_screenshot.py
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import qlower
from qlower import zoo
from qlower.testing.chromium import Chromium

OUT = Path(__file__).parent / "view_mobilenet_v2_ethos-u55-128.png"


class Top5(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return torch.topk(self.net(x), 5).values


def main() -> None:
    model, example, cfg, calibration = zoo.get("mobilenet_v2", size=96)
    prog = qlower.compile(Top5(model).eval(), example, target="ethos-u55-128", quant=cfg, calibration=calibration)
    print(prog.explain().splitlines()[0])
    report = qlower.verify_program(prog, [example])
    with tempfile.TemporaryDirectory() as folder:
        path, report_path = Path(folder) / "mobilenet_v2.qlp", Path(folder) / "report.json"
        prog.save(path)
        report_path.write_text(report.to_json())
        server = subprocess.Popen([sys.executable, "-m", "qlower.cli", "view", str(path), "--report", str(report_path),
                                   "--port", "8791", "--no-browser"], stdout=subprocess.PIPE, text=True)
        try:
            url = next(line.strip() for line in server.stdout if line.startswith("http://"))
            with Chromium(width=1600, height=1000) as browser:
                browser.open(url)
                browser.wait_for("document.body && document.body.innerText.includes('steps end to end')")
                # the partition stays one group (a click opens it); let the layout settle
                browser.evaluate("new Promise(r => setTimeout(r, 3000))")
                browser.screenshot(OUT)
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
