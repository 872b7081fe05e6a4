"""`python -m replayssm_cuda info` and `demo` run and report what they did."""

import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "replayssm_cuda", *args], capture_output=True, text=True, timeout=600)


def test_info_reports_build_and_ops():
    result = run("info")
    assert result.returncode == 0, result.stderr
    assert "replayssm_cuda 0.1.0" in result.stdout
    assert "compiled ops (" in result.stdout and "mamba2_step" in result.stdout


def test_demo_checks_itself(tmp_path):
    png = tmp_path / "demo.png"
    result = run("demo", "--steps", "10", "--spec-rounds", "3", "--png", str(png))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "10 decode steps" in result.stdout and "demo: OK" in result.stdout
    # It says which path every op ran and prints its table; the PNG needs matplotlib.
    assert "mamba2_step: " in result.stdout and "gdn_step: " in result.stdout
    assert "decode tokens/s" in result.stdout and "memory per slot, Mamba-2 layer" in result.stdout
    assert png.exists() or "matplotlib is not installed" in result.stdout
