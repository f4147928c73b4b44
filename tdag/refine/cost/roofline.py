"""A roofline model: how long a cost report's work takes on a device, and what bounds it.

A node (one kernel of the lowered program) takes ``launch + max(flops / peak[dtype], bytes /
bandwidth)``; a row (a layer, an op) is its nodes run one after another, so the rows add up
to the total. A row is *compute*-bound when its flops take longer than its bytes at these
peaks, *memory*-bound otherwise, and *overhead*-bound where the fixed cost of issuing its
kernels outweighs both (small models on a CPU: torch's eager dispatch costs microseconds per
op). Peaks are dense (no structured sparsity) datasheet figures and presets carry no launch
cost (datasheets give none); ``local`` measures all three here. Real kernels reach a fraction
of the peaks, so an estimate is a lower bound of the latency.

>>> h100 = DEVICES["h100-sxm"]
>>> h100.peak("bf16") / 1e12, h100.bandwidth / 1e12
(989.4, 3.35)
>>> custom(peak_tflops=10, bandwidth_gbs=100).ridge("f32")  # flops per byte at the ridge
100.0
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch

from tdag.errors import TdagError

T, G = 1e12, 1e9


@dataclass(frozen=True)
class Device:
    """Peak flops per dtype (flops/s), memory bandwidth (bytes/s) and where they come from."""

    name: str
    peak_flops: dict = field(hash=False)  # dtype name ("f32", "bf16", ...) -> flops/s
    bandwidth: float                      # bytes/s
    source: str                           # the datasheet (or measurement) the figures are from
    launch: float = 0.0                   # seconds to issue one kernel, whatever its size

    def peak(self, dtype: str) -> float:
        """The peak for ``dtype``; a dtype the datasheet does not list runs at the f32 peak
        (integer index arithmetic, bools), or the lowest listed where f32 is not."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        family = _FAMILY.get(dtype)  # datasheets give one rate for the float8 kinds, u8 as i8
        if family in self.peak_flops:
            return self.peak_flops[family]
        return self.peak_flops.get("f32", min(self.peak_flops.values()))

    def ridge(self, dtype: str = "f32") -> float:
        """The intensity (flops/byte) above which work is compute-bound."""
        return self.peak(dtype) / self.bandwidth

    def to_dict(self) -> dict:
        return {"name": self.name, "peak_flops": dict(self.peak_flops),
                "bandwidth": self.bandwidth, "launch": self.launch, "source": self.source}


_FAMILY = {"f8e4m3fn": "f8", "f8e4m3fnuz": "f8", "f8e5m2": "f8", "f8e5m2fnuz": "f8",
           "u8": "i8"}


def _half(tflops: float, **more) -> dict:
    """f16 and bf16 at the same tensor-core rate, plus the others given (in TFLOPS)."""
    return {"f16": tflops * T, "bf16": tflops * T, **{k: v * T for k, v in more.items()}}


