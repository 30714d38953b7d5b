"""Screenshot of the live drift in TensorBoard: a tiny `Trainer` run with `EmbvarCallback` and `report_to=["tensorboard"]`,
a local TensorBoard server on 127.0.0.1 over its logs, a headless Chromium screenshot of the drift scalars, the server
stopped. Writes reports/figures/tensorboard_drift.png (or --out).

    python benchmarks/tensorboard_screenshot.py [--out PNG] [--steps 40] [--keep DIR]
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["a good film", "a bad film", "great acting", "dull plot", "loved it", "hated it", "fine work", "poor script"] * 2
LABELS = [1, 0, 1, 0, 1, 0, 1, 0] * 2


def tiny_run(work: Path, steps: int) -> Path:
    "Train tiny-distilbert for `steps` steps with the callback; returns TensorBoard's log folder."
    os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(work / "tb")
    import datasets, transformers
    from embvar_study.models import load_model_and_tokenizer
    from embvar_study.tracking import EmbvarCallback
    model, tok = load_model_and_tokenizer("tiny-distilbert", num_labels=2, init_seed=0)
    ds = datasets.Dataset.from_dict({**tok(TEXTS, padding="max_length", max_length=12, truncation=True), "labels": LABELS})
    args = transformers.TrainingArguments(output_dir=str(work / "trainer"), per_device_train_batch_size=4, max_steps=steps,
                                          learning_rate=2e-3, logging_steps=2, save_strategy="no", report_to=["tensorboard"],
                                          seed=0, use_cpu=True, disable_tqdm=True)
    cb = EmbvarCallback("builtin", work / "run", every=2)
    transformers.Trainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=[cb]).train()
    return work / "tb"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def wait_http(url: str, timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200: return
        except OSError: time.sleep(0.5)
    raise SystemExit(f"TensorBoard did not answer at {url} within {timeout:g}s")


def screenshot(url: str, out: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None: raise SystemExit("chromium: not found (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        f"--user-data-dir={profile}", "--window-size=1280,900", "--virtual-time-budget=15000",
                        "--hide-scrollbars", f"--screenshot={out}", url], check=True, capture_output=True, timeout=180)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "figures" / "tensorboard_drift.png")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--keep", type=Path, default=None, help="write the run and logs here instead of a temporary folder")
    a = p.parse_args(argv)
    if a.steps < 2: p.error(f"--steps: expected an int >= 2, got {a.steps}")
    work = Path(a.keep or tempfile.mkdtemp(prefix="embvar_tb_"))
    logdir = tiny_run(work, a.steps)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                               "--port", str(port), "--reload_interval", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/data/logdir")
        a.out.parent.mkdir(parents=True, exist_ok=True)
        screenshot(base + "/?darkMode=false#scalars&tagFilter=embvar%2Fdrift%24%7Cdrift_velocity&_smoothingWeight=0", a.out)
    finally:
        server.terminate()
        try: server.wait(timeout=20)
        except subprocess.TimeoutExpired: server.kill(); server.wait()
    if a.keep is None: shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {a.out} ({a.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
