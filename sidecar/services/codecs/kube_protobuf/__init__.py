"""Kubernetes protobuf request bodies, read as Kubernetes JSON (DESIGN §10).

kubectl's typed commands (`create <generator>`, `auth can-i`, `auth whoami`) send
`application/vnd.kubernetes.protobuf` bodies and do not fall back to JSON on a 415. This
package reads the kinds in `schema.KINDS`:

- schema.py: the API types as a table (published field numbers, Go JSON tags);
- descriptors.py: the table as protobuf descriptors (decoding is the `protobuf`
  package's);
- codec.py: envelope, size bound, unknown fields, conversion to Go's JSON;
- offload.py: costly bodies in worker processes, off the event loop, fair between
  tenants.
"""

from sidecar.services.codecs.kube_protobuf.codec import (
    MAGIC,
    MEDIA_TYPE,
    STATS,
    ProtobufError,
    Transcoded,
    read_kind,
    transcode,
)
from sidecar.services.codecs.kube_protobuf.offload import (
    COUNTS,
    INLINE_MAX_BYTES,
    transcode_request,
)
from sidecar.services.codecs.kube_protobuf.schema import KINDS, Kind

__all__ = [
    "COUNTS",
    "INLINE_MAX_BYTES",
    "KINDS",
    "MAGIC",
    "MEDIA_TYPE",
    "STATS",
    "Kind",
    "ProtobufError",
    "Transcoded",
    "read_kind",
    "transcode",
    "transcode_request",
]
