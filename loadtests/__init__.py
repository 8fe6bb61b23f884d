"""Load scenarios and the overhead benchmark for the sidecar (DESIGN §11).

Run from the repository root: `python -m loadtests.run SCENARIO` or
`python loadtests/run.py SCENARIO`; `python loadtests/bench.py`. Needs the `load`
extra (locust, matplotlib).
"""
