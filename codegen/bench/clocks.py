"""The GPU's SM clock, power draw and clock-limiting reasons, sampled while a benchmark runs.

Near 50 TFLOP/s of fp32 FMAs an H100 SXM draws its whole 700 W power limit and lowers its SM
clock from 1980 MHz to 1905-1965 MHz (docs/perf-history.md, GEMM v26): a figure then depends on the
card's power and thermal state as well as on the kernel, so the benchmark reports the clock each
layer ran at next to its time.  Sampling goes through ``nvidia-smi`` (as ``nvidia-smi -lms``
does for a person watching), so that no extra package is needed; where it is missing, or cannot
name the device, nothing is sampled and the reports say so.
"""
from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass

FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu",
          "clocks_throttle_reasons.sw_power_cap", "clocks_throttle_reasons.sw_thermal_slowdown",
          "clocks_throttle_reasons.hw_slowdown")
"""nvidia-smi's query fields, in the order ``parse_line`` reads them.  The throttle-reason names are
the older spelling; drivers that renamed them "clocks_event_reasons" still accept it."""


@dataclass(frozen=True)
class Sample:
    """One reading; a field nvidia-smi reports as unavailable is None."""

    seconds: float
    sm_mhz: float | None
    max_sm_mhz: float | None
    power_w: float | None
    power_limit_w: float | None
    temperature_c: float | None
    power_capped: bool
    thermal_slowdown: bool


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_line(line: str, seconds: float) -> Sample | None:
    """A sample from one line of ``--format=csv,noheader,nounits`` output, or None for a line that
    is not one (a warning nvidia-smi prints among them)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(FIELDS):
        return None
    sm, max_sm, power, limit, temperature = (_number(p) for p in parts[:5])
    if sm is None:
        return None
    sw_power, sw_thermal, hw_slowdown = (p == "Active" for p in parts[5:])
    return Sample(seconds, sm, max_sm, power, limit, temperature, sw_power, sw_thermal or hw_slowdown)


def summarise(samples: list[Sample]) -> dict | None:
    """SM clock (min, median, max) and the share of samples with the power cap or a thermal or
    hardware slowdown active, or None without samples."""
    if not samples:
        return None
    clocks = [s.sm_mhz for s in samples]
    powers = [s.power_w for s in samples if s.power_w is not None]
    limits = [s.power_limit_w for s in samples if s.power_limit_w is not None]
    temperatures = [s.temperature_c for s in samples if s.temperature_c is not None]
    return {
        "samples": len(samples),
        "sm_mhz_min": min(clocks),
        "sm_mhz_median": statistics.median(clocks),
        "sm_mhz_max": max(clocks),
        "max_sm_mhz": next((s.max_sm_mhz for s in samples if s.max_sm_mhz is not None), None),
        "power_w_max": max(powers) if powers else None,
        "power_limit_w": limits[0] if limits else None,
        "temperature_c_max": max(temperatures) if temperatures else None,
        "power_capped_share": sum(s.power_capped for s in samples) / len(samples),
        "slowdown_share": sum(s.thermal_slowdown for s in samples) / len(samples),
    }


def describe(summary: dict | None) -> str:
    """One line for a person: the clock range and how often the power cap held it down."""
    if summary is None:
        return "SM clock not sampled (nvidia-smi unavailable)"
    text = (f"SM clock {summary['sm_mhz_min']:.0f}-{summary['sm_mhz_max']:.0f} MHz "
            f"(median {summary['sm_mhz_median']:.0f}")
    if summary["max_sm_mhz"]:
        text += f" of {summary['max_sm_mhz']:.0f}"
    text += f"), power cap active in {100 * summary['power_capped_share']:.0f} % of {summary['samples']} samples"
    if summary["power_w_max"] is not None and summary["power_limit_w"]:
        text += f" (up to {summary['power_w_max']:.0f} W of {summary['power_limit_w']:.0f} W)"
    if summary["slowdown_share"]:
        text += f", thermal or hardware slowdown in {100 * summary['slowdown_share']:.0f} %"
    return text


class ClockSampler:
    """Samples one GPU every ``interval_ms`` from ``__enter__`` to ``__exit__``; ``window(start, end)``
    summarises the samples taken between two ``time.monotonic()`` readings.

    ``device`` is the PCI bus id that nvidia-smi's ``--id`` takes (CUDA's ordinals can differ from
    nvidia-smi's indices under ``CUDA_VISIBLE_DEVICES``)."""

    def __init__(self, device: str, interval_ms: int = 100, command: str = "nvidia-smi"):
        self.device = device
        self.interval_ms = interval_ms
        self.command = command
        self.samples: list[Sample] = []
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self._process is not None

    def __enter__(self) -> ClockSampler:
        executable = shutil.which(self.command)
        if executable is None:
            return self
        self._process = subprocess.Popen(
            [executable, f"--id={self.device}", f"--query-gpu={','.join(FIELDS)}",
             "--format=csv,noheader,nounits", "-lms", str(self.interval_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._process.stdout:
            sample = parse_line(line, time.monotonic())
            if sample is not None:
                self.samples.append(sample)

    def __exit__(self, *exc) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=5)

    def window(self, start: float, end: float) -> dict | None:
        """None where nothing was sampled in the window (or at all: no nvidia-smi)."""
        return summarise([s for s in list(self.samples) if start <= s.seconds <= end])

    def overall(self) -> dict | None:
        return summarise(list(self.samples))


def sampler_for_current_device(interval_ms: int = 100) -> ClockSampler:
    """A sampler of the GPU CuPy runs on."""
    import cupy

    return ClockSampler(cupy.cuda.Device().pci_bus_id, interval_ms)


@contextlib.contextmanager
def clocked(results: list[dict], sampler):
    """Give the rows appended to ``results`` inside the block the SM clock sampled meanwhile."""
    first, started = len(results), time.monotonic()
    yield
    clock = sampler.window(started, time.monotonic())
    for row in results[first:]:
        row["clock"] = clock
