"""``benchmarks.gpu_index --profile``: each side runs once more under ``torch.profiler`` after its timed run, and the
report says where its time went (kernel kinds, how busy the device was, the matmuls' rate, the MFU ceiling). On the
CPU with the tiny tower; the kernel names of a CUDA run are read by the same rules, checked here on real names."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmarks import gpu_index
from benchmarks.gpu_profile import KINDS, kernel_kind, summarize

# kernel names as torch 2.11's profiler lists them on an H100 (cuBLAS / CUTLASS / nvjet GEMMs, torch's flash
# kernels, eager RMSNorm's pieces, Triton's fused kernels of a compiled layer) and operators of a CPU run
NAMES = {
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off": "matmul",
    "nvjet_hsh_256x128_64x4_2x1_v_bz_coopB_TNN": "matmul",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(Params)": "matmul",
    "aten::addmm": "matmul",
    "aten::mm": "matmul",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false>, true>(Flash_fwd_params)": (
        "attention"
    ),
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)>": (
        "reductions and norms"
    ),
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>": (
        "reductions and norms"
    ),
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "reductions and norms",
    "triton_poi_fused_cat_mul_neg_slice_1": "elementwise",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>": (
        "casts and copies"
    ),
    "Memcpy HtoD (Pageable -> Device)": "casts and copies",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>": "elementwise",
    "aten::silu": "elementwise",
    "aten::sum": "reductions and norms",
    "aten::nonzero": "other",
}


@pytest.mark.parametrize("name", list(NAMES))
def test_kernels_are_sorted_by_kind_from_their_names(name: str) -> None:
    assert kernel_kind(name) == NAMES[name]


def test_the_summary_reads_the_kinds_against_the_timed_run() -> None:
    breakdown = {
        "wall_seconds": 2.0,
        "kernel_seconds": 1.0,
        "kinds": {**dict.fromkeys(KINDS, 0.0), "matmul": 0.6, "attention": 0.2, "elementwise": 0.2},
        "top": [],
    }
    # 1.25 s unprofiled for these tokens: busy 80%; 6e14 Linear FLOPs over 0.6 s of matmuls = 1,000 TFLOP/s, half of
    # a 2,000 TFLOP/s peak; 8e14 forward FLOPs over the 0.8 s of matmul and attention: 1e15 FLOP/s, 50% of peak
    figures = summarize(breakdown, texts=10, seconds=1.25, linear_flops=6e14, forward_flops=8e14, peak=2e15)
    assert figures["busy"] == pytest.approx(0.8)
    assert figures["shares"]["matmul"] == pytest.approx(0.6) and sum(figures["shares"].values()) == pytest.approx(1)
    assert figures["matmul_tflops"] == pytest.approx(1000.0) and figures["matmul_of_peak"] == pytest.approx(0.5)
    assert figures["mfu_ceiling"] == pytest.approx(0.5)


def test_profile_reports_where_each_sides_time_goes(capsys, tmp_path: Path, sample_corpus_path: Path) -> None:
    doc = tmp_path / "gpu.md"
    args = ["--corpus", str(sample_corpus_path), "--limit", "40", "--batch-size", "16", "--rounds", "1"]
    code = gpu_index.main(
        [*args, "--profile", "12", "--profile-traces", str(tmp_path / "traces"), "--docs", str(doc), "--json"]
    )
    assert code == 0
    out, err = capsys.readouterr()
    (row,) = json.loads(out)["rows"]
    for label in ("index", "encode_document"):
        profile = row["sides"][label]["profile"]
        assert profile["texts"] == 12
        assert sum(profile["shares"].values()) == pytest.approx(1, abs=1e-3)
        # the tiny tower's Linear layers and attention run on the CPU's operators: both are seen
        assert profile["shares"]["matmul"] > 0 and profile["shares"]["attention"] > 0
        assert 0 < profile["busy"] <= 1 and profile["matmul_tflops"] > 0 and profile["mfu_ceiling"] > 0
        assert profile["top"] and profile["top"][0]["seconds"] > 0
        assert f"{label} profile: busy" in err
    text = doc.read_text()
    assert "Where the time goes" in text and "| `encode_document` | 12 |" in text
    traces = sorted((tmp_path / "traces").glob("*.json.gz"))
    assert [t.name for t in traces] == [
        f"{sample_corpus_path.name.replace('.', '-')}-{s}.json.gz" for s in ("encode-document", "index")
    ]
    events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
    assert any(str(e.get("name", "")).startswith("aten::") for e in events)


def test_no_profile_no_profile_figures(capsys, sample_corpus_path: Path) -> None:
    args = ["--corpus", str(sample_corpus_path), "--limit", "20", "--batch-size", "16", "--rounds", "1"]
    assert gpu_index.main([*args, "--no-write", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert all("profile" not in side for side in row["sides"].values())


def test_a_profiler_that_fails_costs_only_the_profile(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sample_corpus_path: Path
) -> None:
    """A device whose profiler cannot trace (CUPTI refused in a container, say): the side's timed figures and the
    sides after it stand, and the report says the profile failed and why."""
    from benchmarks import gpu_index_measure

    def refused(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES\nmore")

    monkeypatch.setattr(gpu_index_measure, "profile_run", refused)
    doc = tmp_path / "gpu.md"
    args = ["--corpus", str(sample_corpus_path), "--limit", "20", "--batch-size", "16", "--rounds", "1"]
    assert gpu_index.main([*args, "--profile", "8", "--docs", str(doc), "--json"]) == 0
    out, err = capsys.readouterr()
    (row,) = json.loads(out)["rows"]
    for label in ("index", "encode_document"):
        side = row["sides"][label]
        assert side["docs_per_second"] > 0 and "profile" not in side
        assert side["profile_error"] == "RuntimeError: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"
        assert f"{label} profile failed: RuntimeError" in err
    assert "| `index` | profile failed: RuntimeError: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES |" in doc.read_text()


def test_a_side_that_fails_costs_only_that_side(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sample_corpus_path: Path
) -> None:
    """On a lent GPU a side that raises (an op its compiler cannot take, say) is reported as failed, and the sides
    after it are still measured: a device call is not lost to one side."""
    from benchmarks import gpu_index_sides

    run_index = gpu_index_sides.run_index

    def failing_padded(*args: object, **encode: object) -> object:
        if encode.get("forward") == "padded":
            raise RuntimeError("an op the compiler cannot take\nmore")
        return run_index(*args, **encode)  # type: ignore[arg-type]

    monkeypatch.setattr(gpu_index_sides, "run_index", failing_padded)
    args = ["--corpus", str(sample_corpus_path), "--limit", "20", "--batch-size", "16", "--rounds", "1"]
    assert gpu_index.main([*args, "--sides", "index padded,index,encode_document", "--no-write", "--json"]) == 0
    out, err = capsys.readouterr()
    (row,) = json.loads(out)["rows"]
    assert row["sides"]["index padded"] == {"not_run": "failed: RuntimeError: an op the compiler cannot take"}
    assert row["sides"]["index"]["docs_per_second"] > 0 and row["sides"]["encode_document"]["docs_per_second"] > 0
    assert "index padded: not run: failed: RuntimeError" in err
