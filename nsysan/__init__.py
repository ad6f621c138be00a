"""nsysan: what is the GPU waiting for? Analysis of NVIDIA Nsight Systems profiles."""

from nsysan.allocator import tune_polars_allocator

tune_polars_allocator()  # before the imports below import polars (`nsysan.allocator`)
# ruff: noqa: E402 (the imports below must follow that call)

from nsysan._version import __version__ as __version__
from nsysan.api import AnalysisResult as AnalysisResult
from nsysan.api import analyze as analyze
from nsysan.api import analyze_to_dir as analyze_to_dir
from nsysan.frames.trace import Trace as Trace
from nsysan.load import open_trace as open_trace
from nsysan.model import Finding as Finding
from nsysan.model import PassResult as PassResult

__all__ = ["AnalysisResult", "Finding", "PassResult", "Trace", "__version__", "analyze",
           "analyze_to_dir", "open_trace"]
