"""The devices a run simulates: named profiles from vendors' datasheets, a roofline that prices a
counted step on one, and the hardware of a run's nodes or clients (docs/devices.md).

**A step on a device.** :func:`exogym.sim.flops.count_step` lists the kernels of one node's step
(FLOPs, bytes, dtype); a device profile prices each kernel on its roofline and adds them up,
as an eager step runs them one after another::

    t_kernel = max(F / (P_kind,dtype * eta_c),  B / (W * eta_m),  lambda)

``P``: the device's peak dense FLOP/s for the kernel's kind and dtype (a matrix product at the
tensor rate in bf16/fp16; in fp32 at the plain fp32 rate, PyTorch's default matmul precision,
and a convolution at TF32 where the device has it, cuDNN's default; elementwise work at the
fp32/fp16 vector rate); ``W``: its memory bandwidth; ``eta_c`` and ``eta_m``: the fractions of
peak a large kernel reaches (0.7 and 0.8 by default, argued in docs/devices.md); ``lambda``: the
least a kernel costs, its launch and dispatch (a step of small kernels, the everyday case of a
small model at a small batch, is bound by it). The model's known limits: no fusion (a compiled
model moves fewer bytes), no overlap between kernels, the same ``eta`` for every shape, no host
work (data loading), and the optimizer counted in its ``foreach`` form.

**Hardware** (:func:`parse_hardware`): one profile for every node (``rtx4090``), one per node
(``h100:h100:rtx4090:m2``), a mix drawn per client (``phone-low=0.5,phone-mid=0.3,
phone-high=0.2``: client ``c``'s device from a hash of ``(seed, c)``, O(1) per client), a
custom device (``flops=80T,mem_bw=1TB/s``) or a file in FedScale's form (client id ->
``computation``, ms per sample, and ``communication``, kbit/s), which also gives each client its
link. A run's clock takes the first device named as its reference (``step_time_s``) and every
other node's or client's as a relative speed.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from exogym.sim.flops import Kernel, StepCount
from exogym.sim.network import parse_duration, parse_rate

__all__ = [
    "DEFAULT_HARDWARE",
    "PROFILES",
    "DeviceProfile",
    "Hardware",
    "device_profile",
    "format_flops",
    "load_profiles",
    "parse_flops",
    "parse_hardware",
    "parse_profile",
]

#: The device a run simulates unless told otherwise (docs/devices.md says why).
DEFAULT_HARDWARE = "rtx4090"

#: The dtypes a profile gives peaks for.
DTYPES = ("fp32", "tf32", "bf16", "fp16")
ETA_C = 0.7
ETA_M = 0.8


@dataclass(frozen=True)
class DeviceProfile:
    """One device as the clock prices it (module docstring).

    Attributes:
        name: what ``--hardware`` calls it (``rtx4090``).
        title: the product (``NVIDIA GeForce RTX 4090``).
        kind: ``datacenter-gpu``, ``consumer-gpu``, ``mac``, ``phone`` or ``custom``.
        peak_flops: peak dense FLOP/s by dtype: ``fp32`` (the vector rate, also fp32 matrix
            products), ``tf32`` (matrix), ``bf16`` and ``fp16`` (matrix, fp32 accumulate);
            a dtype it lacks runs at the fp32 rate.
        mem_bw: memory bandwidth, bytes/s.
        memory: memory, bytes (None: not stated).
        overhead_s: ``lambda``, the least one kernel costs.
        eta_c: the fraction of a peak FLOP/s a large kernel reaches.
        eta_m: the fraction of the memory bandwidth a large kernel reaches.
        source: where the figures come from.
    """

    name: str
    title: str
    kind: str
    peak_flops: Mapping[str, float]
    mem_bw: float
    memory: float | None
    overhead_s: float
    source: str
    eta_c: float = ETA_C
    eta_m: float = ETA_M

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a device's name must be a non-empty string, got {self.name!r}")
        where = f"device {self.name!r}"
        if not isinstance(self.peak_flops, Mapping) or "fp32" not in self.peak_flops:
            raise ValueError(f"{where}: peak_flops must map dtypes ({', '.join(DTYPES)}) to "
                             f"FLOP/s, with an 'fp32' rate, got {self.peak_flops!r}")
        for key, value in self.peak_flops.items():
            if key not in DTYPES:
                raise ValueError(f"{where}: unknown dtype {key!r} in peak_flops; "
                                 f"allowed: {', '.join(DTYPES)}")
            _figure(f"{where}: peak_flops[{key!r}]", value, *_FLOPS)
        _figure(f"{where}: mem_bw", self.mem_bw, *_MEM_BW)
        _figure(f"{where}: overhead_s", self.overhead_s, *_OVERHEAD_S)
        for key in ("eta_c", "eta_m"):
            _figure(f"{where}: {key}", getattr(self, key), *_ETA)
        if self.memory is not None:
            _figure(f"{where}: memory", self.memory, *_MEMORY)

    def peak(self, kind: str, dtype: str) -> float:
        """The peak FLOP/s a kernel of ``kind`` in ``dtype`` runs at."""
        rates = self.peak_flops
        if kind == "ew":
            return rates["fp32"] if dtype != "fp16" else max(rates["fp32"],
                                                             rates.get("fp16", 0.0))
        if dtype == "fp32":
            return rates.get("tf32", rates["fp32"]) if kind == "conv" else rates["fp32"]
        return rates.get(dtype, rates["fp32"])

    def _roofline(self, kernel: Kernel) -> tuple[float, float]:
        """``(compute, memory)`` seconds of one kernel on this device."""
        return (kernel.flops / (self.peak(kernel.kind, kernel.dtype) * self.eta_c),
                kernel.bytes / (self.mem_bw * self.eta_m))

    def kernel_time(self, kernel: Kernel) -> float:
        """One kernel's seconds on this device (module docstring)."""
        return max(*self._roofline(kernel), self.overhead_s)

    def step_time(self, count: StepCount) -> float:
        """Seconds of the counted step on this device: its kernels' times added up."""
        return math.fsum(self.kernel_time(k) * n for k, n in count.profile)

    def bound(self, count: StepCount) -> dict[str, float]:
        """The step's seconds by what bounds each kernel: ``compute``, ``memory``,
        ``overhead``."""
        out = {"compute": 0.0, "memory": 0.0, "overhead": 0.0}
        for k, n in count.profile:
            compute, memory = self._roofline(k)
            t = max(compute, memory, self.overhead_s)
            which = ("overhead" if t == self.overhead_s and t > max(compute, memory)
                     else "compute" if compute >= memory else "memory")
            out[which] += t * n
        return out

    def figures(self) -> dict[str, Any]:
        """The figures that price a step on this device (a run's ``config.json`` records them:
        a resumed run's must be the same)."""
        return {"peak_flops": dict(self.peak_flops), "mem_bw": self.mem_bw,
                "overhead_s": self.overhead_s, "eta_c": self.eta_c, "eta_m": self.eta_m}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "kind": self.kind,
                "peak_flops": dict(self.peak_flops), "mem_bw": self.mem_bw,
                "memory": self.memory, "overhead_s": self.overhead_s, "eta_c": self.eta_c,
                "eta_m": self.eta_m, "source": self.source}

    @classmethod
    def from_dict(cls, data: Any) -> DeviceProfile:
        """A profile from its JSON form (:func:`load_profiles`): every figure a number or a
        string with a unit (``"20T"``, ``"900GB/s"``, ``"6us"``); a bad one is an error naming
        the field, the value and what is allowed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a device profile must be an object with {_PROFILE_KEYS}, got "
                             f"{data!r}")
        unknown = set(data) - set(_FIELDS)
        if unknown:
            raise ValueError(f"unknown device profile keys {sorted(map(str, unknown))}; "
                             f"allowed: {', '.join(sorted(_FIELDS))}")
        for key in ("name", "peak_flops", "mem_bw"):
            if key not in data:
                raise ValueError(f"a device profile needs {key!r}, got keys {sorted(data)}")
        name = data["name"]
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a device profile's name must be a non-empty string, got "
                             f"{name!r}")
        where = f"device {name!r}"
        for key in ("title", "kind", "source"):
            if not isinstance(data.get(key, ""), str):
                raise ValueError(f"{where}: {key} must be a string, got {data[key]!r}")
        peaks = data["peak_flops"]
        if not isinstance(peaks, Mapping) or not peaks:
            raise ValueError(f"{where}: peak_flops must be an object of FLOP/s by dtype "
                             f"({', '.join(DTYPES)}; 'fp32' needed), e.g. {{\"fp32\": \"20T\", "
                             f"\"bf16\": \"80T\"}}, got {peaks!r}")
        memory = data.get("memory")
        return cls(name=name, title=data.get("title", name), kind=data.get("kind", "custom"),
                   peak_flops={str(k): parse_flops(v, f"{where}: peak_flops[{k!r}]")
                               for k, v in peaks.items()},
                   mem_bw=_figure(f"{where}: mem_bw", data["mem_bw"], *_MEM_BW),
                   memory=None if memory is None else _figure(f"{where}: memory", memory,
                                                              *_MEMORY),
                   overhead_s=_figure(f"{where}: overhead_s",
                                      data.get("overhead_s", _OVERHEAD["custom"]), *_OVERHEAD_S),
                   source=data.get("source", "given by the user"),
                   eta_c=_figure(f"{where}: eta_c", data.get("eta_c", ETA_C), *_ETA),
                   eta_m=_figure(f"{where}: eta_m", data.get("eta_m", ETA_M), *_ETA))


_FIELDS = ("name", "title", "kind", "peak_flops", "mem_bw", "memory", "overhead_s", "eta_c",
           "eta_m", "source")
_PROFILE_KEYS = ("name, peak_flops, mem_bw (and optionally title, kind, memory, overhead_s, "
                 "eta_c, eta_m, source)")


# -- figures ------------------------------------------------------------------------------------
# The range of each figure a device may give: finite bounds, so that a step's price stays a
# finite number of seconds however large the model (a step of 1e20 FLOPs at the least FLOP/s
# and eta costs 1e16 s; an hour's overhead times a million kernels, 3.6e9 s). Each is (least,
# most, what an error says is allowed, how a string is read).
_FLOPS_UNIT = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_FLOPS_TEXT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgGtTpP]?)"
                         r"(?:flop/?s|flops)?\s*$", re.IGNORECASE)


def _flops_text(text: str) -> float:
    match = _FLOPS_TEXT.match(text)
    if match is None:
        raise ValueError("not a number with an optional k/M/G/T/P prefix")
    return float(match.group(1)) * _FLOPS_UNIT[match.group(2).lower()]


def _bytes_per_s(text: str) -> float:
    return parse_rate(text) / 8


_Figure = tuple[float, float, str, Callable[[str], float]]
_FLOPS: _Figure = (1e6, 1e21, "a FLOP/s figure in [1e+06, 1e+21] (1 MFLOP/s to 1 ZFLOP/s), "
                  "e.g. '82.6T' or 3.6e12", _flops_text)
_MEM_BW: _Figure = (1e3, 1e18, "a memory bandwidth in [1e+03, 1e+18] bytes/s (1 kB/s to "
                   "1 EB/s), e.g. '900GB/s' (in a JSON file also 9e11)", _bytes_per_s)
_OVERHEAD_S: _Figure = (0.0, 3600.0, "a time per kernel in [0, 3600] seconds (at most an hour "
                       "a kernel), e.g. '8us' (in a JSON file also 8e-6)", parse_duration)
_ETA: _Figure = (0.01, 1.0, "a fraction of peak in [0.01, 1], e.g. 0.7", float)
_MEMORY: _Figure = (1.0, 1e18, "a size in bytes in [1, 1e+18], e.g. 8e10", float)
_MS_PER_SAMPLE: _Figure = (1e-6, 3.6e6, "milliseconds per sample in [1e-06, 3.6e+06] (1 ns to "
                          "an hour a sample), e.g. 40.5", float)
_KBPS: _Figure = (1e-3, 1e10, "kbit/s in [0.001, 1e+10] (1 bit/s to 10 Tbit/s), e.g. 5000", float)


def _figure(what: str, value: Any, lo: float, hi: float, allowed: str,
            parse: Callable[[str], float] = float) -> float:
    """``value``, a number or a string that ``parse`` reads, checked in ``[lo, hi]`` (NaN and
    infinities never are); else an error naming ``what``, the value and what is ``allowed``."""
    number, why = value, ""
    if isinstance(value, str):
        try:
            number = parse(value.strip())
        except ValueError as e:
            number, why = None, "" if parse is float else f" ({e})"
    if (isinstance(number, bool) or not isinstance(number, (int, float))
            or not lo <= number <= hi):
        raise ValueError(f"{what} must be {allowed}, got {value!r}{why}")
    return float(number)


def parse_flops(text: str | float, what: str = "a FLOP/s figure") -> float:
    """A FLOP/s figure: ``82.6T``, ``82.6TFLOPS``, ``3.6e12``, ``900G`` -> FLOP/s, in
    [1 MFLOP/s, 1 ZFLOP/s] (``what``: the figure an error names)."""
    return _figure(what, text, *_FLOPS)


def format_flops(value: float) -> str:
    """``82.6e12`` -> ``"82.6 TFLOP/s"``."""
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value:.4g} FLOP/s"


# -- the named profiles -------------------------------------------------------------------------
# lambda, the least one kernel costs, by kind of device (docs/devices.md argues each)
_OVERHEAD = {"datacenter-gpu": 8e-6, "consumer-gpu": 8e-6, "mac": 15e-6, "phone": 20e-6,
             "custom": 8e-6}
T, G = 1e12, 1e9


def _profile(name: str, title: str, kind: str, source: str, mem_bw: float,
             memory_gb: float | None, **peaks: float) -> DeviceProfile:
    return DeviceProfile(name=name, title=title, kind=kind, peak_flops=peaks, mem_bw=mem_bw,
                         memory=memory_gb * 1e9 if memory_gb is not None else None,
                         overhead_s=_OVERHEAD[kind], source=source)


_H100 = ("NVIDIA H100 Tensor Core GPU datasheet, SXM5 (dense: the datasheet's sparse figures "
         "halved, as its footnote says)")
_H200 = ("NVIDIA H200 Tensor Core GPU datasheet, SXM (the H100's compute, dense; 141 GB of "
         "HBM3e at 4.8 TB/s)")
_A100 = "NVIDIA A100 Tensor Core GPU datasheet and A100 whitepaper, SXM4 80GB (dense)"
_L4 = "NVIDIA L4 Tensor Core GPU datasheet (dense: sparse figures halved)"
_ADA = ("NVIDIA Ada GPU architecture whitepaper v2.1, Appendix A (GeForce RTX 4090: dense, "
        "FP16/BF16 with FP32 accumulate, half the FP16-accumulate rate on GeForce)")
_AMPERE = ("NVIDIA Ampere GA102 GPU architecture whitepaper, Appendix A (GeForce RTX 3090: "
           "dense, FP16/BF16 with FP32 accumulate)")
_METAL = ("philipturner/metal-benchmarks (GPU cores x 128 ALUs x 2 x 1.398 GHz; FP16 at the "
          "FP32 rate)")
_M3 = ("bandwidth: Apple; FLOP/s derived as for M2 (cores x 128 x 2 x 1.398 GHz), "
       "unverified: Apple states none")
_PHONE = ("order of magnitude only: Qualcomm publishes no GFLOPS; aggregators' figures, "
          "unverified")

PROFILES: dict[str, DeviceProfile] = {p.name: p for p in (
    _profile("h100", "NVIDIA H100 SXM5 80GB", "datacenter-gpu", _H100, 3.35e12, 80,
             fp32=67 * T, tf32=494.7 * T, bf16=989.4 * T, fp16=989.4 * T),
    _profile("h200", "NVIDIA H200 SXM 141GB", "datacenter-gpu", _H200, 4.8e12, 141,
             fp32=67 * T, tf32=494.7 * T, bf16=989.4 * T, fp16=989.4 * T),
    _profile("a100", "NVIDIA A100 SXM4 80GB", "datacenter-gpu", _A100, 2.039e12, 80,
             fp32=19.5 * T, tf32=156 * T, bf16=312 * T, fp16=312 * T),
    _profile("l4", "NVIDIA L4", "datacenter-gpu", _L4, 300 * G, 24,
             fp32=30.3 * T, tf32=60 * T, bf16=121 * T, fp16=121 * T),
    _profile("rtx4090", "NVIDIA GeForce RTX 4090", "consumer-gpu", _ADA, 1008 * G, 24,
             fp32=82.6 * T, tf32=82.6 * T, bf16=165.2 * T, fp16=165.2 * T),
    _profile("rtx3090", "NVIDIA GeForce RTX 3090", "consumer-gpu", _AMPERE, 936 * G, 24,
             fp32=35.6 * T, tf32=35.6 * T, bf16=71 * T, fp16=71 * T),
    _profile("m2", "Apple M2 (10-core GPU)", "mac", f"{_METAL}; bandwidth: Apple", 100 * G, 24,
             fp32=3.58 * T, fp16=3.58 * T),
    _profile("m2-max", "Apple M2 Max (38-core GPU)", "mac", f"{_METAL}; bandwidth: Apple",
             400 * G, 96, fp32=13.6 * T, fp16=13.6 * T),
    _profile("m3", "Apple M3 (10-core GPU)", "mac", _M3, 100 * G, 24,
             fp32=3.58 * T, fp16=3.58 * T),
    _profile("m3-max", "Apple M3 Max (40-core GPU)", "mac",
             f"{_M3}; bandwidth: 512-bit LPDDR5-6400", 409.6 * G, 128,
             fp32=14.3 * T, fp16=14.3 * T),
    _profile("phone-high", "high-end phone (Apple A16, 5-core GPU)", "phone",
             f"{_METAL}; LPDDR5-6400 x 64 bit", 51.2 * G, 6, fp32=1.79 * T, fp16=1.79 * T),
    _profile("phone-mid", "mid-range phone (Snapdragon 778G, Adreno 642L)", "phone",
             f"{_PHONE}; LPDDR5-6400 x 32 bit", 25.6 * G, 6, fp32=0.38 * T, fp16=0.76 * T),
    _profile("phone-low", "low-end phone (Snapdragon 4 Gen 2, Adreno 613)", "phone",
             "WikiChip (Adreno 613: 244.5 GFLOPS); LPDDR4X-4266 x 32 bit", 17 * G, 4,
             fp32=0.2445 * T, fp16=0.489 * T),
)}


def device_profile(name: str, extra: Mapping[str, DeviceProfile] | None = None
                   ) -> DeviceProfile:
    """The profile named ``name`` (case and ``-``/``_``/spaces ignored), from ``extra`` (a
    user's) or :data:`PROFILES`; an unknown name suggests the nearest."""
    known = {**PROFILES, **(extra or {})}
    key = _key(name)
    by_key = {_key(k): p for k, p in known.items()}
    if key in by_key:
        return by_key[key]
    close = difflib.get_close_matches(key, list(by_key), n=1, cutoff=0.5)
    hint = f"; did you mean {by_key[close[0]].name!r}?" if close else ""
    raise ValueError(f"unknown device {name!r}{hint} Known devices: {', '.join(known)} "
                     f"(`exogym devices` lists them with their figures), or a custom one: "
                     f"'flops=80T,mem_bw=1TB/s'")


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name.lower())


