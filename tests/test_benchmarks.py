"""The benchmarks run end to end with tiny settings on the CPU: the GPU check (its one table has every row) and the tracker's memory benchmark (its table, equal values)."""
import json, os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_tiny_on_cpu(tmp_path):
    "gpu_check --tiny on the CPU: one table with every row (paper step with and without tracking, compare, metrics, tracking memory, scaling)."
    out = tmp_path / "gc.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--scaling", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("gpu_check on ") and "no GPU: CPU only" in lines[0] and lines[-1].startswith("gpu_check: done")
    assert lines[1].split() == ["section", "what", "value"]
    rows = [l for l in lines[2:-1]]
    sections = [l.split("  ")[0] for l in rows]
    assert sorted(set(sections)) == ["compare", "metrics", "paper step", "scaling", "tracking memory"]
    want = ["model", "batch", "step time, no tracking", "step time, tracking every 2", "tracking overhead",
            "one tracked step (probe forward + save)", "peak GPU memory, no tracking", "peak GPU memory, tracking", "tokens/s, MFU"]
    paper = [l for l in rows if l.startswith("paper step")]
    assert [l[len("paper step"):].strip().split("  ")[0] for l in paper] == want
    assert sum(s == "metrics" for s in sections) == 3 and sum(s == "compare" for s in sections) == 2
    assert sum(s == "tracking memory" for s in sections) == 2 and sum(s == "scaling" for s in sections) == 1
    res = json.loads(out.read_text())
    p = res["paper_step"]
    assert p["plain"]["steps"] == p["tracked"]["steps"] == 4 and p["tracked"]["tracked"] == 3 and p["step_s_plain"] > 0
    assert abs(p["overhead"] - (p["step_s_tracked"] / p["step_s_plain"] - 1)) < 1e-12
    assert res["compare"]["max_abs_diff"] <= 1e-12                      # torch inputs give compare's numpy values
    assert [(m["depth"], m["layers"], m["probes"]) for m in res["tracking_memory"]["rows"]] == [(2, 1, 8), (2, "all (3)", 8)]
    assert all(m["max_abs_diff"] <= 1e-6 and m["peak_mb_old"] > 0 and m["peak_mb_new"] > 0 for m in res["tracking_memory"]["rows"])


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


def test_bench_tracking_memory_tiny_prints_the_table_and_equal_values(tmp_path):
    "bench_tracking_memory --tiny: one row per (depth, layers asked, probes), both paths measured, the pooled values equal."
    out = tmp_path / "mem.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_tracking_memory.py"), "--tiny", "--json", str(out)],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    head = next(i for i, l in enumerate(lines) if l.split()[:1] == ["depth"])
    assert lines[head].split() == ["depth", "layers", "asked", "probes", "peak", "MB", "old", "peak", "MB", "new", "ratio", "max", "|diff|"]
    rows = [l.split() for l in lines[head + 1:head + 5]]
    assert [(int(r[0]), r[1], int(r[-5])) for r in rows] == [(4, "1", 8), (4, "all", 8), (2, "1", 8), (2, "all", 8)], r.stdout
    for row in rows:
        old, new, ratio, diff = float(row[-4]), float(row[-3]), row[-2], float(row[-1])
        assert old > 0 and new > 0 and ratio.endswith("x") and diff <= 1e-6
    res = json.loads(out.read_text())                       # the same rows, unrounded
    assert len(res) == 4 and all(x["max_abs_diff"] <= 1e-6 and x["peak_mb_old"] > 0 and x["peak_mb_new"] > 0 for x in res)
    assert "largest |difference| of any pooled value between the paths" in r.stdout
