"""Analysis passes: one module per pass, registered in `nsysan.passes.registry`."""
