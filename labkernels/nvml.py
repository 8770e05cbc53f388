"""NVML provenance: the GPU's clocks, power, temperature and clocks-event (throttle) reasons, through NVIDIA's own
management library (``nvidia-ml-py``, module ``pynvml``), typed, instead of ``nvidia-smi``'s text.

* :func:`reading` -- one reading of the GPU this process computes on (CUDA's current device, found in NVML by its
  PCI bus id): SM / memory clocks (current and max, MHz), power draw and enforced limit (W), temperature (C), the
  performance state, the energy counter (mJ), the power / thermal violation counters (ns of clocks held below the
  application clocks by that policy, cumulative) and the clocks-event reasons (``nvmlDeviceGetCurrentClocksEventReasons``)
  as the raw bit mask and its decoded names. A field NVML refuses is absent and named in ``errors`` with NVML's
  reason; a machine without NVML (no driver, no ``pynvml``, no GPU) gets ``{"absent": why}``: never an exception.
* :func:`run_start` / :func:`run_end` -- what :mod:`labkernels.records` keeps as a run's ``provenance.nvml_start``
  / ``nvml_end``. Every reading of the process is logged (sequence number + reasons), so ``nvml_end`` also holds
  ``reasons_seen``: every reason any reading between the two saw (the per-round readings of
  :func:`labkernels.bench.interleaved` included).
* :class:`RoundReadings` -- a reading before and after each interleaved round, as one compact text column
  (``sm 1980>1965 MHz; 402>611 W; 41>52 C; reasons none>sw_power_cap``), taken only while one reading costs < 1% of
  a round (else the column says why it stopped).
* :func:`throttled` -- the power / thermal caps a recorded run saw (:data:`CAP_REASONS` at start, end or in
  between, or a violation counter that advanced); pages flag such a run in their banner and :func:`for_verdict`
  leaves it out of verdicts unless the caller says why it may count.
* :func:`check_run` -- ``labkernels data check``'s rule: a GPU run started at or after :data:`NVML_SINCE` carries
  both readings with clocks and reasons.
"""

from __future__ import annotations

import datetime as _dt
import html
import re
import threading
import time

#: the cut-over: GPU runs started at or after this instant (UTC, the format of a run's ``started``) must carry NVML
#: readings at start and end (``labkernels data check``); runs before it were recorded with nvidia-smi's text
NVML_SINCE = "2026-12-07T00:00:00Z"

#: clocks-event reasons that mean a power or thermal cap held the clocks down (the idle, application-clocks,
#: sync-boost and display reasons are not caps)
CAP_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

#: NVML violation policies read into each full reading (``<policy>_violation_ns``)
VIOLATION_POLICIES = {"power": "NVML_PERF_POLICY_POWER", "thermal": "NVML_PERF_POLICY_THERMAL"}

#: a per-round reading is taken while one costs at most this fraction of a round's wall time
PAIR_BUDGET = 0.01

#: the fields a reading must hold for ``data check`` (clocks and reasons)
REQUIRED = ("sm_mhz", "mem_mhz", "reasons", "reasons_names")

_lock = threading.Lock()
_state: dict = {}          # "nv": the initialized pynvml module, or "why": why NVML is not usable here
_handles: dict = {}        # selector -> NVML device handle
_log: list = []            # (seq, reasons mask or None) of every reading this process took


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _reset() -> None:
    """Forget the NVML state of this process (tests)."""
    with _lock:
        _state.clear()
        _handles.clear()
        _log.clear()


def _nv():
    """The initialized pynvml module; raises LookupError(why) when NVML cannot be used on this machine."""
    with _lock:
        if "nv" in _state:
            return _state["nv"]
        if "why" in _state:
            raise LookupError(_state["why"])
        try:
            import pynvml
        except ImportError:
            _state["why"] = "NVML not read: the Python package nvidia-ml-py (module pynvml) is not installed"
            raise LookupError(_state["why"]) from None
        try:
            pynvml.nvmlInit()
        except Exception as e:  # pynvml.NVMLError_* (no driver library, no GPU, driver/library mismatch)
            _state["why"] = f"NVML not read: nvmlInit failed ({type(e).__name__}: {e})"
            raise LookupError(_state["why"]) from None
        _state["nv"] = pynvml
        return pynvml


