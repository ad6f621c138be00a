"""nsysan: what is the GPU waiting for? Analysis of NVIDIA Nsight Systems profiles."""

from nsysan._version import __version__ as __version__
from nsysan.api import AnalysisResult as AnalysisResult
from nsysan.api import analyze as analyze
from nsysan.api import analyze_to_dir as analyze_to_dir
from nsysan.frames.trace import Trace as Trace
from nsysan.load import open_trace as open_trace