# Dense peaks from each vendor's datasheet (tensor-core rates for f16/bf16/i8; f32 is the
# non-tensor vector rate, tf32 listed apart). CPU peaks: cores x base clock x flops per cycle.
DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("h100-sxm", {"f32": 67 * T, "tf32": 494.7 * T, **_half(989.4, f8=1978.9, i8=1978.9)},
           3.35e12, "NVIDIA H100 Tensor Core GPU datasheet (SXM5): FP32 67 TF, BF16 989.4 TF "
           "dense, HBM3 3.35 TB/s"),
    Device("a100-80gb-sxm", {"f32": 19.5 * T, "tf32": 156 * T, **_half(312, i8=624)},
           2.039e12, "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): FP32 19.5 TF, BF16 "
           "312 TF dense, HBM2e 2,039 GB/s"),
    Device("l4", {"f32": 30.3 * T, "tf32": 60 * T, **_half(121, f8=242.5, i8=242.5)},
           300e9, "NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3 TF, BF16 121 TF dense, "
           "GDDR6 300 GB/s"),
    Device("rtx-4090", {"f32": 82.6 * T, "tf32": 82.6 * T, **_half(165.2, i8=660.6)},
           1008e9, "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: FP32 "
           "82.6 TF, FP16/BF16 tensor (FP32 accumulate) 165.2 TF, GDDR6X 1,008 GB/s"),
    Device("apple-m2", {"f32": 3.6 * T, "f16": 3.6 * T}, 100e9,
           "Apple M2 press release (June 2022): GPU up to 3.6 TFLOPS, 100 GB/s unified memory"),
    Device("epyc-9654", {"f32": 96 * 2.4 * G * 32, "bf16": 96 * 2.4 * G * 64}, 460.8e9,
           "AMD EPYC 9654 product page: 96 cores, 2.4 GHz base, 12 x DDR5-4800 (460.8 GB/s); "
           "Zen 4: 2 x 256-bit FMA = 32 FP32 flops/cycle/core (AVX512-BF16: 64)"),
    Device("xeon-8480+", {"f32": 56 * 2.0 * G * 64, "bf16": 56 * 2.0 * G * 1024,
                          "i8": 56 * 2.0 * G * 2048}, 307.2e9,
           "Intel Xeon Platinum 8480+ (ark.intel.com): 56 cores, 2.0 GHz base, 8 x DDR5-4800 "
           "(307.2 GB/s); 2 AVX-512 FMA = 64 FP32 flops/cycle/core, AMX 1024 BF16 / 2048 INT8"),
    Device("mi300x", {"f32": 163.4 * T, **_half(1307.4, f8=2614.9, i8=2614.9)}, 5.3e12,
           "AMD Instinct MI300X datasheet: FP32 matrix 163.4 TF, FP16/BF16 1,307.4 TF dense, "
           "HBM3 5.3 TB/s"),
    Device("tpu-v5e", {"bf16": 197 * T, "i8": 394 * T}, 819e9,
           "Google Cloud TPU v5e documentation: 197 TF BF16, 394 TOPS INT8, HBM2 819 GB/s"),
)}


def custom(peak_tflops: float, bandwidth_gbs: float, name: str = "custom",
           launch_us: float = 0.0) -> Device:
    """A device with one peak for every dtype (and a launch cost per kernel, if given)."""
    if peak_tflops <= 0 or bandwidth_gbs <= 0 or launch_us < 0:
        raise TdagError(f"a device needs a positive peak and bandwidth and a launch cost of 0 "
                        f"or more, got {peak_tflops} TFLOPS, {bandwidth_gbs} GB/s, "
                        f"{launch_us} us")
    return Device(name, {"f32": peak_tflops * T}, bandwidth_gbs * G,
                  f"given: {peak_tflops:g} TFLOPS, {bandwidth_gbs:g} GB/s, "
                  f"{launch_us:g} us per kernel", launch_us * 1e-6)


def device(name: str) -> Device:
    """A preset by name, ``local`` (measured here, a few seconds) or ``local:quick`` (a
    rough measurement in well under a second, for tests)."""
    if name in ("local", "local:quick"):
        return measure_local(quick=name == "local:quick", threads=torch.get_num_threads())
    if name not in DEVICES:
        raise TdagError(f"unknown device {name!r}: choose local or one of {', '.join(DEVICES)}")
    return DEVICES[name]


@functools.lru_cache(maxsize=None)  # one measurement per process and thread count
def measure_local(quick: bool = False, threads: int = 1) -> Device:
    """This machine's fp32 matmul throughput (the best of a few square sizes), copy
    bandwidth (a tensor far larger than the caches copied: read + write) and the time torch
    takes to issue one small op (eager dispatch), on torch's current thread count."""
    sizes, copy_mb, repeats = ((128, 256), 16, 2) if quick else ((256, 512, 1024, 2048), 256, 3)
    peak = max(_matmul_rate(n, repeats) for n in sizes)
    bandwidth = _copy_rate(copy_mb * 2**20 // 4, repeats)
    launch = _launch_time(200 if quick else 2000)
    return Device("local" if not quick else "local:quick", {"f32": peak}, bandwidth,
                  f"measured: torch.matmul fp32 {peak / G:.1f} GFLOP/s, copy "
                  f"{bandwidth / G:.1f} GB/s, {launch * 1e6:.1f} us per op ({threads} "
                  f"thread(s))", launch)


def _matmul_rate(n: int, repeats: int) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)  # warm up
    best = min(_timed(lambda: torch.matmul(a, b)) for _ in range(repeats))
    return 2 * n ** 3 / best


