"""Smem-to-occupancy calculator over device profiles held as data (labkernels/profiles/devices.json).

``occupancy(device, threads_per_block, regs_per_thread, smem_per_block[, carveout])`` returns blocks/SM, active
warps, theoretical occupancy and the binding limit. It follows the arithmetic of CUDA's own header-only
calculator, ``cuda_occupancy.h`` (cudaOccMaxActiveBlocksPerMultiprocessor), and is checked against it:
``cuda_occ_reference()`` builds a tiny C++ harness (labkernels/tools/occ_harness.cpp) against that header and
runs it on the same configs (tests/test_occupancy.py, thousands of random configs per profile, no GPU needed).

The model, per block of T threads, R registers/thread, S bytes of shared memory (static + dynamic):

* warps:      W = ceil(T / warp_size); limit = max_warps_per_sm // W
* registers:  registers go to warps in units of ``reg_alloc_unit`` (256): per warp ceil(R*32/256)*256; the register
              file is split over ``reg_subpartitions`` (4) sub-partitions, so the SM holds
              4 * ((regs_per_sm/4) // per-warp) warps; limit = that // W. A block whose registers (its warps
              rounded up to a multiple of 4, as the hardware check does) exceed regs_per_block cannot launch.
* shared mem: per block ceil((S + reserved) / 128) * 128 (the driver reserves 1 KB per block from cc 8.0);
              limit = smem available per SM // that.
* blocks:     max_blocks_per_sm.

Carveout: with ``carveout=None`` (cudaSharedmemCarveoutDefault, what the lab's launchers use) the full
``smem_per_sm`` is available, as in cuda_occupancy.h - the driver picks an L1/shared split that does not limit
occupancy. The result also reports ``carveout_kb``: the smallest carveout step (of ``carveout_steps_kb``) that
still holds the computed blocks/SM, i.e. the split the driver would pick. With an explicit ``carveout`` percentage
(cudaFuncAttributePreferredSharedMemoryCarveout, 0..100) the preference is ``carveout% * smem_per_sm`` rounded up
to the next step; like the header, a preference smaller than one block's allocation is overridden by the step
that holds one block (the preference is a hint, never a launch failure).

Impossible configs (threads outside 1..max_threads_per_block, registers outside 0..255, shared memory above the
opt-in cap, registers per block above regs_per_block) raise ``OccupancyError`` (a ValueError) - where
cuda_occupancy.h returns 0 blocks. The one deliberate difference: the header accepts 256 registers/thread,
ptxas never allocates more than 255, so 256 is an error here.
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import paths
from .paths import read_small_file

PROFILES_PATH = Path(__file__).resolve().parent / "profiles" / "devices.json"
HARNESS_SRC = Path(__file__).resolve().parent / "tools" / "occ_harness.cpp"

LIMIT_NAMES = ("warps", "registers", "smem", "blocks")  # order used to name the limiter on ties (header's bit order)

#: flat profile keys that every architecture must define
ARCH_KEYS = ("compute_capability", "warp_size", "max_threads_per_block", "max_threads_per_sm", "max_warps_per_sm",
             "max_blocks_per_sm", "regs_per_sm", "regs_per_block", "max_regs_per_thread", "reg_alloc_unit",
             "reg_alloc_granularity", "reg_subpartitions", "smem_per_sm", "smem_per_block",
             "smem_per_block_optin", "smem_alloc_granularity", "smem_reserved_per_block", "carveout_steps_kb")


class OccupancyError(ValueError):
    """A launch configuration that cannot run on the device (or a bad argument)."""


# ---------------------------------------------------------------------------------------------------- profiles

def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


@functools.lru_cache(maxsize=4)
def _load_raw(path: str) -> dict:
    text = read_small_file(path, OccupancyError, "device profile table", limit=16 << 20)
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise OccupancyError(f"device profile table {path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("devices"), dict) or not isinstance(raw.get("archs"), dict):
        raise OccupancyError(f"device profile table {path}: expected an object with 'devices' and 'archs' objects")
    return raw


def _resolve_arch(raw: dict, arch: str, seen=()) -> dict:
    archs = raw["archs"]
    if arch not in archs:
        raise OccupancyError(f"unknown arch {arch!r} in profiles; known: {sorted(archs)}")
    if arch in seen:
        raise OccupancyError(f"arch inheritance cycle through {arch!r}")
    entry = archs[arch]
    base = _resolve_arch(raw, entry["inherits"], seen + (arch,)) if "inherits" in entry else {}
    out = dict(base)
    out.update({k: v for k, v in entry.items() if k != "inherits"})
    return out


def load_profiles(path: str | os.PathLike | None = None) -> dict:
    """All device profiles, flattened: ``{key: {'name', 'arch', 'sm_count', <arch values>..., 'sources': {...}}}``.

    Each value is plain (``profile['smem_per_sm'] == 233472``); its citations sit in ``profile['sources'][field]``
    (a list of keys of the JSON's top-level ``sources`` catalog) and notes in ``profile['notes'][field]``.
    """
    raw = _load_raw(str(path or PROFILES_PATH))
    out = {}
    for key, dev in raw["devices"].items():
        arch = _resolve_arch(raw, dev["arch"])
        prof = {"key": key, "name": dev["name"], "arch": dev["arch"], "family": arch.get("family", ""),
                "aliases": list(dev.get("aliases", [])), "sources": {}, "notes": {}, "confirmed_by": {}}
        fields = dict(arch)
        fields["sm_count"] = dev["sm_count"]
        for k, v in fields.items():
            if not isinstance(v, dict) or "value" not in v:
                continue
            val = v["value"]
            prof[k] = tuple(val) if isinstance(val, list) else val
            prof["sources"][k] = list(v.get("sources", []))
            if "note" in v:
                prof["notes"][k] = v["note"]
            if "confirmed_by" in v:
                prof["confirmed_by"][k] = v["confirmed_by"]
        missing = [k for k in ARCH_KEYS + ("sm_count",) if k not in prof]
        if missing:
            raise OccupancyError(f"profile {key!r} lacks {missing}")
        out[key] = prof
    return out


def source_catalog(path=None) -> dict:
    """The JSON's ``sources`` catalog (key -> title/url/path)."""
    return _load_raw(str(path or PROFILES_PATH))["sources"]


def disagreements(path=None) -> list:
    """Recorded disagreements between sources and which value the checks confirmed."""
    return _load_raw(str(path or PROFILES_PATH)).get("disagreements", [])


def profile(name) -> dict:
    """One profile by key or alias, case/punctuation-insensitive: 'h200', 'H100', 'GB10', 'rtx-4090', 'sm_90'.

    A profile dict is passed through unchanged.
    """
    if isinstance(name, dict):
        return _check_profile_dict(name)
    if not isinstance(name, str):
        raise OccupancyError(f"device must be a profile name or a profile dict, got {type(name).__name__} {name!r}")
    profs = load_profiles()
    n = _norm(name)
    for key, p in profs.items():
        if n == _norm(key) or n in {_norm(a) for a in p["aliases"]}:
            return copy.deepcopy(p)
    raise OccupancyError(f"unknown device {name!r}; known: "
                         + ", ".join(f"{k} ({', '.join(p['aliases'])})" for k, p in profs.items()))


def _check_profile_dict(p: dict) -> dict:
    """A profile given as a dict must hold what the calculator reads, with values of the right kind."""
    need = ("key", "name", "arch", "sm_count") + tuple(ARCH_KEYS)
    missing = [k for k in need if k not in p]
    if missing:
        raise OccupancyError(f"device profile dict lacks {missing} (a profile from occupancy.profile(name) has them)")
    for k in ("sm_count",) + tuple(k for k in ARCH_KEYS if k != "reg_alloc_granularity"):
        v = p[k]
        vals = v if isinstance(v, (tuple, list)) else (v,)
        if not vals or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in vals):
            raise OccupancyError(f"device profile {p.get('key')!r}: {k} = {v!r} is not a non-negative integer"
                                 + (" list" if isinstance(v, (tuple, list)) else ""))
    for k in ("warp_size", "max_warps_per_sm", "reg_subpartitions", "reg_alloc_unit", "smem_alloc_granularity",
              "max_blocks_per_sm", "max_threads_per_block", "sm_count"):
        if k in p and p[k] < 1:
            raise OccupancyError(f"device profile {p.get('key')!r}: {k} = {p[k]!r} must be >= 1")
    return p


