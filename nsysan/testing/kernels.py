"""Real kernel names (as CUPTI reports them) for synthetic traces.

Demangled, short and mangled forms follow what real exports hold: cuBLAS / cuDNN-style
kernels have C linkage (all three names equal), PyTorch kernels are templates whose short
name is shared by many demangled names, NCCL kernels come in the pre-2.19
(``ncclKernel_*``) and 2.19+ (``ncclDevKernel_*``) namings. ``mangled=None`` kernels get a
NULL ``mangledName``, as older captures have.
"""

from __future__ import annotations

from nsysan.testing._model import KernelName


def _c(name: str, **kw) -> KernelName:
    return KernelName(name, name, name, **kw)


SGEMM = _c("ampere_sgemm_128x64_tn", grid=(8, 16, 1), block=(128, 1, 1), registers=122)
XMMA_GEMM = _c(
    "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel",
    grid=(16, 8, 1),
    block=(128, 1, 1),
    registers=232,
    dynamic_smem=81_920,
)
NCCL_ALLREDUCE_OLD = KernelName(
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm *, unsigned long, ncclWork *)",
    "ncclKernel_AllReduce_RING_LL_Sum_float",
    "_Z38ncclKernel_AllReduce_RING_LL_Sum_floatP11ncclDevCommmP8ncclWork",
    grid=(24, 1, 1),
    block=(640, 1, 1),
    registers=96,
    static_smem=41_760,
)
NCCL_ALLREDUCE_NEW = KernelName(
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE",
    grid=(32, 1, 1),
    block=(512, 1, 1),
    registers=88,
    static_smem=46_352,
)
ADD = KernelName(
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char *, 3>>(int, T2, T3)",
    "vectorized_elementwise_kernel",
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEENS_6detail5Array"
    "IPcLi3EEEEEviT0_T1_",
    grid=(2048, 1, 1),
    block=(128, 1, 1),
    registers=28,
)
FILL = KernelName(  # same short name as ADD: grouping by short name merges them
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "at::detail::Array<char *, 1>>(int, T2, T3)",
    "vectorized_elementwise_kernel",
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5Array"
    "IPcLi1EEEEEviT0_T1_",
    grid=(1, 1, 1),
    block=(64, 1, 1),
    registers=16,
)
CUTLASS_GEMM = KernelName(  # short name "Kernel": short names are not unique nor telling
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(T1::Params)",
    "Kernel",
    "_ZN7cutlass6KernelI52cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4EEvNT_6ParamsE",
    grid=(8, 8, 1),
    block=(128, 1, 1),
    registers=254,
    dynamic_smem=73_728,
)
REDUCE = KernelName(
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
    "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator "
    "()(at::TensorIterator &)::[lambda(float, float) (instance 1)]>, unsigned int, float, 4>>(T3)",
    "reduce_kernel",
    None,
    grid=(108, 1, 1),
    block=(32, 16, 1),
    registers=40,
    static_smem=16,
)
BATCHNORM = KernelName(
    "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>"
    "(cudnnTensorStruct, const float *, cudnnTensorStruct, float *, const float *, "
    "const float *, float, float, float *, float *, float *, float *, float, float)",
    "bn_fw_tr_1C11_kernel_NCHW",
    None,
    grid=(64, 1, 1),
    block=(512, 1, 1),
    registers=48,
)
ADAM = KernelName(
    "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::"
    "TensorListMetadata<4>, at::native::<unnamed>::FusedAdamMathFunctor<float, 4>, float *, "
    "double, double, double, double, double, bool, bool, float *, float *>(T1, T2, T3...)",
    "multi_tensor_apply_kernel",
    None,
    grid=(320, 1, 1),
    block=(512, 1, 1),
    registers=64,
)

ALL = (
    SGEMM,
    XMMA_GEMM,
    NCCL_ALLREDUCE_OLD,
    NCCL_ALLREDUCE_NEW,
    ADD,
    FILL,
    CUTLASS_GEMM,
    REDUCE,
    BATCHNORM,
    ADAM,
)
