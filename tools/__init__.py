"""qrouter-tool and benchmarks."""
