"""The catalogue of finding codes, as data.

Every finding nsysan can emit has one entry here: what it means, which layer of the stack it
blames (DESIGN.md "The stack model"), the rule that sets its severity, what to do about it, the
quick check that confirms it on the timeline, and the sentence a report prints when the check
ran and found nothing. ``docs/findings.md`` is rendered from this module
(``python -m nsysan.findings.catalogue > docs/findings.md``) and a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from nsysan.passes.base import LAYERS

#: Order in which layers are presented (DESIGN.md's stack, top to bottom, then capture).
LAYER_TITLES = {
    "framework": "Framework (PyTorch / JAX / TF, data loading)",
    "communication": "Communication (NCCL, MPI)",
    "operator_library": "Operator libraries (cuDNN, cuBLAS)",
    "runtime_driver": "Runtime / driver (CUDA)",
    "hardware": "Hardware (GPU, NVLink, InfiniBand)",
    "capture": "Capture quality (the profile itself)",
}


@dataclass(frozen=True)
class FindingSpec:
    """One catalogue entry."""

    code: str
    title: str
    layer: str  # one of passes.base.LAYERS
    severity_rule: str  # when it is info / warning / critical, in words (defaults quoted)
    advice: str  # what to change
    quick_check: str  # how to confirm it by hand
    nothing_found: str  # printed when the rule ran and did not fire
    needs: tuple[str, ...] = ()  # pass tables / canonical frames the rule reads
    #: who emits it: ``diagnose`` (one trace, `nsysan.findings.rules`) or ``multirank`` (the
    #: job analysis over several rank profiles, `nsysan.multirank`)
    emitted_by: str = "diagnose"


_SPECS = (
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
    FindingSpec(
        code="NVTX_MISSING",
        title="No NVTX ranges: per-layer attribution unavailable",
        layer="capture",
        severity_rule="info whenever the profile holds no NVTX ranges (or NVTX was not traced).",
        advice=(
            "Record with `--trace=cuda,nvtx` and annotate the code: `torch.cuda.nvtx.range`, "
            "`torch.autograd.profiler.emit_nvtx()`, or NVTX ranges around steps and layers."
        ),
        quick_check="`nsys stats -r nvtxsum` prints no rows.",
        nothing_found="NVTX ranges are present.",
        needs=("nvtx",),
    ),
    FindingSpec(
        code="NVTX_LOW_COVERAGE",
        title="Much GPU time is outside any NVTX range",
        layer="capture",
        severity_rule=(
            "info when less than 50% of GPU busy time is attributed to an NVTX range."
        ),
        advice=(
            "Add ranges around the uncovered phases (optimizer step, data transfer, "
            "evaluation) so that per-layer attribution accounts for all GPU time."
        ),
        quick_check="Sum of exclusive_gpu_ns in layers.parquet vs total GPU busy time.",
        nothing_found="NVTX ranges cover most GPU time.",
        needs=("layers",),
    ),
    FindingSpec(
        code="CAPTURE_MISSING_TABLES",
        title="Activity not captured",
        layer="capture",
        severity_rule=(
            "critical when GPU activity (kernels / copies) is missing, warning when CUDA API "
            "calls are missing (no causes, no launch analysis), info for OS-runtime calls."
        ),
        advice=(
            "Record with `nsys profile --trace=cuda,nvtx,osrt` (and `--cuda-memory-usage=true` "
            "for memory) and export without dropping tables."
        ),
        quick_check="`sqlite3 report.sqlite .tables` lacks the named tables.",
        nothing_found="Every table the analysis uses was captured.",
    ),
    FindingSpec(
        code="CUDA_GRAPH_NO_NODES",
        title="CUDA graphs traced without their nodes",
        layer="capture",
        severity_rule=(
            "warning when the host launches CUDA graphs but no GPU op carries a graph node id: "
            "graph kernels are missing or summarised, so busy time and attribution are "
            "understated."
        ),
        advice="Record with `--cuda-graph-trace=node`.",
        quick_check="cudaGraphLaunch calls in the CUDA API row, no kernels under them.",
        nothing_found="CUDA graphs are absent or traced per node.",
        needs=("gpu_ops", "cuda_api"),
    ),
    FindingSpec(
        code="NVTX_UNTERMINATED",
        title="Unterminated NVTX ranges",
        layer="capture",
        severity_rule=(
            "info when ranges end at the session end (never closed, or the capture stopped "
            "inside them): their duration and attribution are unreliable."
        ),
        advice=(
            "Close every range (use context managers / `nvtx.annotate`) and stop the capture "
            "outside of ranges."
        ),
        quick_check="The listed ranges run to the right edge of the timeline.",
        nothing_found="Every NVTX range is closed.",
        needs=("nvtx",),
    ),
    FindingSpec(
        code="CAPTURE_TRUNCATED",
        title="Capture truncated or activity records lost",
        layer="capture",
        severity_rule=(
            "Successful kernel launch calls with no GPU record: info when they all lie at the "
            "end (the capture stopped with work in flight), warning when >= 1% of launches "
            "elsewhere lack their kernel (CUPTI buffers dropped)."
        ),
        advice=(
            "Stop the capture after a synchronisation point (capture range with "
            "`cudaProfilerStop` after `torch.cuda.synchronize()`); for dropped records raise "
            "the CUPTI buffer size or shorten the capture."
        ),
        quick_check="nsys-ui's Diagnostics summary reports dropped or unfinished events.",
        nothing_found="Every kernel launch has its GPU record.",
        needs=("gpu_ops", "cuda_api"),
    ),
    FindingSpec(
        code="CAPTURE_DATA_QUALITY",
        title="Impossible, duplicate or malformed rows repaired or dropped",
        layer="capture",
        severity_rule=(
            "Whenever a data-quality rule (docs/data-quality.md) took rows of a frame the "
            "analysis read: info when only exact copies, duplicate launch rows, cut names or "
            "defaulted columns, or when the impossible rows (NULL or non-integer timestamps, "
            "end before start, outside the session, conflicting string ids) are < 1% of "
            "their frame; warning >= 1%, critical >= 10%."
        ),
        advice=(
            "Re-export the report with `nsys export` (a third-party tool that sliced or "
            "synthesised the file may have damaged it); where the file is the original "
            "export, the numbers describe the remaining rows: check the dropped counts in "
            "manifest.json (\"quality\") before trusting small differences."
        ),
        quick_check=(
            "`nsysan schema TRACE` lists the rules and counts; in SQLite, e.g. "
            "`SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE end < start`."
        ),
        nothing_found="Every row of the export is possible: no data-quality rule applied.",
    ),
)

# Host evidence (the host pass: CPU sampling and context switches; nsysan.findings.rules_host).
_SPECS += (
    FindingSpec(
        code="HOST_CPU_BOUND",
        title="CPU-bound host: the GPU idles while the launching thread computes",
        layer="framework",
        severity_rule=(
            "Device gaps (>= 1 ms) in which the device's primary launching thread was busy "
            ">= 80% of the gap (on-CPU share from context switches, else samples x sampling "
            "period) and >= 50% of its samples there are in framework / data-pipeline modules "
            "(Python, libtorch, DALI, JPEG/PNG decoding, OpenCV, PIL); at least 3 such gaps "
            "and 10 samples. warning when they cover >= 5% of steady-state device time, "
            "critical at >= 20%."
        ),
        advice=(
            "Take the work off the launching thread: more DataLoader workers (processes, not "
            "threads), move decoding / augmentation to the GPU (DALI GPU operators, nvJPEG), "
            "prefetch batches, cut Python overhead in the step (torch.compile, CUDA Graphs)."
        ),
        quick_check=(
            "host_gaps.parquet: on_cpu_frac near 1 and framework_samples / "
            "data_pipeline_samples dominating for the primary launcher; on the timeline, the "
            "thread's CPU-sampling row is dense during the GPU gaps."
        ),
        nothing_found="The launching threads are not busy in framework code while the GPU "
                      "idles.",
        needs=("host_threads", "host_gaps"),
    ),
    FindingSpec(
        code="HOST_WAITS_ON_GPU",
        title="GPU-bound: the host waits in the CUDA driver",
        layer="runtime_driver",
        severity_rule=(
            "info when >= 60% of the CPU samples of the launching thread with the most "
            "samples (>= 100) are in the CUDA driver (libcuda / libcudart, and OS code such as "
            "`[vdso]` clock_gettime polled from it or taken during a CUDA API call) while the "
            "GPU is busy >= 70% of steady-state device time."
        ),
        advice=(
            "The run is GPU-bound: CPU-side tuning (more loader workers, faster Python) will "
            "not help. Speed up the GPU work itself (mixed precision, Tensor Cores, fused "
            "kernels, larger batches), or overlap the waits with useful host work."
        ),
        quick_check=(
            "host_threads.parquet: runtime_driver_frac of the launcher; on the timeline, long "
            "cudaStreamSynchronize / cudaEventSynchronize calls with the GPU busy underneath."
        ),
        nothing_found="The launching threads do not mostly wait in the driver.",
        needs=("host_threads", "overlap"),
    ),
    FindingSpec(
        code="CPU_CONTENTION",
        title="CPU contention: the launching thread is descheduled while the GPU idles",
        layer="hardware",
        severity_rule=(
            "Device gaps in which the primary launching thread was off-CPU without blocking "
            "for >= 50% of the gap (switched out while still running, where the export "
            "records thread states at switches; otherwise off-CPU time not covered by an "
            "OS-runtime or "
            "CUDA synchronization call, which needs `--trace=osrt`); at least 3 such gaps. "
            "warning when that time is >= 5% of steady-state device time, critical at >= 20%."
        ),
        advice=(
            "Give the launching and communication threads their own cores: bind processes to "
            "CPUs (`mpirun --bind-to core`, `srun --cpu-bind=cores`, `taskset`, `numactl`), "
            "limit intra-op / loader thread counts (OMP_NUM_THREADS, torch.set_num_threads, "
            "num_workers) to the cores available."
        ),
        quick_check=(
            "host_gaps.parquet: unblocked_off_cpu_ns of the primary launcher; on the timeline, "
            "the thread's row is empty (not running) during GPU gaps while other threads run "
            "on its CPUs."
        ),
        nothing_found="The launching threads are not descheduled while the GPU idles.",
        needs=("host_threads", "host_gaps"),
    ),
)

# Job-level findings (several rank profiles at once), emitted by nsysan.multirank.
_SPECS += (
    FindingSpec(
        code="RANK_STARTUP_SKEW",
        title="Ranks start at different times",
        layer="communication",
        severity_rule=(
            "warning when the time to the first collective (else the first kernel) differs "
            "by >= 500 ms across ranks (job parameter startup_skew_ns)."
        ),
        advice=(
            "Every rank waits for the slowest at the first collective: look at the late rank's "
            "initialisation (data set loading, NCCL init, module loading, checkpoint reads)."
        ),
        quick_check="ranks.parquet: first_collective_ns per rank.",
        nothing_found="Ranks reach their first collective together.",
        needs=("ranks",),
        emitted_by="multirank",
    ),
    FindingSpec(
        code="STRAGGLER_RANK",
        title="A rank is a straggler",
        layer="communication",
        severity_rule=(
            "A rank that arrives last at most matched collectives (>= 3 times, making the others "
            "wait >= 1% of its GPU span): warning when the waiting it imposes is >= 5% of its "
            "GPU span, info below. The finding's layer is that of the measured cause: "
            "operator_library (compute), framework (data loading), runtime_driver (host "
            "stalls), communication (unknown)."
        ),
        advice=(
            "Fix the named cause on that rank (uneven data shards or loader workers, a slower "
            "GPU or node, host stalls); check its step pattern (every k steps points at data "
            "loading or checkpointing)."
        ),
        quick_check="collectives.parquet: last_rank and wait_ns per collective instance.",
        nothing_found="No rank makes the others wait at collectives.",
        needs=("collectives",),
        emitted_by="multirank",
    ),
)

CATALOGUE: dict[str, FindingSpec] = {s.code: s for s in _SPECS}


def spec(code: str) -> FindingSpec:
    """The catalogue entry of ``code`` (KeyError names the known codes)."""
    try:
        return CATALOGUE[code]
    except KeyError:
        raise KeyError(f"unknown finding code {code!r}; known: {', '.join(CATALOGUE)}") from None


def render_markdown() -> str:
    """The catalogue as the markdown page docs/findings.md."""
    lines = [
        "# Finding codes",
        "",
        "<!-- generated by `python -m nsysan.findings.catalogue > docs/findings.md`; "
        "a test checks it -->",
        "",
        "Every finding names the layer of the stack that blocks the GPU and carries evidence:",
        "numbers with units, time windows and the top offending kernels, ranges or API calls.",
        "Severities are `info`, `warning` and `critical`; the thresholds below are the defaults",
        "of `nsysan.findings.FindingParams`. A rule whose inputs are missing is reported as",
        "*not evaluated* with the reason, never as a silent zero. The machine-readable form is",
        "`findings.json`, described by [findings-schema.json](findings-schema.json).",
        "",
        "| code | layer | title |",
        "|---|---|---|",
    ]
    lines += [f"| `{s.code}` | {s.layer} | {s.title} |" for s in _SPECS]
    from nsysan.findings import judgement  # (imports the rule context: not at module load)

    lines += ["", judgement.DOC.rstrip("\n")]
    for layer in LAYERS:
        specs = [s for s in _SPECS if s.layer == layer]
        if not specs:
            continue
        lines += ["", f"## {LAYER_TITLES[layer]}"]
        for s in specs:
            lines += [
                "",
                f"### `{s.code}` — {s.title}",
                "",
                f"- **Layer:** {s.layer}",
                f"- **Severity:** {s.severity_rule}",
                *([f"- **Minimum activity:** {judgement.RULE_TEXT}"]
                  if s.code in judgement.JUDGED else []),
                *([f"- **Judgement:** {judgement.CODE_TEXT[s.code]}"]
                  if s.code in judgement.CODE_TEXT else []),
                f"- **Advice:** {s.advice}",
                f"- **Quick check:** {s.quick_check}",
                f"- **When nothing is found:** {s.nothing_found}",
            ]
            if s.needs:
                lines.append(f"- **Reads:** {', '.join(f'`{n}`' for n in s.needs)}")
            if s.emitted_by != "diagnose":
                lines.append("- **Emitted by:** the multi-rank job analysis (`nsysan.multirank`)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - documentation generator
    print(render_markdown(), end="")
