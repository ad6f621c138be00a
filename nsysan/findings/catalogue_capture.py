"""Catalogue entries of the profile's own quality, host evidence and job-level findings
(`nsysan.findings.catalogue`)."""

from __future__ import annotations

from nsysan.findings.finding_spec import FindingSpec

SPECS = (
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
SPECS += (
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
        title="CPU contention: threads that feed the GPU wait for a CPU while it idles",
        layer="hardware",
        severity_rule=(
            "Device gaps in which, for >= 50% of the gap, the primary launching thread or a "
            "communication thread (NCCL proxy, MPI progress: samples mostly in the "
            "communication layer) was off-CPU without blocking, or more threads of the "
            "process tree wanted a CPU than the CPUs it ran on. Off-CPU without blocking: "
            "switched out while still running, where the export records thread states at "
            "switches; otherwise off-CPU time not covered by an OS-runtime or CUDA "
            "synchronization call, which needs `--trace=osrt`. At least 3 such gaps; "
            "warning when the contended time is >= 5% of steady-state device time, critical "
            "at >= 20%."
        ),
        advice=(
            "Give the launching and communication threads their own cores: bind processes to "
            "CPUs (`mpirun --bind-to core`, `srun --cpu-bind=cores`, `taskset`, `numactl`), "
            "limit intra-op / loader thread counts (OMP_NUM_THREADS, torch.set_num_threads, "
            "num_workers) to the cores available."
        ),
        quick_check=(
            "host_gaps.parquet: unblocked_off_cpu_ns of the primary launcher and the "
            "communication threads, oversubscribed_ns; host_threads.parquet: n_migrations; "
            "on the timeline, the thread's row is empty (not running) during GPU gaps while "
            "other threads run on its CPUs."
        ),
        nothing_found="The threads that feed the GPU are not kept from a CPU while it idles.",
        needs=("host_threads", "host_gaps"),
    ),
)

# Job-level findings (several rank profiles at once), emitted by nsysan.multirank.
SPECS += (
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