def _cuda_pci_bus_id() -> str | None:
    """The PCI bus id of CUDA's current device (the GPU this process computes on), or None without one."""
    if not gpu_available():
        return None
    try:
        import cupy

        return str(cupy.cuda.Device().pci_bus_id)
    except Exception:
        return None


def _handle(pci_bus_id: str | None = None):
    """(pynvml, device handle) of the GPU named by PCI bus id (default: CUDA's current device; without CUDA, the
    first CUDA_VISIBLE_DEVICES entry or NVML's device 0). Raises LookupError(why)."""
    import os

    nv = _nv()
    sel = pci_bus_id or _cuda_pci_bus_id()
    if sel is None:
        first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
        sel = first or "0"
    with _lock:
        if sel in _handles:
            return nv, _handles[sel]
    try:
        if re.fullmatch(r"\d+", sel):
            h = nv.nvmlDeviceGetHandleByIndex(int(sel))
        elif sel.startswith(("GPU-", "MIG-")):
            h = nv.nvmlDeviceGetHandleByUUID(sel)
        else:
            h = nv.nvmlDeviceGetHandleByPciBusId(sel)
    except Exception as e:
        raise LookupError(f"NVML not read: no NVML device {sel!r} ({type(e).__name__}: {e})") from None
    with _lock:
        _handles[sel] = h
    return nv, h


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def reason_bits(nv) -> dict[int, str]:
    """{bit: name} of the clocks-event reasons pynvml defines (``nvmlClocksEventReasonSwPowerCap`` ->
    ``sw_power_cap``; the older ``nvmlClocksThrottleReason*`` spellings fill bits the new ones lack)."""
    bits: dict[int, str] = {}
    skip = {"None", "All", "UserDefinedClocks"}     # the empty mask, the union, a deprecated alias
    for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
        for attr in sorted(dir(nv)):
            if not attr.startswith(prefix) or attr[len(prefix):] in skip:
                continue
            v = getattr(nv, attr)
            if isinstance(v, int) and v > 0 and v & (v - 1) == 0:
                bits.setdefault(v, _snake(attr[len(prefix):]))
    return bits


def decode(mask: int, bits: dict[int, str]) -> list[str]:
    """The names of the set bits of a clocks-event reasons mask (an unknown bit as ``bit_0x...``)."""
    out, b = [], 1
    while b <= mask:
        if mask & b:
            out.append(bits.get(b, f"bit_{b:#x}"))
        b <<= 1
    return out


def _seen(mask) -> int:
    with _lock:
        _log.append(mask)
        return len(_log) - 1


def reading(pci_bus_id: str | None = None, full: bool = True) -> dict:
    """One NVML reading of a GPU (see the module doc); ``full=False``: clocks, power, temperature and reasons only
    (the per-round reading). ``{"absent": why}`` where NVML cannot be read."""
    try:
        nv, h = _handle(pci_bus_id)
    except LookupError as e:
        return {"absent": str(e)}
    out: dict = {"t": utc_now()}
    errors: dict = {}

    def q(key, fn):
        try:
            out[key] = fn()
        except Exception as e:  # pynvml.NVMLError_NotSupported, ... : the field is absent and says why
            errors[key] = f"{type(e).__name__}: {e}"

    q("sm_mhz", lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
    q("mem_mhz", lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)))
    q("power_w", lambda: round(nv.nvmlDeviceGetPowerUsage(h) / 1000.0, 1))
    q("temp_c", lambda: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
    events = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    q("reasons", lambda: int(events(h)))
    if full:
        q("sm_max_mhz", lambda: int(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)))
        q("mem_max_mhz", lambda: int(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)))
        q("power_limit_w", lambda: round(nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0, 1))
        q("pstate", lambda: f"P{int(nv.nvmlDeviceGetPerformanceState(h))}")
        q("energy_mj", lambda: int(nv.nvmlDeviceGetTotalEnergyConsumption(h)))
        for pol, const in VIOLATION_POLICIES.items():
            q(f"{pol}_violation_ns", lambda const=const: int(
                nv.nvmlDeviceGetViolationStatus(h, getattr(nv, const)).violationTime))
    if "reasons" in out:
        out["reasons_names"] = decode(out["reasons"], reason_bits(nv))
    if errors:
        out["errors"] = errors
    out["seq"] = _seen(out.get("reasons"))
    return out