_CUSTOM_KEYS = ("flops", "fp32", "tf32", "bf16", "fp16", "mem_bw", "overhead", "eta_c",
                "eta_m", "name")


def parse_profile(text: str) -> DeviceProfile:
    """A custom device: ``flops=80T,mem_bw=1TB/s`` (``flops``: every dtype's peak; or
    ``fp32=...,bf16=...`` each), optionally ``overhead=5us``, ``eta_c=0.7``, ``eta_m=0.8``,
    ``name=mygpu``."""
    items: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in _CUSTOM_KEYS:
            raise ValueError(f"a custom device is KEY=VALUE items (e.g. 'flops=80T,"
                             f"mem_bw=1TB/s'); got {part.strip()!r} in {text!r}; keys: "
                             f"{', '.join(_CUSTOM_KEYS)}")
        if key in items:
            raise ValueError(f"a custom device gives {key} twice in {text!r}")
        items[key] = value.strip()
    if "mem_bw" not in items or not ({"flops", "fp32"} & set(items)):
        raise ValueError(f"a custom device needs flops (or fp32) and mem_bw, e.g. "
                         f"'flops=80T,mem_bw=1TB/s'; got {text!r}")
    where = f"custom device {text!r}"
    peaks = ({d: parse_flops(items["flops"], f"{where}: flops") for d in DTYPES}
             if "flops" in items else {})
    peaks.update({d: parse_flops(items[d], f"{where}: {d}") for d in DTYPES if d in items})
    return DeviceProfile(
        name=items.get("name", "custom"), title=f"custom ({text})", kind="custom",
        peak_flops=peaks, mem_bw=_figure(f"{where}: mem_bw", items["mem_bw"], *_MEM_BW),
        memory=None, overhead_s=_figure(f"{where}: overhead",
                                        items.get("overhead", _OVERHEAD["custom"]),
                                        *_OVERHEAD_S),
        source="given by the user",
        eta_c=_figure(f"{where}: eta_c", items.get("eta_c", ETA_C), *_ETA),
        eta_m=_figure(f"{where}: eta_m", items.get("eta_m", ETA_M), *_ETA))


