"""The occupancy calculator: profiles as data, the seeds' GB10 figures, impossible configs, and agreement with
CUDA's own header-only calculator (cuda_occupancy.h) on thousands of random configs per profile."""
import json
import math
import subprocess
import sys

import pytest

from labkernels import occupancy as O
from labkernels.testing import require_tool

PROFILES = sorted(O.load_profiles())
N_RANDOM = 4000  # random configs per profile checked against cuda_occupancy.h


# ------------------------------------------------------------------------------------------------ profiles

def test_profiles_cover_the_issue_devices():
    profs = O.load_profiles()
    for want in ("h100", "h200", "a100", "l40s", "rtx4090", "rtx5090", "gb10"):
        assert want in profs
    assert profs["h200"]["arch"] == "sm_90" and profs["h200"]["compute_capability"] == (9, 0)
    assert profs["a100"]["compute_capability"] == (8, 0)
    assert profs["l40s"]["compute_capability"] == profs["rtx4090"]["compute_capability"] == (8, 9)
    assert profs["rtx5090"]["compute_capability"] == (12, 0)
    assert profs["gb10"]["compute_capability"] == (12, 1)
    h = profs["h200"]
    assert (h["sm_count"], h["smem_per_sm"], h["smem_per_block_optin"], h["smem_reserved_per_block"]) == \
        (132, 228 * 1024, 227 * 1024, 1024)
    assert (h["max_warps_per_sm"], h["max_blocks_per_sm"], h["regs_per_sm"]) == (64, 32, 65536)
    g = profs["gb10"]
    assert (g["sm_count"], g["max_warps_per_sm"], g["smem_per_sm"], g["smem_per_block_optin"]) == \
        (48, 48, 100 * 1024, 99 * 1024)


@pytest.mark.parametrize("key", PROFILES)
def test_every_value_cites_a_known_source_and_is_consistent(key):
    p = O.load_profiles()[key]
    catalog = O.source_catalog()
    for field in O.ARCH_KEYS + ("sm_count",):
        srcs = p["sources"].get(field)
        assert srcs, f"{key}.{field} cites no source"
        assert all(s in catalog for s in srcs), f"{key}.{field}: unknown source in {srcs}"
    assert p["max_warps_per_sm"] * p["warp_size"] == p["max_threads_per_sm"]
    # the opt-in cap plus the driver's reserve is the whole carveout, which is the largest carveout step
    assert p["smem_per_block_optin"] + p["smem_reserved_per_block"] == p["smem_per_sm"]
    assert p["carveout_steps_kb"][-1] * 1024 == p["smem_per_sm"]
    assert list(p["carveout_steps_kb"]) == sorted(p["carveout_steps_kb"])
    assert p["reg_alloc_unit"] % p["warp_size"] == 0 and p["reg_alloc_granularity"] == "warp"


def test_disagreements_are_recorded():
    d = {x["value"]: x for x in O.disagreements()}
    blk = d["max_blocks_per_sm on sm_120 / sm_121"]
    assert blk["chosen"] == 24 and set(blk["claims"].values()) >= {24, 32}
    assert O.profile("rtx5090")["max_blocks_per_sm"] == O.profile("gb10")["max_blocks_per_sm"] == 24
    assert d["max_regs_per_thread"]["chosen"] == 255


@pytest.mark.parametrize("alias,key", [("h200", "h200"), ("H200", "h200"), ("H100", "h100"), ("h100-sxm5", "h100"),
                                       ("gb10", "gb10"), ("GB10", "gb10"), ("DGX Spark", "gb10"),
                                       ("RTX 4090", "rtx4090"), ("rtx_5090", "rtx5090"), ("a100", "a100"),
                                       ("L40S", "l40s"), ("sm_90", "h100"), ("sm_121", "gb10")])
def test_profile_aliases(alias, key):
    assert O.profile(alias)["key"] == key


def test_unknown_device_is_a_clear_error():
    with pytest.raises(O.OccupancyError, match="unknown device 'v100'.*h200"):
        O.profile("v100")


# ------------------------------------------------------------------------------------------------ the seeds

