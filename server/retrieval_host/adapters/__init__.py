"""Adapters: the stores, embedding models, providers and services behind core's ports.

onnxruntime (the local model's runtime, `embedding_local`; also imported first by
`sqlite.approximate`) writes a device id and a telemetry event cache under `$HOME/.cache/
Microsoft` unless `ORT_DISABLE_TELEMETRY` is set: the host promises a model loaded with no
network (SPEC 3.6) and a container that needs none, and the Docker image's `$HOME` is its state
volume (probe A, session 42). So it is set here, before any adapter imports onnxruntime,
unless the process set it already.
"""

import os

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