def load_profiles(path: str | Path) -> dict[str, DeviceProfile]:
    """A user's named profiles: a JSON list of :meth:`DeviceProfile.from_dict` objects, each
    under its own name; a bad one is an error naming the file, the profile and the field."""
    where = f"device profiles {str(path)!r}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"cannot read {where}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} are not JSON: {e}") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"{where} must be a JSON list of objects with {_PROFILE_KEYS}, got "
                         f"{_shown(data)}")
    profiles: dict[str, DeviceProfile] = {}
    first: dict[str, int] = {}
    for i, entry in enumerate(data, 1):
        try:
            p = DeviceProfile.from_dict(entry)
        except ValueError as e:
            raise ValueError(f"{where}, profile {i} of {len(data)}: {e}") from None
        if _key(p.name) in first:
            raise ValueError(f"{where} give the name {p.name!r} to profiles "
                             f"{first[_key(p.name)]} and {i}: each profile needs its own name")
        first[_key(p.name)] = i
        profiles[p.name] = p
    return profiles


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a file's content in an error)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- a run's hardware ---------------------------------------------------------------------------
_MASK = (1 << 64) - 1


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over uint64s (Steele et al. 2014): a counter-based hash."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(_MASK)
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(_MASK)
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(_MASK)
        return x ^ (x >> np.uint64(31))