def test_seeds_gb10_kdr_cliff():
    """Seeds 002 section 2.3: 256 threads, 85 regs; KDR=4 29,696 B -> 2 blocks/SM (33.3%), KDR=8 59,392 B ->
    1 block/SM (16.7%)."""
    k4 = O.occupancy("gb10", 256, 85, 29696)
    k8 = O.occupancy("gb10", 256, 85, 59392)
    assert (k4["blocks_per_sm"], k4["warps_per_sm"]) == (2, 16)
    assert (k8["blocks_per_sm"], k8["warps_per_sm"]) == (1, 8)
    assert k4["occupancy_pct"] == pytest.approx(33.33, abs=0.01)
    assert k8["occupancy_pct"] == pytest.approx(16.67, abs=0.01)
    # KDR=8 falls off the smem cliff; at 85 registers KDR=4 is already register-bound at 2 (smem alone allows 3)
    assert k8["limiter"] == "smem" and k8["limits"]["smem"] == 1
    assert k4["limiter"] == "registers" and k4["limits"]["smem"] == 3
    assert k4["smem_alloc_per_block"] == 29696 + 1024 and k8["smem_alloc_per_block"] == 59392 + 1024


def test_seeds_gb10_warp_ceiling():
    """r40: 3 blocks x 8 warps = 24 theoretical warps; 18.12 achieved warps/SM = 37.74% -> 48 warps/SM."""
    implied = O.max_warps_from_achieved(18.12, 37.74)
    assert implied == pytest.approx(48.0, abs=0.05)
    assert O.profile("gb10")["max_warps_per_sm"] == round(implied)
    # the 3-block state of r40 is reachable at KDR=4 once registers fit (<= 80 regs), and its 24 warps are 50%
    r = O.occupancy("gb10", 256, 80, 29696)
    assert (r["blocks_per_sm"], r["warps_per_sm"], r["occupancy_pct"]) == (3, 24, 50.0)
    assert 18.12 / r["max_warps_per_sm"] == pytest.approx(0.3774, abs=5e-4)


def test_h200_seed_configs():
    k4 = O.occupancy("h200", 256, 85, 29696)
    k8 = O.occupancy("h200", 256, 85, 59392)
    # on H200 the 85-register budget binds first: no KDR cliff at 2 blocks/SM (smem allows 7 and 3)
    for r, smem_lim in ((k4, 7), (k8, 3)):
        assert (r["blocks_per_sm"], r["warps_per_sm"], r["occupancy"], r["limiter"]) == (2, 16, 0.25, "registers")
        assert r["limits"] == {"warps": 8, "registers": 2, "smem": smem_lim, "blocks": 32}
        assert r["regs_alloc_per_block"] == 88 * 32 * 8  # 85 -> 88 regs/thread (256 per warp)
    assert O.occupancy("h200", 256, 64, 59392)["blocks_per_sm"] == 3  # with 64 regs smem binds at 3
    assert O.occupancy("h200", 256, 64, 59392)["limiter"] == "smem"


def test_carveout_handling():
    # default: the whole 228 KB is available; the driver's carveout is the smallest step holding the blocks
    r = O.occupancy("h200", 256, 32, 29696)
    assert r["blocks_per_sm"] == 7 and r["limiter"] == "smem" and r["carveout_kb"] == 228
    r = O.occupancy("h200", 256, 85, 29696)
    assert r["carveout_kb"] == 64  # 2 x 30 KB fit the 64 KB step
    # explicit preference: 50% of 228 KB = 114 KB -> 132 KB step -> 4 blocks of 30 KB
    r = O.occupancy("h200", 256, 32, 29696, carveout=50)
    assert (r["smem_per_sm_available"], r["blocks_per_sm"]) == (132 * 1024, 4)
    # a preference below one block's need is a hint, never a failure: the step that holds one block is used
    r = O.occupancy("h200", 256, 32, 29696, carveout=0)
    assert (r["smem_per_sm_available"], r["blocks_per_sm"]) == (32 * 1024, 1)
    assert O.occupancy("h200", 256, 32, 29696, carveout=-1)["blocks_per_sm"] == 7


def test_limiter_names_cover_each_resource():
    assert O.occupancy("h200", 1024, 16, 0)["limiter"] == "warps"          # 2 blocks of 32 warps
    assert O.occupancy("h200", 256, 128, 0)["limiter"] == "registers"      # 2 blocks
    assert O.occupancy("h200", 128, 32, 100_000)["limiter"] == "smem"      # 2 blocks
    assert O.occupancy("h200", 32, 16, 0)["limiter"] == "blocks"           # 32 blocks of 1 warp
    r = O.occupancy("gb10", 64, 16, 0)                                     # 24 blocks x 2 warps = 48 warps
    assert r["blocks_per_sm"] == 24 and r["limiters"] == ["warps", "blocks"]


# ------------------------------------------------------------------------------------------------ impossible

