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


def test_demo_checks_itself():
    result = run("demo", "--steps", "10", "--spec-rounds", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "10 decode steps" in result.stdout and "demo: OK" in result.stdout