def uniform(seed: int, ids: np.ndarray) -> np.ndarray:
    """A uniform draw in [0, 1) per id from a hash of ``(seed, id)``: the same for a client
    whoever else is drawn, O(1) each."""
    base = _splitmix(np.array([seed & _MASK], dtype=np.uint64))
    with np.errstate(over="ignore"):
        h = _splitmix(base + np.asarray(ids, dtype=np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass(frozen=True)
class ClientTable:
    """A device-profile file in FedScale's form: per row, ``computation`` (ms per sample) and
    ``communication`` (kbit/s); client ``c`` takes row ``c mod rows`` (FedScale maps its
    clients onto its profiles cyclically).

    Attributes:
        path: the file.
        ms_per_sample: each row's compute, milliseconds per sample.
        kbps: each row's link, kbit/s, up and down.
    """

    path: str
    ms_per_sample: np.ndarray = field(repr=False)
    kbps: np.ndarray = field(repr=False)

    @property
    def sha256(self) -> str:
        """A digest of the figures the run prices (every row's, in order; not the file's
        bytes), which a resumed run's table must match."""
        h = hashlib.sha256(self.ms_per_sample.astype("<f8").tobytes())
        h.update(self.kbps.astype("<f8").tobytes())
        return h.hexdigest()


@dataclass(frozen=True)
class Hardware:
    """What every node or client of a run computes on (module docstring).

    Attributes:
        spec: the spec it was parsed from.
        devices: the distinct devices named, the first the clock's reference.
        per_node: node ``i``'s device (an index into ``devices``) for a list; None otherwise.
        shares: a mix's share of each device, drawn per client; None otherwise.
        table: a FedScale-form file's rows; None otherwise.
    """

    spec: str
    devices: tuple[DeviceProfile, ...]
    per_node: tuple[int, ...] | None = None
    shares: tuple[float, ...] | None = None
    table: ClientTable | None = None

    @property
    def uniform(self) -> bool:
        """Every node or client on one device."""
        return self.table is None and len(self.devices) == 1

    def check_nodes(self, num_nodes: int) -> None:
        if self.per_node is not None and len(self.per_node) != num_nodes:
            raise ValueError(f"--hardware {self.spec!r} lists {len(self.per_node)} devices but "
                             f"the run has {num_nodes} nodes: give one per node, or one name "
                             f"for all")

    def device_of(self, ids: np.ndarray, seed: int) -> np.ndarray:
        """Each id's device (an index into :attr:`devices`)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.per_node is not None:
            return np.asarray(self.per_node, dtype=np.int64)[ids]
        if self.shares is not None:
            edges = np.cumsum(self.shares)[:-1]
            return np.searchsorted(edges, uniform(seed, ids), side="right").astype(np.int64)
        return np.zeros(len(ids), dtype=np.int64)

    def step_times(self, count: StepCount, ids: np.ndarray, seed: int) -> np.ndarray:
        """Each id's seconds per step for the counted step."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.table is not None:
            rows = ids % len(self.table.ms_per_sample)
            return self.table.ms_per_sample[rows] * count.samples / 1000.0
        times = np.array([d.step_time(count) for d in self.devices])
        return times[self.device_of(ids, seed)]

    def links(self, ids: np.ndarray) -> np.ndarray | None:
        """Each id's link in bits/s (a FedScale-form file's), or None."""
        if self.table is None:
            return None
        rows = np.asarray(ids, dtype=np.int64) % len(self.table.kbps)
        return self.table.kbps[rows] * 1000.0

    def describe(self) -> str:
        if self.table is not None:
            return (f"{len(self.table.ms_per_sample):,} client profiles from "
                    f"{self.table.path} (FedScale form)")
        if self.shares is not None:
            return ", ".join(f"{d.name} {s:.0%}" for d, s in zip(self.devices, self.shares,
                                                                  strict=True))
        if self.per_node is not None:
            return ":".join(self.devices[i].name for i in self.per_node)
        return self.devices[0].title

    def figures(self) -> dict[str, Any]:
        """What prices a step on this hardware, resolved: every device's figures by name, and a
        FedScale-form table's rows and digest (a run's ``config.json`` records them, so that a
        resume after the profiles or the file changed is refused, naming what changed)."""
        out: dict[str, Any] = {"devices": {d.name: d.figures() for d in self.devices}}
        if self.table is not None:
            out["table"] = {"rows": len(self.table.ms_per_sample),
                            "sha256": self.table.sha256}
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spec": self.spec, "devices": [d.to_dict() for d in
                                                              self.devices]}
        if self.shares is not None:
            out["shares"] = list(self.shares)
        if self.table is not None:
            out["table"] = {"path": self.table.path, "rows": len(self.table.ms_per_sample),
                            "sha256": self.table.sha256}
        return out


