"""`python -m sidecar.services.codecs.kube_protobuf`: the protobuf worker process (worker.py)."""

from sidecar.services.codecs.kube_protobuf.worker import main

main()
