"""Paper-grade tables (labkernels.report.table), readable kernel names and paths, stable variant colours."""
import numpy as np
import pandas as pd
import pytest

from labkernels import plotting, report
from labkernels.paths import REPO_ROOT


def test_kernel_names_are_demangled():
    assert report.kernel_name("_Z13q4k_nb_kernelILi4EEvPKhS1_PKjPfiii") == "q4k_nb_kernel<4>"
    assert report.kernel_name("_Z15q6k_expb_kernelILi4ELi210ELi0ELi2EEvPKhS1_PKjPfiii") == "q6k_expb_kernel<4, 210, 0, 2>"
    long = "_ZN7cutlass7Kernel2I55cutlass_75_tensorop_f16_s1688gemm_f16_128x128_nt_align1EEvNT_6ParamsE"
    assert report.kernel_name(long) == "cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_128x128_nt_align1>"
    assert report.kernel_name("_Z13q4k_nb_kernelILi4EEvPKhS1_PKjPfiii", signature=True).endswith("int, int, int)")
    assert report.kernel_name("q6k_expb[KDR=4]") == "q6k_expb[KDR=4]"  # not mangled: unchanged
    assert report.kernel_name("_Zgarbage!") == "_Zgarbage!"
    # cut short by the profiler: read as far as it goes
    cut = "_ZN7cutlass7Kernel2I55cutlass_75_tensorop_f16_s1688gemm_f16_"
    assert report.kernel_name(cut) == "cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_…>"
    cell = report._clean_text("cupy_copy; _Z14rmsnorm_kernelILi1EEvPKfS1_Pfif; " + cut)
    assert cell == "cupy_copy; rmsnorm_kernel<1>; cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_…>"


def test_paths_are_repository_relative():
    assert report.relative_path(str(REPO_ROOT / "data" / "models" / "m.gguf")) == "data/models/m.gguf"
    assert report.relative_path("/somewhere/else/model.gguf") == "model.gguf"
    assert report.relative_path("not/a/path") == "not/a/path"


def test_table_formats_counts_floats_nan_names_and_hides_the_index():
    df = pd.DataFrame({"kernel": ["_Z13q4k_nb_kernelILi4EEvPKhS1_PKjPfiii", "plain"],
                       "launches": [2510042.0, 3.0],           # counts stored as floats
                       "us": [12.3456, np.nan],                 # a missing value
                       "od": [4096, 11008], "share": [0.5, 0.25], "ok": [True, False],
                       "path": [str(REPO_ROOT / "data" / "x.csv"), "-"]})
    html = report.table(df, percent=("share",)).to_html()
    assert "2,510,042" in html and "2510042.0" not in html
    assert "12.35" in html and "nan" not in html.lower().replace("nan-", "") and "—" in html
    assert ">4096<" in html and ">11008<" in html  # sizes without thousands separators
    assert "q4k_nb_kernel&lt;4&gt;" in html and "_Z13" not in html
    assert "50.0%" in html and "yes" in html and "data/x.csv" in html and str(REPO_ROOT) not in html
    assert "row_heading" not in html  # index hidden
    assert "launches" in html and "<th" in html


def test_transposed_tables_keep_the_index_and_format_each_row():
    t = pd.DataFrame({"a": [1234567.0, 0.123], "b": [7654321.0, 0.456]}, index=["inst", "ratio"])
    html = report.table(t, index=True).to_html()
    assert "1,234,567" in html and "0.123" in html and "inst" in html


def test_number_format_by_magnitude():
    assert report.number_format([1.0, 2.0, 30.0]) == "{:,.0f}"
    assert report.number_format([1234.5]) == "{:,.0f}"
    assert report.number_format([123.45]) == "{:,.1f}"
    assert report.number_format([1.2345]) == "{:,.2f}"
    assert report.number_format([0.00264, 0.923]) == "{:.3g}"
    assert report.number_format([0.94, 0.923]) == "{:.3f}"
    assert report.number_format([1e-7, 0.5]) == "{:.2e}"


def test_variant_colours_are_stable_and_distinct():
    assert plotting.color("q6k_expb_epi0") == plotting.color("expb_epi0")  # round 6 and round 3 agree
    assert plotting.color("q6k_generic") == plotting.color("generic")
    assert plotting.color("EPI=0,OCC=2") == plotting.color("expb_epi0")
    four = [plotting.color(v) for v in ("EPI=0,OCC=1", "EPI=0,OCC=2", "EPI=1,OCC=1", "EPI=1,OCC=2")]
    assert len(set(four)) == 4
    assert plotting.color("new-thing") == plotting.color("new-thing")