def parse_hardware(spec: str | Hardware | DeviceProfile | None = None,
                   profiles: Mapping[str, DeviceProfile] | None = None) -> Hardware:
    """A run's hardware from its spec (module docstring); None: :data:`DEFAULT_HARDWARE`;
    ``profiles``: a user's named profiles (:func:`load_profiles`) besides :data:`PROFILES`."""
    if isinstance(spec, Hardware):
        return spec
    if isinstance(spec, DeviceProfile):
        return Hardware(spec.name, (spec,))
    text = DEFAULT_HARDWARE if spec is None else spec
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"hardware must be a device name, a list, a mix, a custom device or a "
                         f"file, got {spec!r}")
    text = text.strip()
    head = text.split(",")[0].split("=")[0].strip()
    if head in _CUSTOM_KEYS:
        return Hardware(text, (parse_profile(text),))
    if text.endswith((".csv", ".json")) or Path(text).is_file():
        return Hardware(text, (), table=_load_table(text))
    if "=" in text:
        return _mix(text, profiles)
    names = text.split(":")
    if len(names) == 1:
        return Hardware(text, (device_profile(text, profiles),))
    found: list[DeviceProfile] = []
    index: list[int] = []
    for name in names:
        p = device_profile(name, profiles)
        if p not in found:
            found.append(p)
        index.append(found.index(p))
    return Hardware(text, tuple(found), per_node=tuple(index))