@pytest.mark.parametrize("device", ["h200", "gb10", "a100"])
def test_impossible_configs_raise(device):
    p = O.profile(device)
    with pytest.raises(O.OccupancyError, match="threads_per_block=1025.*1..1024"):
        O.occupancy(device, 1025, 32, 0)
    with pytest.raises(O.OccupancyError, match="threads_per_block=0"):
        O.occupancy(device, 0, 32, 0)
    with pytest.raises(O.OccupancyError, match=f"opt-in cap.*{p['smem_per_block_optin']} B"):
        O.occupancy(device, 256, 32, p["smem_per_block_optin"] + 1)
    O.occupancy(device, 256, 32, p["smem_per_block_optin"])  # exactly the cap is fine (1 block)
    with pytest.raises(O.OccupancyError, match="regs_per_thread=256.*0..255"):
        O.occupancy(device, 256, 256, 0)
    with pytest.raises(O.OccupancyError, match="regs_per_thread=-1"):
        O.occupancy(device, 256, -1, 0)
    with pytest.raises(O.OccupancyError, match="exceed the 65536 registers per block"):
        O.occupancy(device, 1024, 65, 0)  # 65 -> 72 regs x 1024 threads = 73,728
    with pytest.raises(O.OccupancyError, match="carveout=101"):
        O.occupancy(device, 256, 32, 0, carveout=101)
    with pytest.raises(O.OccupancyError, match="must be an integer"):
        O.occupancy(device, 256.5, 32, 0)
    assert issubclass(O.OccupancyError, ValueError)


# ------------------------------------------------------------------------------------------------ CLI

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "labkernels.occupancy", *args], capture_output=True, text=True)


@pytest.mark.parametrize("device,blocks,warps,occ,limiter", [("h200", 2, 16, 0.25, "registers"),
                                                              ("gb10", 2, 16, 1 / 3, "registers")])
def test_cli_json(device, blocks, warps, occ, limiter):
    r = _cli("--device", device, "--threads", "256", "--regs", "85", "--smem", "29696", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["blocks_per_sm"], out["warps_per_sm"], out["limiter"]) == (blocks, warps, limiter)
    assert math.isclose(out["occupancy"], occ)


def test_cli_table_and_error():
    r = _cli("--device", "gb10", "--threads", "256", "--regs", "85", "--smem", "59392")
    assert r.returncode == 0 and "blocks/SM" in r.stdout and "16.7%" in r.stdout and "smem" in r.stdout
    r = _cli("--device", "h200", "--threads", "256", "--regs", "85", "--smem", str(228 * 1024))
    assert r.returncode == 2 and "opt-in cap" in r.stderr
    r = _cli("--device", "h200", "--threads", "2048", "--regs", "85", "--smem", "0", "--json")
    assert r.returncode == 2 and "1..1024" in json.loads(r.stdout)["error"]


def test_register_cli_wires_a_subcommand():
    import argparse

    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command")
    O.register_cli(sub)
    args = ap.parse_args(["occupancy", "--device", "h200", "--threads", "256", "--regs", "85", "--smem", "59392",
                          "--carveout", "100"])
    assert args.func is O.main and args.carveout == 100


# ------------------------------------------------------------------------------------------------ cuda_occupancy.h

