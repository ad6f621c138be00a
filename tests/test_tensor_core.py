"""The Tensor Core name taxonomy: every rule on real kernel names, order, and negatives."""

from __future__ import annotations

import polars as pl
import pytest

from nsysan.passes import tensor_core as tc

# (kernel name as nsys exports it, expected verdict, expected rule)
CASES = [
    # Volta / Turing / Ampere cuBLAS and cuDNN legacy names: the MMA shape is in the name
    ("volta_h884gemm_64x64_ldg8_nn", True, "mma_shape_gemm"),
    ("volta_s884gemm_fp16_128x128_ldg8_f2f_nn", True, "mma_shape_gemm"),
    ("turing_h1688gemm_256x128_ldg8_tn", True, "mma_shape_gemm"),
    ("turing_fp16_s1688cudnn_fp16_128x128_ldg8_relu_f2f_exp_interior_nhwc2nchw_tn_v1", True,
     "mma_shape_gemm"),
    ("ampere_h16816gemm_128x128_ldg8_stages_64x3_nn", True, "mma_shape_gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_nn", True, "mma_shape_gemm"),
    ("trt_ampere_h16816gemm_64x64_ldg8_relu_stages_64x5_tn_v1", True, "mma_shape_gemm"),
    # xmma (cuDNN / cuBLAS / TensorRT) flat names
    ("sm80_xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_"
     "stage3_warpsize4x1x1_g1_tensor16x8x16_execute_kernel_cudnn", True, "xmma_tensor_shape"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_"
     "segment_k_off_kernel__5x_cublas", True, "xmma_gemm_conv"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_"
     "alignc4_execute_kernel__5x_cublas", False, "simt_cutlass_xmma"),
    ("sm50_xmma_pooling_coalescedC_NHWC_kMAX_3_False_execute_kernel_trt", False,
     "pre_volta_xmma"),
    # xmma templated names: the MMA instruction is in the traits
    ("void xmma_cudnn::gemm::kernel<xmma_cudnn::implicit_gemm::fprop_indexed::Kernel_traits<"
     "xmma_cudnn::Ampere_hmma_tf32_traits<unsigned int, float>, xmma_cudnn::Cta_tile<"
     "xmma_cudnn::Ampere, (int)128>>>(T1::Params)", True, "mma_instruction"),
    ("void xmma_cudnn::implicit_gemm::strided_dgrad_indexed::kernel_helper_stage_0<"
     "xmma_cudnn::implicit_gemm::strided_dgrad_indexed::Kernel_traits<"
     "xmma_cudnn::Ampere_hmma_fp32_traits>>(T1::Params)", None, "xmma_helper"),
    ("void xmma_cudnn::gemm::split_k_kernel<xmma_cudnn::implicit_gemm::wgrad_indexed::"
     "Kernel_traits<xmma_cudnn::Ampere_hmma_tf32_traits<unsigned int, float>>>(T1::Params)",
     None, "xmma_split_k"),
    ("void cask_cudnn::computeOffsetsKernel<(bool)0, (bool)0>(cask_cudnn::ComputeOffsetsParams)",
     False, "cudnn_offsets"),
    # CUTLASS 2.x and 3.x
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_16x5_nn_align4>(T1::Params)",
     True, "tensorop"),
    ("void cutlass_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_128x64_16x6_nhwc>"
     "(T1::Params)", True, "tensorop"),
    ("void cutlass::Kernel<cutlass_80_simt_sgemm_128x128_8x5_nn_align1>(T1::Params)", False,
     "simt_cutlass_xmma"),
    ("void cutlass::Kernel2<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::threadblock::"
     "MmaMultistage<cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80>>>(T1::Params)", True,
     "tensorop"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::"
     "collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<(int)4>, "
     "cute::SM90_64x128x16_F32BF16BF16_SS<>>>>(T1::Params)", True, "sm90_sm100_mma"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::"
     "collective::CollectiveMma<cutlass::gemm::MainloopSm100TmaUmmaWarpSpecialized<(int)4>>>>"
     "(T1::Params)", True, "sm90_sm100_mma"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_cga1x1x1"
     "_kernel0_0", True, "sm90_sm100_mma"),
    # cuBLASLt Hopper / Blackwell
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", True, "cublaslt_nvjet"),
    ("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NNN", True, "cublaslt_nvjet"),
    # fused attention
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, (int)4, "
     "(bool)0, (bool)0, cutlass::bfloat16_t>>(Flash_fwd_params)", True, "flash_attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<"
     "(int)64>>(Flash_bwd_params)", True, "flash_attention"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
     "cutlass::arch::Sm80, (bool)1>::Params)", True, "flash_attention"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm75(PyTorchMemEffAttention::AttentionKernel<"
     "cutlass::half_t, cutlass::arch::Sm75, (bool)1>::Params)", True, "flash_attention"),
    ("fmha_cutlassB_f32_aligned_64x64_k64_sm75(PyTorchMemEffAttention::AttentionBackwardKernel<"
     "cutlass::arch::Sm75, float>::Params)", False, "simt_fmha_f32"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm50(PyTorchMemEffAttention::AttentionKernel<"
     "cutlass::half_t, cutlass::arch::Sm50>::Params)", False, "simt_fmha_sm50"),
    # explicit negatives: FP32 SIMT GEMM / convolution
    ("ampere_sgemm_32x32_sliced1x4_tn", False, "simt_gemm_conv"),
    ("volta_sgemm_128x64_nn", False, "simt_gemm_conv"),
    ("ampere_scudnn_128x32_relu_small_nn_v1", False, "simt_gemm_conv"),
    ("void cudnn::detail::implicit_convolve_sgemm<float, float, (int)1024>(int, int)", False,
     "simt_gemm_conv"),
    ("void gemmSN_NN_kernel<float, (int)128, cublasGemvTensorStridedBatched<const float>>"
     "(cublasGemmSmallNParams<T8, T9, T1>)", False, "simt_gemm_conv"),
    ("void gemv2T_kernel_val<int, int, float2, float2, float2, (int)128>(T11)", False,
     "simt_gemv"),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(Params)", False,
     "simt_winograd"),
    ("void convolveNd_dgrad_float_engine<float, (int)3, (int)512>(int, int, int)", False,
     "simt_conv_engine"),
    ("void fft2d_r2c_32x32<float, (bool)0, (unsigned int)1, (bool)0>(float2 *, const T1 *)",
     False, "simt_conv_engine"),
    ("void splitKreduce_kernel<(int)32, (int)16, int, float>(cublasSplitKParams<T6>)", False,
     "splitk_reduce"),
    # communication
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm *, unsigned long, ncclWork *)", False,
     "nccl"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", False, "nccl"),
    # unknown: elementwise and friends, and names that only look alike
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>>"
     "(int, T2, T3)", None, None),
    ("void cudnn::ops::setTensor5d_kernel<float, float, (int)8>(cudnnTensorStruct, T1 *, T2)",
     None, None),
    ("void multi_tensor_apply_kernel<TensorListMetadata<(int)4>, AdamFunctor<float>>(int)", None,
     None),
    ("summation_kernel", None, None),
    ("dummy_gemma_loader", None, None),
]


