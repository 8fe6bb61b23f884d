"""`python -m sidecar.kube_protobuf`: the protobuf worker process (worker.py)."""

from sidecar.kube_protobuf.worker import main

main()