# ---------------------------------------------------------------------------------------------------- calculator

def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def _align_carveout(p: dict, nbytes: int) -> int:
    """Round a shared-memory size up to the next carveout step (cudaOccAlignUpShmemSizeVoltaPlus)."""
    for kb in p["carveout_steps_kb"]:
        if nbytes <= kb * 1024:
            return kb * 1024
    raise OccupancyError(f"{nbytes} B of shared memory exceeds the largest carveout step of {p['key']} "
                         f"({p['carveout_steps_kb'][-1]} KB)")


def _as_int(name, v) -> int:
    import numbers  # noqa: PLC0415
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise OccupancyError(f"{name} must be an integer, got {v!r}")
    return int(v)


def occupancy(device, threads_per_block: int, regs_per_thread: int, smem_per_block: int, carveout=None) -> dict:
    """Theoretical occupancy of one launch configuration on ``device`` (a profile name/alias or dict).

    ``smem_per_block`` is the kernel's static + dynamic shared memory in bytes (without the driver's reserve);
    ``carveout`` is None (default split) or a percentage 0..100 (-1 = default, as in the CUDA API).

    Returns a dict: blocks_per_sm, warps_per_sm (active warps), max_warps_per_sm, occupancy (0..1),
    occupancy_pct, limiter (the binding limit: 'warps' | 'registers' | 'smem' | 'blocks'), limiters (all limits
    that equal blocks_per_sm), limits {warps, registers, smem, blocks} (blocks/SM each resource alone allows; None =
    unlimited), warps_per_block, regs_alloc_per_warp, regs_alloc_per_block, smem_alloc_per_block (with the reserve,
    rounded to the allocation granularity), smem_per_sm_available (the carveout the calculation assumed),
    carveout_kb (the smallest carveout step that keeps blocks_per_sm), device, arch, sm_count, inputs.
    """
    p = profile(device)
    T = _as_int("threads_per_block", threads_per_block)
    R = _as_int("regs_per_thread", regs_per_thread)
    S = _as_int("smem_per_block", smem_per_block)
    dev = f"{p['key']} ({p['name']}, {p['arch']})"

    if T < 1 or T > p["max_threads_per_block"]:
        raise OccupancyError(f"threads_per_block={T}: {dev} allows 1..{p['max_threads_per_block']} threads per block")
    if R < 0 or R > p["max_regs_per_thread"]:
        raise OccupancyError(f"regs_per_thread={R}: {dev} allows 0..{p['max_regs_per_thread']} registers per thread")
    if S < 0:
        raise OccupancyError(f"smem_per_block={S}: must be >= 0")
    if S > p["smem_per_block_optin"]:
        raise OccupancyError(f"smem_per_block={S} B exceeds the opt-in cap of {dev}: "
                             f"{p['smem_per_block_optin']} B ({p['smem_per_block_optin'] / 1024:g} KB) per block")
    if carveout is not None:
        c = _as_int("carveout", carveout)
        if c < -1 or c > 100:
            raise OccupancyError(f"carveout={c}: a percentage 0..100 (or -1 / None for the default)")
        carveout = None if c == -1 else c

    ws = p["warp_size"]
    wpb = _ceil_div(T, ws)

    # warps
    lim_warps = p["max_warps_per_sm"] // wpb

    # registers (allocated per warp, per sub-partition)
    unit, nsub = p["reg_alloc_unit"], p["reg_subpartitions"]
    regs_per_warp = _round_up(R * ws, unit)
    regs_block = regs_per_warp * wpb
    regs_block_hw = regs_per_warp * _round_up(wpb, nsub)
    if regs_block > p["regs_per_block"] or regs_block_hw > p["regs_per_block"]:
        raise OccupancyError(
            f"{T} threads x {R} registers: {regs_per_warp} registers per warp x {wpb} warps "
            f"({'rounded up to ' + str(_round_up(wpb, nsub)) + ' warps, ' if regs_block_hw > regs_block else ''}"
            f"{max(regs_block, regs_block_hw)} registers) exceed the {p['regs_per_block']} registers per block "
            f"of {dev}")
    if regs_per_warp:
        lim_regs = nsub * ((p["regs_per_sm"] // nsub) // regs_per_warp) // wpb
    else:
        lim_regs = None

    # shared memory
    smem_alloc = _round_up(S + p["smem_reserved_per_block"], p["smem_alloc_granularity"])
    if carveout is None:
        pref = _align_carveout(p, p["smem_per_sm"])
    else:
        pref = _align_carveout(p, carveout * p["smem_per_sm"] // 100)
    smem_sm = pref if pref >= smem_alloc else _align_carveout(p, smem_alloc)
    lim_smem = smem_sm // smem_alloc if smem_alloc > 0 else None

    lim_blocks = p["max_blocks_per_sm"]

    limits = {"warps": lim_warps, "registers": lim_regs, "smem": lim_smem, "blocks": lim_blocks}
    blocks = min(v for v in limits.values() if v is not None)
    limiters = [k for k in LIMIT_NAMES if limits[k] == blocks]
    warps = blocks * wpb
    occ = warps / p["max_warps_per_sm"]

    # the carveout the driver would pick by default: the smallest step that still holds `blocks` blocks
    if carveout is None:
        carveout_kb = next(kb for kb in p["carveout_steps_kb"] if kb * 1024 >= smem_alloc * blocks)
    else:
        carveout_kb = smem_sm // 1024

    return {
        "device": p["key"], "name": p["name"], "arch": p["arch"], "sm_count": p["sm_count"],
        "inputs": {"threads_per_block": T, "regs_per_thread": R, "smem_per_block": S, "carveout": carveout},
        "blocks_per_sm": blocks,
        "warps_per_sm": warps,
        "max_warps_per_sm": p["max_warps_per_sm"],
        "occupancy": occ,
        "occupancy_pct": round(100.0 * occ, 2),
        "limiter": limiters[0],
        "limiters": limiters,
        "limits": limits,
        "warps_per_block": wpb,
        "regs_alloc_per_warp": regs_per_warp,
        "regs_alloc_per_block": regs_block,
        "smem_alloc_per_block": smem_alloc,
        "smem_per_sm_available": smem_sm,
        "carveout_kb": carveout_kb,
        "blocks_per_device": blocks * p["sm_count"],
    }


def max_warps_from_achieved(achieved_warps: float, achieved_occupancy: float) -> float:
    """The per-SM warp ceiling implied by an achieved-occupancy reading (ncu: warps/SM and its % of peak): warps >= 0,
    occupancy in (0, 1] or a percentage in (1, 100]; OccupancyError otherwise."""
    import math  # noqa: PLC0415
    import numbers  # noqa: PLC0415

    for name, v in (("achieved_warps", achieved_warps), ("achieved_occupancy", achieved_occupancy)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            raise OccupancyError(f"{name} must be a finite number, got {v!r}")
    if achieved_warps < 0:
        raise OccupancyError(f"achieved_warps must be >= 0, got {achieved_warps!r}")
    if not 0 < achieved_occupancy <= 100:
        raise OccupancyError(f"achieved_occupancy must be a fraction in (0, 1] or a percentage in (1, 100], got "
                             f"{achieved_occupancy!r}")
    if achieved_occupancy > 1.0:
        achieved_occupancy /= 100.0
    out = achieved_warps / achieved_occupancy
    if not math.isfinite(out):
        raise OccupancyError(f"{achieved_warps!r} warps at occupancy {achieved_occupancy!r} imply no finite warp count")
    return out


# ---------------------------------------------------------------------------------------------------- reference

def occ_device_prop(p) -> dict:
    """A profile as the cudaOccDeviceProp fields cuda_occupancy.h needs (names as in the header)."""
    p = profile(p)
    major, minor = p["compute_capability"]
    return {
        "computeMajor": major, "computeMinor": minor,
        "maxThreadsPerBlock": p["max_threads_per_block"],
        "maxThreadsPerMultiprocessor": p["max_threads_per_sm"],
        "regsPerBlock": p["regs_per_block"],
        "regsPerMultiprocessor": p["regs_per_sm"],
        "warpSize": p["warp_size"],
        "sharedMemPerBlock": p["smem_per_block"],
        "sharedMemPerMultiprocessor": p["smem_per_sm"],
        "numSms": p["sm_count"],
        "sharedMemPerBlockOptin": p["smem_per_block_optin"],
        "reservedSharedMemPerBlock": p["smem_reserved_per_block"],
    }


_PROP_ORDER = ("computeMajor", "computeMinor", "maxThreadsPerBlock", "maxThreadsPerMultiprocessor", "regsPerBlock",
               "regsPerMultiprocessor", "warpSize", "sharedMemPerBlock", "sharedMemPerMultiprocessor", "numSms",
               "sharedMemPerBlockOptin", "reservedSharedMemPerBlock")


def cuda_include_dir() -> Path | None:
    """The CUDA include directory holding cuda_occupancy.h (CUDA_HOME/CUDA_PATH, nvcc's prefix, /usr/local/cuda)."""
    cands = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(Path(os.environ[env]) / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve()
        cands += [real.parent.parent / "include", Path(nvcc).parent.parent / "include"]
        cands += [real.parent.parent / "targets" / "x86_64-linux" / "include"]
    cands += [Path("/usr/local/cuda/include")]
    for c in cands:
        if (c / "cuda_occupancy.h").exists():
            return c
    return None


def _cxx() -> str | None:
    for c in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def _cache_root() -> Path:
    try:
        root = paths.CACHE_DIR
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except Exception:  # pragma: no cover - read-only checkout, odd layouts
        pass
    return Path(tempfile.gettempdir()) / "labkernels-cache"


def build_harness(force: bool = False) -> Path:
    """Compile occ_harness.cpp against cuda_occupancy.h (cached by the hash of both) and return the binary."""
    inc = cuda_include_dir()
    if inc is None:
        raise FileNotFoundError("cuda_occupancy.h not found (set CUDA_HOME or put nvcc on PATH)")
    cxx = _cxx()
    nvcc = shutil.which("nvcc")
    if cxx is None and nvcc is None:
        raise FileNotFoundError("no C++ compiler (g++/c++/clang++) or nvcc to build the occupancy harness")
    h = hashlib.sha256()
    h.update(HARNESS_SRC.read_bytes())
    h.update((inc / "cuda_occupancy.h").read_bytes())
    h.update(str(cxx or nvcc).encode())
    out_dir = _cache_root() / "occ_harness" / h.hexdigest()[:16]
    exe = out_dir / "occ_harness"
    if exe.exists() and not force:
        return exe
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"occ_harness.tmp{os.getpid()}"
    if cxx:
        cmd = [cxx, "-O1", "-std=c++11", f"-I{inc}", str(HARNESS_SRC), "-o", str(tmp)]
    else:
        cmd = [nvcc, "-x", "cu", "-O1", f"-I{inc}", str(HARNESS_SRC), "-o", str(tmp)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building the occupancy harness failed ({' '.join(cmd)}):\n{r.stderr}")
    os.replace(tmp, exe)
    return exe


def _config_tuple(c):
    """(threads, regs, static_smem, dynamic_smem, carveout) from a tuple/list or dict config."""
    if isinstance(c, dict):
        T, R = c["threads"] if "threads" in c else c["threads_per_block"], c["regs"] if "regs" in c else c[
            "regs_per_thread"]
        if "dynamic_smem" in c or "static_smem" in c:
            st, dy = int(c.get("static_smem", 0)), int(c.get("dynamic_smem", 0))
        else:
            st, dy = 0, int(c.get("smem", c.get("smem_per_block", 0)))
        cv = c.get("carveout")
    else:
        c = tuple(c)
        T, R, sm = c[0], c[1], c[2]
        cv = c[3] if len(c) > 3 else None
        st, dy = 0, int(sm)
    return int(T), int(R), int(st), int(dy), (-1 if cv is None else int(cv))


def cuda_occ_reference_full(p, configs) -> list[dict]:
    """cuda_occupancy.h's full result per config: err, blocks, limiting_factors, limits, allocations."""
    p = profile(p)
    exe = build_harness()
    prop = occ_device_prop(p)
    lines = ["P " + " ".join(str(int(prop[k])) for k in _PROP_ORDER)]
    for c in configs:
        T, R, st, dy, cv = _config_tuple(c)
        # the launcher opts in to exactly what it launches with, never below the 48 KB default
        max_dyn = max(dy, p["smem_per_block"] - st, 0)
        lines.append(f"C {T} {R} {st} {dy} {cv} {max_dyn}")
    r = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"occupancy harness failed: {r.stderr}")
    out = []
    for line in r.stdout.split("\n"):
        if not line.strip():
            continue
        v = line.split()
        unl = lambda x: None if int(x) == -1 else int(x)  # noqa: E731
        out.append({"err": int(v[0]), "blocks_per_sm": int(v[1]), "limiting_factors": int(v[2]),
                    "limits": {"registers": unl(v[3]), "smem": unl(v[4]), "warps": unl(v[5]), "blocks": unl(v[6])},
                    "regs_alloc_per_block": int(v[7]), "smem_alloc_per_block": int(v[8])})
    if len(out) != len(lines) - 1:
        raise RuntimeError(f"occupancy harness answered {len(out)} of {len(lines) - 1} configs")
    return out


def cuda_occ_reference(p, configs) -> list[int]:
    """Blocks/SM per config from CUDA's cuda_occupancy.h (cudaOccMaxActiveBlocksPerMultiprocessor).

    ``configs``: (threads, regs, smem[, carveout]) tuples or dicts with threads/regs/smem (or static_smem +
    dynamic_smem)/carveout. A header error (invalid input) is reported as -1.
    """
    return [r["blocks_per_sm"] if r["err"] == 0 else -1 for r in cuda_occ_reference_full(p, configs)]


# ---------------------------------------------------------------------------------------------------- CLI

def format_table(r: dict) -> str:
    i = r["inputs"]
    lim = r["limits"]
    fmt = lambda v: "-" if v is None else str(v)  # noqa: E731
    rows = [
        ("device", f"{r['device']}  {r['name']}  {r['arch']}  {r['sm_count']} SMs"),
        ("block", f"{i['threads_per_block']} threads ({r['warps_per_block']} warps), {i['regs_per_thread']} regs, "
                  f"{i['smem_per_block']} B smem" + ("" if i["carveout"] is None else f", carveout {i['carveout']}%")),
        ("allocated/block", f"{r['regs_alloc_per_block']} regs, {r['smem_alloc_per_block']} B smem (incl. reserve)"),
        ("limits (blocks/SM)", f"warps {fmt(lim['warps'])}, registers {fmt(lim['registers'])}, "
                               f"smem {fmt(lim['smem'])}, blocks {fmt(lim['blocks'])}"),
        ("blocks/SM", f"{r['blocks_per_sm']}  (limiter: {', '.join(r['limiters'])})"),
        ("warps/SM", f"{r['warps_per_sm']} / {r['max_warps_per_sm']}"),
        ("occupancy", f"{r['occupancy_pct']:.1f}%"),
        ("carveout", f"{r['carveout_kb']} KB of {r['smem_per_sm_available'] // 1024} KB"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def _add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--device", required=True, help="profile key or alias: h200, h100, a100, l40s, rtx4090, rtx5090, gb10")
    p.add_argument("--threads", type=int, required=True, help="threads per block")
    p.add_argument("--regs", type=int, required=True, help="registers per thread (ptxas 'Used N registers')")
    p.add_argument("--smem", type=int, required=True, help="shared memory per block in bytes (static + dynamic)")
    p.add_argument("--carveout", type=int, default=None, help="preferred shared-memory carveout in percent (0..100)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def register_cli(subparsers):
    """Add the ``occupancy`` subcommand to an argparse subparsers object (labkernels/cli.py calls this)."""
    p = subparsers.add_parser("occupancy", help="blocks/SM, warps, theoretical occupancy and the binding limit",
                              description=__doc__.split("\n\n")[0])
    _add_args(p)
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    """Handler of ``labkernels kernels occupancy``: prints the table (or JSON); exit code 2 on an impossible config."""
    try:
        r = occupancy(args.device, args.threads, args.regs, args.smem, args.carveout)
    except OccupancyError as e:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(e)}))
        else:
            print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(format_table(r))
    return 0


if __name__ == "__main__":
    _p = _add_args(argparse.ArgumentParser(prog="python -m labkernels.occupancy", description=__doc__.split("\n\n")[0]))
    sys.exit(main(_p.parse_args()))