@pytest.mark.parametrize(("name", "verdict", "rule"), CASES, ids=[c[0][:60] for c in CASES])
def test_taxonomy_classifies_known_names(name, verdict, rule):
    assert tc.classify_names([name]) == [(verdict, rule)]


def test_every_rule_is_exercised_by_a_case():
    # A rule no example reaches is either dead (shadowed by an earlier one) or untested.
    covered = {rule for _, _, rule in CASES}
    assert {r[2] for r in tc.TAXONOMY} <= covered


def test_rule_names_are_unique_and_versioned():
    names = [r[2] for r in tc.TAXONOMY]
    assert len(names) == len(set(names))
    assert isinstance(tc.TAXONOMY_VERSION, str) and tc.TAXONOMY_VERSION
    assert tc.rule_table().height == len(tc.TAXONOMY)


def test_matmul_without_tc_rules_are_negative_matrix_rules():
    verdicts = {r[2]: r[1] for r in tc.TAXONOMY}
    assert tc.MATMUL_WITHOUT_TC_RULES
    assert all(verdicts[r] is False for r in tc.MATMUL_WITHOUT_TC_RULES)
    assert "nccl" not in tc.MATMUL_WITHOUT_TC_RULES


def test_classify_falls_back_to_short_name_and_keeps_row_order():
    df = pl.DataFrame(
        {
            "demangled_name": [None, "ampere_sgemm_32x32_sliced1x4_tn", None],
            "short_name": ["volta_h884gemm_64x64_ldg8_nn", "x", None],
        },
        schema={"demangled_name": pl.String, "short_name": pl.String},
    )
    out = tc.classify(df).collect()
    assert out["tensor_core"].to_list() == [True, False, None]
    assert out["tensor_core_rule"].to_list() == ["mma_shape_gemm", "simt_gemm_conv", None]
    assert out.columns == ["demangled_name", "short_name", "tensor_core", "tensor_core_rule"]
