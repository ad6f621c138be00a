"""Test support: synthetic nsys-schema traces with planted truth.

`TraceBuilder` (in `synth`) writes SQLite files laid out exactly like real ``nsys export``
output (2022.4 / schema 3.0.0 or 2023.4 / schema 3.7.2); `scenarios` builds named training
pathologies on it and returns each file with the `PlantedTruth` a pass must recover.
"""

from nsysan.testing.synth import KernelName, TraceBuilder
from nsysan.testing.truth import PlantedTruth

__all__ = ["KernelName", "PlantedTruth", "TraceBuilder"]
