"""Catalogue entries of what the GPU waits for: input starvation, copies, syncs, launches,
communication, operator libraries, memory and start-up (`nsysan.findings.catalogue`)."""

from __future__ import annotations

from nsysan.findings.finding_spec import FindingSpec

SPECS = (
    FindingSpec(
        code="GPU_STARVATION_PERIODIC",
        title="GPU starves periodically (input pipeline)",
        layer="framework",
        severity_rule=(
            "Device idle gaps of >= 1 ms whose cause is host-side (NVTX range such as data "
            "loading, OS-runtime wait, or no CUDA activity at all) and "
            "that recur: in at least half of the steps, or regularly (at least 3 stalls every "
            "k steps, or at a regular period when steps are unknown). warning when they cover "
            ">= 5% of the steady-state device time, critical at >= 20%."
        ),
        advice=(
            "Feed the GPU ahead of time: more DataLoader workers, `pin_memory=True`, prefetching "
            "(`prefetch_factor`, DALI / tf.data prefetch), move decoding or augmentation to the "
            "GPU, cache the dataset on local storage."
        ),
        quick_check=(
            "Open the windows listed as evidence in nsys-ui: the CUDA HW rows are empty while "
            "the main thread sits in the named NVTX range / OS-runtime call; the same pattern "
            "repeats every step."
        ),
        nothing_found="No recurring host-side starvation gaps: the input pipeline keeps up.",
        needs=("gaps", "gap_summary"),
    ),
    FindingSpec(
        code="H2D_NOT_OVERLAPPED",
        title="Host-to-device copies not overlapped with compute",
        layer="runtime_driver",
        severity_rule=(
            "Time when an H2D copy runs and no compute kernel does, as a share of steady-state "
            "device time: warning >= 5%, critical >= 20%. Not reported when pageable or "
            "synchronous copies make up most of it (PAGEABLE_OR_SYNC_COPIES is the root cause)."
        ),
        advice=(
            "Copy from pinned memory with `non_blocking=True` on a separate stream and start "
            "the copy of batch n+1 while batch n computes (double buffering / prefetch to GPU)."
        ),
        quick_check=(
            "In nsys-ui, the Memcpy HtoD rows of the listed windows are not stacked under any "
            "kernel row of the same GPU."
        ),
        nothing_found="H2D copies are hidden behind compute (or there are none).",
        needs=("overlap_summary",),
    ),
    FindingSpec(
        code="PAGEABLE_OR_SYNC_COPIES",
        title="Pageable or synchronous memory copies in the steady state",
        layer="runtime_driver",
        severity_rule=(
            "Steady-state copies from/to pageable memory, or synchronous cudaMemcpy calls "
            "(H2D copies <= 64000 bytes and device-to-device copies excepted, as in nsys's own "
            "rule). Their cost is the GPU time they copy beside no compute plus the device idle "
            "they drain (gaps that start while the host is blocked in one). warning when the "
            "cost is >= 2% of steady-state device time, critical at >= 10%, info below."
        ),
        advice=(
            "Allocate host buffers pinned (`pin_memory()`, `cudaHostAlloc`), use the `Async` "
            "copy APIs on a non-default stream, and avoid `.cpu()` / `.item()` / `.numpy()` "
            "inside the training loop."
        ),
        quick_check=(
            "`nsys analyze -r cuda-async-memcpy,cuda-sync-memcpy` on the same report lists the "
            "same calls."
        ),
        nothing_found="No pageable or synchronous copies in the steady state.",
        needs=("gpu_ops", "cuda_api"),
    ),
    FindingSpec(
        code="HOST_SYNC_IN_STEP",
        title="Host synchronisation points inside the step",
        layer="runtime_driver",
        severity_rule=(
            "Synchronising CUDA API calls (cudaDeviceSynchronize, cudaStreamSynchronize, "
            "cudaEventSynchronize, ...) in the steady state that drain the GPU: the device "
            "idle time that starts while the host is blocked in the sync, until the next GPU "
            "op. warning when that idle time is >= 2% of steady-state device time and there "
            "is at least one sync per step (or >= 10 syncs without steps); critical at >= 10%."
        ),
        advice=(
            "Remove per-step `torch.cuda.synchronize()`, `.item()`, `.cpu()`, `print(loss)` "
            "and host-side conditionals on GPU values; log asynchronously every N steps; use "
            "CUDA events and `cudaStreamWaitEvent` instead of host waits."
        ),
        quick_check=(
            "`nsys analyze -r cuda-sync-api` lists the calls; on the timeline the GPU row is "
            "empty right after each listed call returns."
        ),
        nothing_found="No host synchronisation point drains the GPU in the steady state.",
        needs=("gpu_ops", "cuda_api"),
    ),
    FindingSpec(
        code="LAUNCH_BOUND",
        title="Launch-bound: the GPU waits for kernel launches",
        layer="runtime_driver",
        severity_rule=(
            "Device idle gaps shorter than 1 ms that end with an op whose launch call returned "
            "only after the GPU had gone idle (the work was not submitted yet), plus gaps the "
            "gaps pass attributes to launch calls. warning when they cover >= 10% of "
            "steady-state device time, critical at >= 30%."
        ),
        advice=(
            "Launch fewer, larger kernels: CUDA Graphs (`torch.cuda.graphs`, "
            "`torch.compile(mode='reduce-overhead')`), operator fusion, larger batches, "
            "multi-tensor optimizers (`foreach=True`/`fused=True`); remove Python overhead "
            "from the hot loop."
        ),
        quick_check=(
            "On the timeline, kernels are short (a few µs) with gaps between them, and each "
            "kernel starts right after its cudaLaunchKernel call ends (no launch queue)."
        ),
        nothing_found="The launch queue stays ahead of the GPU: not launch-bound.",
        needs=("gpu_ops", "cuda_api"),
    ),
    FindingSpec(
        code="EXPOSED_COMMUNICATION",
        title="Exposed communication (NCCL not overlapped with compute)",
        layer="communication",
        severity_rule=(
            "Time when an NCCL kernel runs and no compute kernel does, as a share of "
            "steady-state device time: warning >= 10%, critical >= 25%."
        ),
        advice=(
            "Overlap gradients' all-reduce with the backward pass (DDP bucketing: tune "
            "`bucket_cap_mb`, avoid `no_sync` misuse), start communication early, use "
            "gradient accumulation, check for ranks arriving late (stragglers) and for "
            "collectives issued after the backward pass has finished."
        ),
        quick_check=(
            "In nsys-ui the nccl kernels in the listed windows have no compute kernel beside "
            "them on any stream of the same GPU."
        ),
        nothing_found="Communication is hidden behind compute (or there is none).",
        needs=("overlap_summary",),
    ),
    FindingSpec(
        code="NCCL_LOW_BANDWIDTH",
        title="Low NCCL bus bandwidth",
        layer="communication",
        severity_rule=(
            "Median bus bandwidth of collectives of >= 1 MiB (message size from NCCL's NVTX "
            "payload or the nccl pass) below 10 GB/s: warning; below 2 GB/s: critical. Only "
            "evaluated when message sizes are known. `nsysan scaling` judges each job on the "
            "bus bandwidth over the transfer (first end minus last arrival: waiting for late "
            "ranks excluded) of collectives >= 16 MiB against the rated link (nominal NVLink / "
            "PCIe of the GPU model inside a node; `--inter-node-gbps` between nodes): below "
            "50% of it: warning; below 25%: critical."
        ),
        advice=(
            "Compare with `nccl-tests` on the same nodes; check NCCL_DEBUG=INFO for the "
            "transport chosen (NVLink / IB vs sockets), GPU-NIC affinity, NCCL_IB_* and "
            "NCCL_SOCKET_IFNAME settings, and whether the time includes waiting for late ranks."
        ),
        quick_check=(
            "Message size / kernel duration of the listed collectives, times the nccl-tests "
            "bus factor (2(n-1)/n for AllReduce)."
        ),
        nothing_found="NCCL collectives reach a plausible bus bandwidth.",
        needs=("nvtx", "attribution"),
    ),
    FindingSpec(
        code="NO_TENSOR_CORES",
        title="Large share of GPU time in kernels without Tensor Cores",
        layer="operator_library",
        severity_rule=(
            "Kernels that the kernel taxonomy classifies as not using Tensor Cores although "
            "they are matrix-multiply / convolution kernels: warning when they take >= 30% of "
            "compute kernel time, critical at >= 60%."
        ),
        advice=(
            "Train in mixed precision (`torch.autocast` with bf16/fp16, TF32 for fp32 "
            "matmuls: `torch.backends.cuda.matmul.allow_tf32 = True`), keep matrix dimensions "
            "multiples of 8, use channels-last for convolutions."
        ),
        quick_check=(
            "`nsys stats -r gpukernsum`: the listed kernels have no `hmma`/`xmma`/`tensorop`/"
            "`gmma` in their names."
        ),
        nothing_found="Matrix kernels use Tensor Cores (or take a small share).",
        needs=("kernels",),
    ),
    FindingSpec(
        code="DOMINANT_LAYER",
        title="One NVTX layer dominates GPU time",
        layer="operator_library",
        severity_rule=(
            "info when one NVTX range name holds >= 50% of GPU busy time exclusively (innermost "
            "range). It points at where to optimise first; it is not a defect."
        ),
        advice=(
            "Profile the kernels of that layer first (`nsys stats -r nvtxkernsum`), check their "
            "Tensor Core use and shapes, and consider fused or library implementations."
        ),
        quick_check="The layers table (layers.parquet) sorted by exclusive_gpu_ns.",
        nothing_found="No single NVTX layer dominates GPU time.",
        needs=("layers",),
    ),
    FindingSpec(
        code="MEMORY_CHURN",
        title="Memory allocation churn in the steady state",
        layer="framework",
        severity_rule=(
            "cudaMalloc / cudaFree / cudaHostAlloc-style calls (stream-ordered `*Async` "
            "allocations excepted) in the steady state: warning at >= 1 per step or when they "
            "block the host >= 2% of the steady window; critical at >= 10%; info otherwise."
        ),
        advice=(
            "Let the framework's caching allocator keep memory (avoid "
            "`torch.cuda.empty_cache()` in the loop), keep tensor shapes stable, preallocate "
            "buffers, or use `cudaMallocAsync` memory pools."
        ),
        quick_check="`nsys stats -r cudaapisum`: cudaMalloc/cudaFree counts grow with steps.",
        nothing_found="No allocation churn in the steady state.",
        needs=("cuda_api",),
    ),
    FindingSpec(
        code="MEMORY_NEAR_OOM",
        title="Device memory nearly full at the peak",
        layer="framework",
        severity_rule=(
            "From CUDA memory-usage events (captured with `--cuda-memory-usage=true`): the "
            "device's peak in use (device, array and static memory of all its processes) "
            "leaves <= 5% of TARGET_INFO_GPU totalMemory free: warning; <= 2%: critical "
            "(`memory.near_oom_warn_frac`, `memory.near_oom_crit_frac`)."
        ),
        advice=(
            "Lower the peak before it turns into an out-of-memory error: smaller micro-batches "
            "with gradient accumulation, activation checkpointing, mixed precision, sharded "
            "optimizer state (ZeRO / FSDP), or free large temporaries earlier."
        ),
        quick_check=(
            "memory.parquet: in_use_bytes_max around the peak time of memory_summary.parquet; "
            "`torch.cuda.max_memory_allocated()` agrees."
        ),
        nothing_found="Device memory keeps a safe margin at its peak.",
        needs=("memory_summary",),
    ),
    FindingSpec(
        code="MEMORY_GROWTH",
        title="Device memory in use grows step over step",
        layer="framework",
        severity_rule=(
            "From memory-usage events: over >= 4 steady steps, >= 75% of the steps end with "
            "more device memory in use than they started with and the level grows >= 1 MiB "
            "per step: warning; critical when the margin left would be used up within 1000 "
            "more steps at that rate (`memory.growth_*`)."
        ),
        advice=(
            "Look for tensors kept across steps: losses or outputs accumulated with their "
            "autograd graph (use `.item()` / `.detach()`), growing caches or lists, hooks "
            "that store activations; the allocation site (NVTX range) names where it "
            "allocates."
        ),
        quick_check=(
            "memory.parquet: in_use_bytes_end rises bin after bin; "
            "`torch.cuda.memory_allocated()` printed each step grows."
        ),
        nothing_found="Device memory in use does not grow from step to step.",
        needs=("memory_summary", "steps"),
    ),
    FindingSpec(
        code="POOL_FRAGMENTATION",
        title="Memory pool reserves far more than it uses (fragmentation)",
        layer="framework",
        severity_rule=(
            "From memory-usage events with memory-pool reports: a pool grew >= 3 times in the "
            "steady state although its free bytes (reserved - utilized) could have held the "
            "allocation, and it uses <= 50% of what it reserves at its reserved peak: warning "
            "(`memory.frag_min_growths`, `memory.frag_max_utilized_frac`)."
        ),
        advice=(
            "Keep allocation sizes stable (pad or bucket shapes), allocate large long-lived "
            "buffers first, trim the pool (`cudaMemPoolTrimTo`) or set a release threshold; in "
            "PyTorch try `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`."
        ),
        quick_check=(
            "memory.parquet: pool_size_bytes_max climbs while pool_utilized_bytes_max stays "
            "low; `torch.cuda.memory_reserved()` far above `memory_allocated()`."
        ),
        nothing_found="Memory pools use what they reserve.",
        needs=("memory_summary",),
    ),
    FindingSpec(
        code="SLOW_START",
        title="Slow start: long time to first kernel / first collective",
        layer="framework",
        severity_rule=(
            "Time from the first recorded CUDA call to the first kernel (and to the first NCCL "
            "kernel): info >= 5 s, warning >= 30 s."
        ),
        advice=(
            "Look at the top initialisation calls listed (context creation, module loading: "
            "try CUDA_MODULE_LOADING=LAZY; NCCL init; large synchronous uploads); start "
            "the profile later (`--delay`, capture range) if startup is not of interest."
        ),
        quick_check="The timeline before the first kernel: which API calls fill it.",
        nothing_found="Start-up is short: the first kernel comes quickly.",
        needs=("gpu_ops", "cuda_api"),
    ),
    FindingSpec(
        code="STARTUP_COST",
        title="Start-up costs inside the analysed window",
        layer="runtime_driver",
        severity_rule=(
            "Device idle gaps that start-up calls of >= 1 ms cover for at least half their "
            "length: the first launch of each kernel (CUDA lazy loading / JIT), module or "
            "library loading, context creation (the first CUDA call of a process), NCCL "
            "communicator init. info; warning when they idle the device >= 1 s. Such gaps "
            "count neither as launch-bound nor as starvation, and the verdict counts them as "
            "other."
        ),
        advice=(
            "Start the capture after warm-up (`nsys profile --delay`, or a capture range with "
            "`cudaProfilerStart` after the first iterations); run a warm-up iteration before "
            "timing; `CUDA_MODULE_LOADING=EAGER` moves module loading to start-up; ship "
            "kernels for the GPU's architecture (SASS, not only PTX) to avoid the JIT."
        ),
        quick_check=(
            "The listed calls (e.g. the first cudaLaunchKernel of a kernel) take milliseconds "
            "while the later launches of the same kernel take microseconds."
        ),
        nothing_found="No start-up call idles the GPU in the analysed window.",
        needs=("gpu_ops", "cuda_api", "gaps"),
    ),
)