def identity(pci_bus_id: str | None = None) -> dict:
    """Which GPU NVML sees (name, uuid, NVML index, PCI bus id, driver version, compute capability), or
    ``{"absent": why}``."""
    try:
        nv, h = _handle(pci_bus_id)
    except LookupError as e:
        return {"absent": str(e)}
    out: dict = {}
    errors: dict = {}
    for key, fn in (("name", lambda: nv.nvmlDeviceGetName(h)), ("uuid", lambda: nv.nvmlDeviceGetUUID(h)),
                    ("index", lambda: int(nv.nvmlDeviceGetIndex(h))),
                    ("pci_bus_id", lambda: nv.nvmlDeviceGetPciInfo(h).busId),
                    ("driver", lambda: nv.nvmlSystemGetDriverVersion()),
                    ("cc", lambda: "{}.{}".format(*nv.nvmlDeviceGetCudaComputeCapability(h)))):
        try:
            v = fn()
            out[key] = v.decode() if isinstance(v, bytes) else v
        except Exception as e:
            errors[key] = f"{type(e).__name__}: {e}"
    if errors:
        out["errors"] = errors
    return out


# ------------------------------------------------------------------------------------------------ runs
def run_start(prov: dict) -> dict:
    """The reading a recorded run keeps as ``provenance.nvml_start`` (no GPU in its provenance: absent, saying so)."""
    if not prov.get("gpu"):
        return {"absent": "no CUDA GPU in this run's provenance: nothing to read"}
    return reading()


def run_end(start: dict | None) -> dict:
    """``provenance.nvml_end``: a reading now, with ``reasons_seen`` (every reason any reading of this process since
    ``start`` saw) and ``readings`` (how many there were)."""
    if not start or "absent" in start and "no CUDA GPU" in start["absent"]:
        return {"absent": (start or {}).get("absent", "no nvml_start")}
    end = reading()
    if "absent" in end or "seq" not in (start or {}):
        return end
    with _lock:
        masks = [m for m in _log[start["seq"]:end["seq"] + 1] if m is not None]
    try:
        bits = reason_bits(_nv())
    except LookupError:
        bits = {}
    union = 0
    for m in masks:
        union |= m
    end["reasons_seen"] = decode(union, bits)
    end["readings"] = len(masks)
    return end


def _prov(run_or_prov) -> dict:
    if isinstance(run_or_prov, dict):
        return run_or_prov
    return getattr(run_or_prov, "provenance", None) or {}


def throttled(run) -> list[str]:
    """The power / thermal caps a recorded run (or its provenance dict) saw, one phrase each: a :data:`CAP_REASONS`
    reason at start, at end or in a reading between them, or a violation counter that advanced. Empty: no cap seen
    (or a run recorded without NVML: nothing to say)."""
    p = _prov(run)
    start, end = p.get("nvml_start") or {}, p.get("nvml_end") or {}
    out, named = [], set()
    for where, names in (("at start", start.get("reasons_names") or []), ("at end", end.get("reasons_names") or []),
                         ("during the run", end.get("reasons_seen") or [])):
        for n in names:
            if n in CAP_REASONS and n not in named:
                named.add(n)
                out.append(f"{n} {where}")
    for pol in VIOLATION_POLICIES:
        a, b = start.get(f"{pol}_violation_ns"), end.get(f"{pol}_violation_ns")
        if isinstance(a, int) and isinstance(b, int) and b > a:
            out.append(f"{pol} violation counter +{(b - a) / 1e6:.1f} ms")
    return out


def for_verdict(run, why: str | None = None) -> bool:
    """Whether a verdict may count this run: not throttled (:func:`throttled`), or the caller says ``why`` a
    throttled one still counts (the page must show that reason)."""
    return not throttled(run) or bool(why and why.strip())


def throttle_html(run) -> str:
    """The banner's flag for a throttled run ('' when it saw no cap)."""
    caps = throttled(run) if run is not None else []
    if not caps:
        return ""
    return ("<br><b>THROTTLED</b> &mdash; NVML saw a power or thermal cap during this run (" + html.escape(", ".join(caps))
            + "): its timings may be capped; verdicts leave it out unless this page says why.")


