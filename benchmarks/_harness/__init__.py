"""What the benchmark scripts share: GPU timing and kernel times (`timing`), same-run copies
(`copies`), the ops' inputs and call specs (`ops`), and the commit, device and place a result is
written under (`provenance`).

The scripts live one level down (suites/, sweeps/, archive/) and run as
`python benchmarks/<folder>/<script>.py` from anywhere; each puts the benchmarks folder on
sys.path once, before importing from here:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _harness
"""