def _mix(text: str, profiles: Mapping[str, DeviceProfile] | None) -> Hardware:
    found: list[DeviceProfile] = []
    shares: list[float] = []
    for part in text.split(","):
        name, eq, share = part.partition("=")
        try:
            value = float(share)
        except ValueError:
            value = math.nan
        if not eq or not (math.isfinite(value) and value > 0):
            raise ValueError(f"a mix of devices is NAME=SHARE items with shares > 0, e.g. "
                             f"'phone-low=0.5,phone-mid=0.3,phone-high=0.2'; got {part!r}")
        p = device_profile(name.strip(), profiles)
        if p in found:
            raise ValueError(f"device {p.name!r} appears twice in the mix {text!r}")
        found.append(p)
        shares.append(value)
    total = sum(shares)
    if abs(total - 1) > 1e-6:
        raise ValueError(f"the shares of the mix {text!r} add up to {total:g}; they must add "
                         f"up to 1")
    return Hardware(text, tuple(found), shares=tuple(s / total for s in shares))


_FEDSCALE_FORM = ("FedScale's form: JSON {client_id: {'computation': ms per sample, "
                  "'communication': kbit/s}} or CSV with columns client_id,computation,"
                  "communication")
_CLIENT_FIGURES = {"computation": _MS_PER_SAMPLE, "communication": _KBPS}