def _copy_rate(elements: int, repeats: int) -> float:
    """Read + write bytes per second of a copy into a tensor allocated beforehand (a fresh
    clone's first touch of its pages would be timed too, at a fraction of the bandwidth)."""
    x, out = torch.ones(elements), torch.empty(elements)
    out.copy_(x)
    best = min(_timed(lambda: out.copy_(x)) for _ in range(repeats))
    return 2 * x.nbytes / best


def _launch_time(count: int) -> float:
    """Seconds per call of a one-element add (its output allocated, as an eager op's is):
    what an op costs beyond its flops and bytes (the median of five runs of ``count``)."""
    a, b = torch.ones(1), torch.ones(1)

    def ops():
        for _ in range(count):
            torch.add(a, b)
    ops()
    runs = sorted(_timed(ops) for _ in range(5))
    return runs[2] / count


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return max(time.perf_counter() - start, 1e-9)


def estimate(figures, parts, dev: Device) -> tuple:
    """(seconds, "compute" | "memory" | "overhead") of a row: each of ``parts`` (a node's
    Figures and its dtype) at its roofline plus the device's launch cost, one after another
    (a view, which does no work, launches nothing); without parts, the row's figures as one
    kernel at the f32 peak. (None, None) while a figure is symbolic."""
    parts = parts if parts is not None else [(figures, "f32")]
    compute = memory = launches = total = 0.0
    for fig, dtype in parts:
        flops, moved = _number(fig.flops), _number(fig.bytes)
        if flops is None or moved is None:
            return None, None
        c, m = flops / dev.peak(dtype), moved / dev.bandwidth
        launch = dev.launch if flops or moved else 0.0
        compute, memory, launches = compute + c, memory + m, launches + launch
        total += launch + max(c, m)
    if total == 0:
        return 0.0, None
    if launches > max(compute, memory):
        return total, "overhead"
    return total, "compute" if compute >= memory else "memory"


def _number(value) -> float | None:
    try:
        return float(value)
    except TypeError:
        return None


def format_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def plot(data: dict, dev: Device, path: str, dtype: str = "f32") -> None:
    """Draw ``data``'s rows (``report.to_dict(device=...)``) on ``dev``'s roofline: x the
    intensity, y the flops per second each row attains at its estimated time."""
    try:
        import matplotlib  # noqa: PLC0415  (the optional extra "plot": only --plot draws)
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise TdagError("--plot needs matplotlib: pip install 'tdag[plot]'") from None
    points = [(r["intensity"], r["flops"] / r["time_s"], r["name"].strip()) for r in data["rows"]
              if isinstance(r["intensity"], float) and r["intensity"] > 0 and r["time_s"]]
    lo = min([p[0] for p in points] + [dev.ridge(dtype) / 100]) / 2
    hi = max([p[0] for p in points] + [dev.ridge(dtype) * 10]) * 2
    fig, ax = plt.subplots(figsize=(8, 5))
    xs = [lo * (hi / lo) ** (i / 99) for i in range(100)]
    ax.plot(xs, [min(dev.peak(dtype), dev.bandwidth * x) for x in xs], color="black",
            label=f"{dev.name} roofline ({dtype})")
    for x, y, name in points:
        ax.scatter([x], [y], s=12)
        ax.annotate(name, (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="flops per byte", ylabel="flops per second",
           title=f"roofline: {dev.name}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["DEVICES", "Device", "custom", "device", "estimate", "format_time",
           "measure_local", "plot"]
