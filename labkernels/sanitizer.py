"""compute-sanitizer over a driver script, one tool at a time, and what its report says.

Every sanitizer step of ``labkernels gpu check`` (the machine-wide ``sanitizer``, round 7's ``wgmma_sanitizer``,
round 9's ``gemv_sanitizer``) runs :func:`run_tool`. The tool's exit code alone cannot tell a kernel's fault from
host noise: memcheck also reports failed CUDA API calls, and cuda-bindings resolves the driver's entry points with
``cuGetProcAddress``, which answers ``CUDA_ERROR_INVALID_VALUE`` for a symbol the installed driver lacks (34 such
reports in round 9's gemv sanitizer run on an H100 with driver 580, and not one device-side finding). :func:`findings`
parses the report into its records and classes them; a tool is clean when every error it counted is such a probe
(the count is recorded beside the verdict), never by switching the API reports off.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "synccheck")

#: driver entry-point lookups that cuda-bindings makes for every symbol it may bind, answered with one of
#: :data:`PROBE_ERRORS` where this driver lacks the symbol: host noise, not a finding
PROBE_API_CALLS = ("cuGetProcAddress", "cuGetProcAddress_v2")
PROBE_ERRORS = ("CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_NOT_FOUND")

_PREFIX = "========= "
_API_RX = re.compile(r"Program hit (CUDA_ERROR_\w+) \(error \d+\) due to .* on CUDA API call to (\w+)\.?")
_ERR_SUMMARY_RX = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY_RX = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")


class SanitizerError(RuntimeError):
    """A report that cannot be read as compute-sanitizer's (no summary line where the tool always prints one)."""


def records_of(text: str) -> list[str]:
    """The report's records: each starts at a ``========= `` line that is not indented (a frame or a detail line of
    the record above is), with its detail lines folded into it; the banner and summaries are records too."""
    out: list[str] = []
    for ln in text.splitlines():
        if not ln.startswith(_PREFIX.rstrip()):
            continue
        body = ln[len(_PREFIX):] if ln.startswith(_PREFIX) else ""
        if not body.strip():
            continue
        if body.startswith(" ") and out:           # an indented detail: part of the record above
            out[-1] += "\n" + body.strip()
        else:
            out.append(body.strip())
    return out


def findings(text: str, tool: str) -> dict:
    """Classify a compute-sanitizer report of ``tool``: ``errors`` (the tool's own count: ERROR SUMMARY, or
    racecheck's error hazards; its warnings in ``warnings``, not failing, as the tool's exit code), ``probe_api_errors`` (failed cuGetProcAddress lookups, :data:`PROBE_API_CALLS`),
    ``api_errors`` (other failed API calls, by call), ``device`` (the first line of each other record: an invalid
    access, a race, a barrier fault, ...), ``clean`` (the tool counted nothing but probes). Raises
    :class:`SanitizerError` if the report has no summary line."""
    if tool not in TOOLS:
        raise ValueError(f"unknown compute-sanitizer tool {tool!r} (known: {', '.join(TOOLS)})")
    probes, api, device, errors, warnings = 0, {}, [], None, 0
    for rec in records_of(text):
        head = rec.splitlines()[0]
        if head == "COMPUTE-SANITIZER":
            continue
        m = _ERR_SUMMARY_RX.search(head)
        if m:
            errors = int(m.group(1))
            continue
        m = _RACE_SUMMARY_RX.search(head)
        if m:
            errors, warnings = int(m.group(2)), int(m.group(3))   # the hazards displayed are errors + warnings
            continue
        m = _API_RX.search(head)
        if m:
            err, call = m.groups()
            if call in PROBE_API_CALLS and err in PROBE_ERRORS:
                probes += 1
            else:
                api[f"{call}: {err}"] = api.get(f"{call}: {err}", 0) + 1
            continue
        if tool == "racecheck" and head.startswith("Warning"):
            continue                        # a racecheck warning record: counted in its summary's warnings
        device.append(head)
    if errors is None:
        raise SanitizerError(f"compute-sanitizer {tool}: no summary line in its report "
                             f"(last line: {text.strip().splitlines()[-1:] or ['(empty)']})")
    clean = not api and not device and errors == probes
    return {"errors": errors, "warnings": warnings, "probe_api_errors": probes, "api_errors": api, "device": device[:20],
            "device_count": len(device), "clean": clean}


def run_tool(tool: str, argv: list[str], out_file: Path, *, cwd: Path, timeout: float,
             options: tuple[str, ...] = ()) -> dict:
    """Run ``compute-sanitizer --tool=TOOL [options] ARGV`` (exit code 9 on any error it reports), keep its whole
    report in ``out_file`` and return rc, summary, seconds, :func:`findings` and ``ok``: the run finished and
    :func:`findings` is clean (an exit code 9 whose every error is a probe is ok, and says so in ``note``)."""
    if tool not in TOOLS:
        raise ValueError(f"unknown compute-sanitizer tool {tool!r} (known: {', '.join(TOOLS)})")
    cmd = ["compute-sanitizer", f"--tool={tool}", "--error-exitcode=9", *options, *argv]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        text, rc = r.stdout + r.stderr, r.returncode
    except FileNotFoundError:
        text, rc = "compute-sanitizer not found", 127
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        text, rc = f"timeout after {timeout} s\n{out}", 124
    Path(out_file).write_text(text)
    summary = [ln for ln in text.splitlines() if "SUMMARY" in ln]
    res = {"rc": rc, "summary": summary[-1] if summary else (text.strip().splitlines()[-1:] or [""])[0],
           "seconds": round(time.time() - t0, 1)}
    if rc in (0, 9):
        try:
            f = findings(text, tool)
        except SanitizerError as e:
            res.update(ok=False, note=str(e))
            return res
        res.update(f)
        res["ok"] = f["clean"]
        if f["clean"] and f["probe_api_errors"]:
            res["note"] = (f"{f['probe_api_errors']} failed cuGetProcAddress lookups (cuda-bindings probing the "
                           f"driver's entry points), no other finding")
        elif not f["clean"]:
            res["note"] = "; ".join([*(f"{k} x{v}" for k, v in f["api_errors"].items()), *f["device"][:3]])
    else:
        res["ok"] = False
        res["note"] = {124: "timed out", 127: "compute-sanitizer not found"}.get(rc, f"exit code {rc}")
    return res


def line(tool: str, res: dict) -> str:
    """One log line for a tool's result."""
    extra = f" -- {res['note']}" if res.get("note") else ""
    return f"compute-sanitizer {tool}: {'clean' if res['ok'] else 'NOT CLEAN'} (rc={res['rc']}, {res['summary']}){extra}"