def _load_table(path: str) -> ClientTable:
    """A FedScale-form file: JSON ``{client_id: {"computation": ms_per_sample,
    "communication": kbps}}`` or CSV with columns ``client_id,computation,communication``; a
    bad row is an error naming the file, the client, the field and the value."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"cannot read the device-profile file {path!r}: {e.strerror}") from None
    rows = _json_rows(path, text) if path.endswith(".json") else _csv_rows(path, text)
    if not rows:
        raise ValueError(f"the device-profile file {path!r} lists no clients")
    rows.sort()
    return ClientTable(path, np.array([r[1] for r in rows], dtype=np.float64),
                       np.array([r[2] for r in rows], dtype=np.float64))


def _csv_rows(path: str, text: str) -> list[tuple[int, float, float]]:
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in ("client_id", *_CLIENT_FIGURES) if c not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"the device-profile file {path!r} must be {_FEDSCALE_FORM}; its "
                         f"header {reader.fieldnames} lacks {', '.join(missing)}")
    seen: dict[int, str] = {}
    return [_client_row(f"the device-profile file {path!r}, line {reader.line_num}",
                        row["client_id"], row, seen, f"line {reader.line_num}")
            for row in reader]


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object's ``(key, value)`` pairs in order, a key given twice kept twice (json's
    ``object_pairs_hook``: a client listed twice is an error, not the last one silently)."""