def _random_configs(rng, p, n):
    """A grid of random configs that reaches every limit and every error path of the calculator."""
    optin = p["smem_per_block_optin"]
    out = []
    for _ in range(n):
        u = rng.random()
        if u < 0.35:
            T = int(rng.integers(1, 1025))
        elif u < 0.75:
            T = 32 * int(rng.integers(1, 33))
        elif u < 0.95:
            T = int(rng.choice([32, 64, 96, 128, 192, 256, 384, 512, 768, 1024]))
        else:
            T = int(rng.integers(1025, 1300))
        u = rng.random()
        R = int(rng.integers(0, 256)) if u < 0.5 else int(rng.integers(16, 129)) if u < 0.93 else \
            int(rng.choice([0, 1, 255]))
        u = rng.random()
        if u < 0.35:
            S = int(rng.integers(0, optin + 1))
        elif u < 0.65:
            S = int(rng.integers(0, 49153))
        elif u < 0.75:
            S = 0
        elif u < 0.85:
            S = int(rng.integers(optin - 4096, optin + 4097))
        else:
            S = 1024 * int(rng.integers(0, optin // 1024 + 2))
        u = rng.random()
        C = None if u < 0.7 else -1 if u < 0.75 else int(rng.integers(0, 101))
        static = int(rng.integers(0, min(S, 49152) + 1)) if rng.random() < 0.3 else 0
        out.append({"threads": T, "regs": R, "static_smem": static, "dynamic_smem": S - static, "carveout": C})
    return out


@pytest.mark.nvcc
@pytest.mark.parametrize("key", PROFILES)
def test_agrees_with_cuda_occupancy_h(key, rng):
    require_tool("nvcc")
    p = O.load_profiles()[key]
    cfgs = _random_configs(rng, p, N_RANDOM)
    ref = O.cuda_occ_reference_full(key, cfgs)
    n_ok, limiters = 0, set()
    for c, r in zip(cfgs, ref):
        smem = c["static_smem"] + c["dynamic_smem"]
        where = f"{key} {c} -> cuda_occupancy.h {r}"
        try:
            mine = O.occupancy(key, c["threads"], c["regs"], smem, c["carveout"])
        except O.OccupancyError:
            # impossible here <=> the header launches nothing (or rejects the input)
            assert r["err"] != 0 or r["blocks_per_sm"] == 0, where
            continue
        assert r["err"] == 0, where
        assert mine["blocks_per_sm"] == r["blocks_per_sm"], where
        assert mine["limits"] == r["limits"], where
        assert mine["smem_alloc_per_block"] == r["smem_alloc_per_block"], where
        assert mine["regs_alloc_per_block"] == r["regs_alloc_per_block"], where
        n_ok += 1
        limiters.add(mine["limiter"])
    # the grid exercised the calculator: most configs launch, and every resource binds somewhere
    assert n_ok > N_RANDOM // 2
    assert limiters == {"warps", "registers", "smem", "blocks"}, limiters


@pytest.mark.nvcc
def test_reference_blocks_for_the_seed_configs():
    require_tool("nvcc")
    assert O.cuda_occ_reference("gb10", [(256, 85, 29696), (256, 85, 59392), (256, 80, 29696)]) == [2, 1, 3]
    assert O.cuda_occ_reference("h200", [(256, 85, 29696), (256, 85, 59392), (256, 64, 59392, 50)]) == [2, 2, 2]


@pytest.mark.nvcc
def test_the_one_deliberate_difference_256_registers():
    """cuda_occupancy.h accepts 256 registers/thread (cudaOccRegAllocationMaxPerThread); ptxas caps at 255."""
    require_tool("nvcc")
    assert O.cuda_occ_reference("h200", [(256, 256, 0)]) == [1]
    with pytest.raises(O.OccupancyError):
        O.occupancy("h200", 256, 256, 0)


@pytest.mark.nvcc
def test_harness_pins_the_header_constants():
    """The agreement is not vacuous: a profile with the guide table's 32 blocks/SM for sm_12x disagrees with
    cuda_occupancy.h on 1-warp blocks."""
    require_tool("nvcc")
    cfgs = [(32, 16, 0), (32, 32, 1024), (64, 16, 0)]
    ref = O.cuda_occ_reference("rtx5090", cfgs)
    assert ref == [24, 24, 24]
    p32 = O.profile("rtx5090")
    p32["max_blocks_per_sm"] = 32
    assert [O.occupancy(p32, *c)["blocks_per_sm"] for c in cfgs] == [32, 32, 24]
    assert [O.occupancy("rtx5090", *c)["blocks_per_sm"] for c in cfgs] == ref


# measured on the lab's lent H200 (driver 580.159.04) with cudaOccupancyMaxActiveBlocksPerMultiprocessor on
# mma_probe_kernel<16> (40 regs) / <32> (44 regs): (threads, regs, dynamic smem, carveout, blocks/SM). The full
# 960-query sweep (8 block sizes x 15 smem sizes x 4 carveouts x 2 kernels) matched; this is a sample of it.
H200_RUNTIME = [
    (32, 40, 0, -1, 32), (32, 40, 8192, -1, 25), (64, 40, 0, -1, 24), (32, 40, 0, 0, 8), (192, 40, 0, 0, 8),
    (32, 40, 0, 50, 32), (32, 40, 8192, 50, 14), (64, 40, 0, 50, 24), (32, 40, 8192, 100, 25),
    (128, 40, 29696, -1, 7), (256, 40, 29696, -1, 6), (256, 40, 59392, -1, 3), (256, 40, 100000, -1, 2),
    (256, 40, 116736, -1, 1), (256, 40, 232448, -1, 1), (256, 40, 29696, 0, 1), (256, 40, 29696, 50, 4),
    (256, 44, 59392, 50, 2), (256, 44, 29696, 100, 5),
]


@pytest.mark.parametrize("threads,regs,smem,carveout,blocks", H200_RUNTIME)
def test_matches_the_h200_runtime(threads, regs, smem, carveout, blocks):
    assert O.occupancy("h200", threads, regs, smem, carveout)["blocks_per_sm"] == blocks
