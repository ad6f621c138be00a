"""nsysan: what is the GPU waiting for? Analysis of NVIDIA Nsight Systems profiles."""

__version__ = "0.1.0"