def check_run(meta: dict) -> list[str]:
    """``data check``'s NVML rule for one run's metadata: a run with a GPU in its provenance, started at or after
    :data:`NVML_SINCE`, carries ``nvml_start`` and ``nvml_end`` each with SM / memory clocks and the clocks-event
    reasons. Returns the problems (empty: fine)."""
    p = meta.get("provenance") or {}
    started = str(meta.get("started") or p.get("date") or "")
    if not p.get("gpu") or started < NVML_SINCE:
        return []
    probs = []
    for key in ("nvml_start", "nvml_end"):
        r = p.get(key)
        if not isinstance(r, dict):
            probs.append(f"run {meta.get('run_id')}: a GPU run recorded after {NVML_SINCE} without provenance.{key}")
        elif "absent" in r:
            probs.append(f"run {meta.get('run_id')}: provenance.{key} is absent ({r['absent']})")
        elif missing := [f for f in REQUIRED if f not in r]:
            probs.append(f"run {meta.get('run_id')}: provenance.{key} lacks {missing}"
                         + (f" (NVML: {r['errors']})" if r.get("errors") else ""))
    return probs


# ------------------------------------------------------------------------------------------------ interleaved rounds
def _short(r: dict, key: str) -> str:
    v = r.get(key)
    return "?" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _names(r: dict) -> str:
    if "reasons_names" not in r:
        return "?"
    return "+".join(r["reasons_names"]) or "none"


def pair_text(before: dict, after: dict) -> str:
    """The compact column of one round: ``sm 1980>1965 MHz; 402>611 W; 41>52 C; reasons none>sw_power_cap``."""
    return (f"sm {_short(before, 'sm_mhz')}>{_short(after, 'sm_mhz')} MHz; {_short(before, 'power_w')}>"
            f"{_short(after, 'power_w')} W; {_short(before, 'temp_c')}>{_short(after, 'temp_c')} C; reasons "
            f"{_names(before)}>{_names(after)}")


_PAIR_RX = re.compile(r"^sm (\S+)>(\S+) MHz; (\S+)>(\S+) W; (\S+)>(\S+) C; reasons (\S+)>(\S+)$")


def parse_pair(text) -> dict | None:
    """The fields of a :func:`pair_text` column (None for a round that was not read)."""
    m = _PAIR_RX.match(str(text)) if isinstance(text, str) else None
    if not m:
        return None
    num = lambda s: None if s == "?" else float(s)  # noqa: E731
    reasons = lambda s: [] if s in ("none", "?") else s.split("+")  # noqa: E731
    return {"sm_mhz": (num(m[1]), num(m[2])), "power_w": (num(m[3]), num(m[4])), "temp_c": (num(m[5]), num(m[6])),
            "reasons": (reasons(m[7]), reasons(m[8]))}


def pair_caps(text) -> list[str]:
    """The :data:`CAP_REASONS` a round's column shows before or after it."""
    p = parse_pair(text)
    if p is None:
        return []
    return sorted({n for side in p["reasons"] for n in side if n in CAP_REASONS})


class RoundReadings:
    """Readings around the rounds of one interleaved measurement: :meth:`before` ahead of a round, :meth:`after`
    behind it (the reading after a round is the next round's before). ``enabled`` False where NVML cannot be read
    (the rows then get no column: the run's ``nvml_start`` says why). After the first round, readings stop when one
    costs more than :data:`PAIR_BUDGET` of a round's wall time; later rounds' columns say so."""

    def __init__(self, pci_bus_id: str | None = None):
        self.bus = pci_bus_id
        self.prev: dict | None = None
        self.cost_s = 0.0
        self.stopped: str | None = None
        self.enabled = True

    def _read(self) -> dict:
        t0 = time.perf_counter()
        r = reading(self.bus, full=False)
        self.cost_s = max(self.cost_s, time.perf_counter() - t0)
        if "absent" in r:
            self.enabled = False
        return r

    def before(self) -> None:
        if self.enabled and self.stopped is None and self.prev is None:
            self.prev = self._read()

    def after(self, round_s: float) -> str | None:
        """The round's column text (None: no column, NVML is not readable here)."""
        if not self.enabled:
            return None
        if self.stopped is not None:
            return self.stopped
        cur = self._read()
        if not self.enabled:
            return None
        text = pair_text(self.prev or {}, cur)
        self.prev = cur
        if round_s > 0 and self.cost_s > PAIR_BUDGET * round_s:
            self.stopped = (f"not read: one NVML reading takes {self.cost_s * 1e3:.2f} ms, over "
                            f"{PAIR_BUDGET:.0%} of a {round_s * 1e3:.1f} ms round")
        return text
