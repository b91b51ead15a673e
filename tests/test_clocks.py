"""The clock sampler (codegen/bench/clocks.py) without a GPU: parsing nvidia-smi's lines, windows of
samples, and the subprocess path end to end through a stand-in nvidia-smi."""
import os
import stat
import time

import pytest

from codegen.bench import clocks

CAPPED = "1905, 1980, 699.37, 700.00, 73, Active, Not Active, Not Active"
FREE = "1980, 1980, 142.12, 700.00, 59, Not Active, Not Active, Not Active"


def test_lines_parse_into_samples_and_other_lines_are_skipped():
    sample = clocks.parse_line(CAPPED, 1.0)
    assert (sample.sm_mhz, sample.max_sm_mhz, sample.power_w, sample.power_limit_w) == (1905, 1980, 699.37, 700)
    assert sample.power_capped and not sample.thermal_slowdown
    assert clocks.parse_line("1980, 1980, [N/A], [N/A], 59, Not Active, Active, Not Active", 1.0).power_w is None
    assert clocks.parse_line("1980, 1980, [N/A], [N/A], 59, Not Active, Active, Not Active", 1.0).thermal_slowdown
    assert clocks.parse_line("Failed to initialize NVML: Unknown Error", 1.0) is None
    assert clocks.parse_line("[N/A], 1980, 1, 1, 1, Active, Active, Active", 1.0) is None


def test_a_window_summarises_only_its_own_samples():
    sampler = clocks.ClockSampler("00000000:00:00.0")
    sampler.samples = [clocks.parse_line(FREE, 0.5), clocks.parse_line(CAPPED, 1.5),
                       clocks.parse_line(CAPPED.replace("1905", "1950"), 2.5), clocks.parse_line(FREE, 3.5)]
    window = sampler.window(1.0, 3.0)
    assert (window["samples"], window["sm_mhz_min"], window["sm_mhz_max"]) == (2, 1905, 1950)
    assert window["power_capped_share"] == 1.0 and window["power_w_max"] == 699.37
    overall = sampler.overall()
    assert overall["power_capped_share"] == 0.5 and overall["sm_mhz_median"] == pytest.approx(1965)
    assert sampler.window(10.0, 11.0) is None
    text = clocks.describe(overall)
    assert "1905-1980 MHz" in text and "power cap active in 50 % of 4 samples" in text and "700 W" in text
    assert "not sampled" in clocks.describe(None)


def test_sampler_reads_a_running_nvidia_smi_and_stops_it(tmp_path, monkeypatch):
    """A stand-in nvidia-smi that checks its arguments and prints a reading every 20 ms."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--id=0000:41:00.0*--format=csv,noheader,nounits*-lms\\ 20*) ;; *) echo "bad args: $*"; exit 3;; esac\n'
        f'while true; do echo "{CAPPED}"; sleep 0.02; done\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with clocks.ClockSampler("0000:41:00.0", interval_ms=20) as sampler:
        assert sampler.active
        deadline = time.monotonic() + 5
        while len(sampler.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert sampler._process.poll() is not None
    summary = sampler.overall()
    assert summary["samples"] >= 3 and summary["sm_mhz_median"] == 1905 and summary["power_capped_share"] == 1.0


def test_without_nvidia_smi_nothing_is_sampled(monkeypatch):
    monkeypatch.setattr(clocks.shutil, "which", lambda name: None)
    with clocks.ClockSampler("0000:41:00.0") as sampler:
        assert not sampler.active
    assert sampler.overall() is None


def test_rows_measured_inside_a_clocked_block_get_its_window():
    sampler = clocks.ClockSampler("0000:41:00.0")
    sampler._process = object()   # active, without a subprocess: samples are planted below
    results = [{"layer": "before"}]
    with clocks.clocked(results, sampler):
        sampler.samples.append(clocks.parse_line(CAPPED, time.monotonic()))
        results.append({"layer": "inside"})
    assert "clock" not in results[0]
    assert results[1]["clock"]["sm_mhz_median"] == 1905 and results[1]["clock"]["power_capped_share"] == 1.0
    idle = clocks.ClockSampler("0000:41:00.0")
    with clocks.clocked(results, idle):
        results.append({"layer": "unsampled"})
    assert results[2]["clock"] is None
