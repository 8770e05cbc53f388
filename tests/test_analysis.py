import pandas as pd

from labkernels import analysis


def test_summarize_and_pairs():
    rows = []
    for p, (ta, tb) in enumerate([(10.0, 5.0), (11.0, 5.5), (9.0, 6.0)]):
        for v, t in (("a", ta), ("b", tb)):
            rows.append({"od": 8, "id": 256, "nt": 4, "variant": v, "pair": p, "median_us": t, "p20_us": t - 1,
                         "p80_us": t + 1, "gmac": 8 * 256 * 4 / 1e9})
    s = analysis.summarize(pd.DataFrame(rows)).set_index("variant")
    assert s.loc["a", "median_us"] == 10.0 and abs(s.loc["a", "spread"] - 11 / 9) < 1e-12
    assert s.loc["b", "p20_us"] == 4.0 and s.loc["b", "p80_us"] == 7.0
    assert abs(s.loc["b", "tops_eq"] - 2 * 8 * 256 * 4 / 5.5e-6 / 1e12) < 1e-9
    pairs = pd.DataFrame([{"a": "a", "b": "b", "od": 8, "id": 256, "nt": 4, "pair": p, "ratio": ta / tb}
                          for p, (ta, tb) in enumerate([(10, 5), (11, 5.5), (9, 6)])])
    ps = analysis.pair_summary(pairs).iloc[0]
    assert ps.pairs_b_faster == "3/3" and ps.median_ratio == 2.0 and ps.min_ratio == 1.5
