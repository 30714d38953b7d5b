"""The GPU check runs end to end on the CPU with tiny settings, and writes the JSON the README's table is made from."""
import json, os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_tiny_on_cpu(tmp_path):
    out = tmp_path / "gc.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--scaling", "1,2", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    run = res["one_run"]
    assert run["steps"] == 4 and run["step_s"] > 0 and run["tokens_per_s"] > 0 and run["params"] > 0
    assert [s["runs_at_once"] for s in res["scaling"]] == [1, 2] and all(s["wall_s"] > 0 for s in res["scaling"])
    assert {m["metric"] for m in res["metrics"]} == {"drift_curve (T, N, d)", "linear_cka (K pairs)", "procrustes_align_batch (K pairs)"}
    assert "gpu_check: done" in r.stdout


def test_bench_step_reports_padding_flops_and_ratios():
    "bench_step prints the padding share, FLOPs padded vs real tokens, and a speed-up against the padded baseline of the same run."
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_step.py"), "--profile", "smoke", "--repeats", "1"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "padding share" in out and "real tokens only" in out and "fastest fp32 matmul measured here" in out
    rows = [l for l in out.splitlines() if l.startswith(("before:", "after:"))]
    assert rows[0].split()[-3] == "1.00x" and len(rows) >= 3, out
    assert any("bf16 autocast" in l for l in rows), out            # the bf16 step, timed in the same run
    h = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_step.py"), "--help"], capture_output=True, text=True)
    assert h.returncode == 0 and "--repeats" in h.stdout