def test_notes_travel_in_display_metadata(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, metadata=None: shown.append(metadata))
    report.setup()
    report.resolve_mode("cpu")
    report.headline(x=1.23456)
    report.headline(b=2, a=1)
    assert shown[-1] == {"labkernels": {"mode": "cpu", "headline": [["x", "1.235"], ["b", "2"], ["a", "1"]]}}


def test_source_names_gpu_run_and_commit():
    from types import SimpleNamespace

    from labkernels import report

    r = SimpleNamespace(run_id="20261201T000000Z-h200-abc", provenance={"gpu": {"name": "NVIDIA H200"},
                                                                          "git_commit": "0123456789abcdef"})
    assert report.source(r) == "NVIDIA H200, run 20261201T000000Z-h200-abc, commit 0123456789"
    assert report.source(SimpleNamespace(run_id="x", provenance={})) == "no GPU recorded, run x, commit ?"


def test_launch_speedups_draws_a_strip_per_launch_and_type():
    """The A/B figure of round 7's later steps: one x tick per (launch, weight type) present, labelled with the
    launch on two lines, the 1.0 line, the y label given, every point drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkernels import plotting

    t = pd.DataFrame({"qtype": ["q4_K", "q4_K", "q6_K"], "nt": [512, 4096, 512],
                      "launch": ["BN=128 data-par.", "BN=128 data-par.", "BN=256 stream-K"], "gain": [1.1, 1.05, 0.99]})
    fig, ax = plt.subplots()
    plotting.launch_speedups(ax, t, "gain", "title", "speedup (old time / new time)")
    assert [x.get_text() for x in ax.get_xticklabels()] == ["BN=128\ndata-par.\nq4_K", "BN=256\nstream-K\nq6_K"]
    assert ax.get_ylabel() == "speedup (old time / new time)"
    assert sum(len(c.get_offsets()) for c in ax.collections) == 3
    plt.close(fig)


def test_ceiling_bars_take_the_fastest_launch_per_point():
    """The eleventh step's figure: per (type, shape) at the nt asked, the launch whose plain build is fastest, three
    bars (plain, no loads, no conversion), the launch named in the tick, the 1.0 line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkernels import plotting

    t = pd.DataFrame({"qtype": ["q4_K", "q4_K", "q6_K", "q4_K"], "od": [4096] * 4, "id": [4096] * 4,
                      "nt": [512, 512, 512, 4096], "launch": ["BN=128 data-par.", "BN=256 stream-K", "BN=256 tile split",
                                                              "BN=256 data-par."],
                      "plain_vs_cublas": [0.86, 0.77, 0.75, 0.93], "noload_vs_cublas": [0.88, 0.8, 0.81, 0.95],
                      "noconv_vs_cublas": [1.05, 0.84, 0.85, 1.01]})
    fig, ax = plt.subplots()
    plotting.ceiling_bars(ax, t, nt=512)
    assert [x.get_text() for x in ax.get_xticklabels()] == ["q4_K\n4096x4096\nBN=128 data-par.",
                                                           "q6_K\n4096x4096\nBN=256 tile split"]
    hs = sorted(round(p.get_height(), 2) for p in ax.patches)
    assert hs == [0.75, 0.81, 0.85, 0.86, 0.88, 1.05]
    assert any(list(l.get_ydata()) == [1, 1] for l in ax.get_lines())
    plt.close(fig)


def test_step_head_needs_its_prediction_measurement_and_verdict(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, metadata=None: shown.append(obj.data))
    from labkernels.rounds.r07_wgmma import ledger

    s = ledger.step(28)
    report.step(s)
    assert "predicted (before the run)" in shown[-1] and s.runs in shown[-1] and "verdict" in shown[-1]
    with pytest.raises(report.LeadError, match="verdict"):
        report.step(prediction="x", measured="y")
    assert [x.number for x in ledger.STEPS if isinstance(x.number, int)] == list(range(1, 29))
    with pytest.raises(KeyError, match="no step 29"):
        ledger.step(29)


def test_slim_tables_keeps_the_numeric_class_only():
    from labkernels import pipeline

    html = report.table(pd.DataFrame({"a": ["x"], "n": [1.5]})).to_html()
    slim = pipeline.slim_tables(html)
    assert 'class="num"' in slim and "row0" not in slim and "col_heading" not in slim and ">1.50<" in slim