def _json_rows(path: str, text: str) -> list[tuple[int, float, float]]:
    try:
        data = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as e:
        raise ValueError(f"the device-profile file {path!r} is not JSON: {e}") from None
    if not isinstance(data, _Pairs):
        raise ValueError(f"the device-profile file {path!r} must be {_FEDSCALE_FORM}, got "
                         f"{_shown(data)}")
    seen: dict[int, str] = {}
    rows = []
    where = f"the device-profile file {path!r}"
    for key, value in data:
        fields = dict(value) if isinstance(value, _Pairs) else value
        if isinstance(value, _Pairs) and len(fields) < len(value):
            raise ValueError(f"{where}: client {key!r} gives a field twice: "
                             f"{[k for k, _ in value]}")
        rows.append(_client_row(where, key, fields, seen, f"key {key!r}"))
    return rows


def _client_row(where: str, key: Any, fields: Any, seen: dict[int, str], at: str
                ) -> tuple[int, float, float]:
    """One client of a FedScale-form file (``where``: the file and its line or key; ``at``:
    its line or key alone, for ``seen``, the clients so far): ``(id, ms per sample,
    kbit/s)``."""
    client = int(key) if isinstance(key, str) and key.strip().isdigit() else None
    if client is None:
        raise ValueError(f"{where}: client_id must be an integer >= 0, got {key!r}")
    if client in seen:
        raise ValueError(f"{where}: client {client} is listed twice (at {seen[client]} and "
                         f"{at}); give each client one row")
    seen[client] = at
    if not isinstance(fields, Mapping):
        raise ValueError(f"{where}: client {client} must be an object with computation (ms "
                         f"per sample) and communication (kbit/s), got {_shown(fields)}")
    figures = []
    for name, figure in _CLIENT_FIGURES.items():
        if fields.get(name) in (None, ""):
            raise ValueError(f"{where}: client {client} has no {name} ({figure[2]})")
        figures.append(_figure(f"{where}: client {client}'s {name}", fields[name], *figure))
    return client, figures[0], figures[1]


def describe_profile(p: DeviceProfile) -> list[str]:
    """The profile's figures as table cells: name, product, fp32, bf16, memory bandwidth."""
    return [p.name, p.title, format_flops(p.peak_flops["fp32"]),
            format_flops(p.peak_flops.get("bf16", p.peak_flops["fp32"])),
            f"{p.mem_bw / 1e9:,.0f} GB/s", f"{p.overhead_s * 1e6:g} us"]


@dataclass(frozen=True)
class Pricing:
    """A run's compute priced on its hardware: what the clock and ``summary.json`` take.

    Attributes:
        hardware: the run's hardware.
        count: the counted step (one node's batch).
        step_time_s: ``c``, a step on the reference device (the first named; a file's first
            row).
        speeds: every node's or client's speed relative to it (None: all 1).
        links: every node's or client's link in bits/s, up and down (a FedScale-form file's;
            None: the network's).
    """

    hardware: Hardware
    count: StepCount
    step_time_s: float
    speeds: np.ndarray | None = field(repr=False)
    links: np.ndarray | None = field(repr=False)

    @classmethod
    def of(cls, hardware: Hardware, count: StepCount, num_nodes: int, seed: int) -> Pricing:
        """Price ``count`` for ``num_nodes`` nodes or clients (``seed``: a mix's draws)."""
        ids = np.arange(num_nodes)
        if hardware.uniform:
            return cls(hardware, count, hardware.devices[0].step_time(count), None, None)
        times = hardware.step_times(count, ids, seed)
        reference = (hardware.step_times(count, np.zeros(1, dtype=np.int64), seed)[0]
                     if hardware.table is not None else hardware.devices[0].step_time(count))
        return cls(hardware, count, float(reference), reference / times, hardware.links(ids))

    @property
    def method(self) -> str:
        """How the step was priced, for the summary."""
        if self.hardware.table is not None:
            return (f"FedScale-form profiles ({self.hardware.table.path}): ms per sample x "
                    f"{self.count.samples} samples")
        mixed = ("" if self.hardware.uniform else
                 f"; this is {self.hardware.devices[0].name}'s, each node at its device's speed")
        return (f"{self.count.flops / 1e9:,.3g} GFLOP and {self.count.kernels:,} kernels per "
                f"step, counted; priced on {self.hardware.describe()} (roofline: "
                f"docs/devices.md){mixed}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hardware": {**self.hardware.to_dict(),
                                            "described": self.hardware.describe()},
                               "step": self.count.to_dict(), "step_time_s": self.step_time_s}
        if self.hardware.table is None:
            out["device_step_time_s"] = {d.name: d.step_time(self.count)
                                         for d in self.hardware.devices}
            out["bound_s"] = {d.name: d.bound(self.count) for d in self.hardware.devices}
        return out
