"""The omni-trio benchmark suite, outside the installed package: ``python -m benchmarks [--quick]
[--json PATH] [--only W1,...] [--vs-sglang-omni]``. Run from a checkout of the repository."""
