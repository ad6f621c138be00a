"""`FindingSpec`, the shape of one catalogue entry, and the order layers are presented in
(`nsysan.findings.catalogue` holds the entries)."""

from __future__ import annotations

from dataclasses import dataclass

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
