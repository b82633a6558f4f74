"""The run engine: grounded generation over authorized evidence, one deterministic path.

`engine.RunEngine` holds the main loop; the steps of its pipeline live beside it:

- `request`: validating a run request and its idempotency fingerprint.
- `state`: `ActiveRun`, one run in progress (what it found, spent and reports).
- `retrieval`: searches inside a run and their receipts; the `search_context` tool.
- `evidence`: fencing passages into prompts, and re-authorizing them before each step,
  before recording and on replay.
- `generation`: one generation step against a provider.
- `result`: the recorded result (manifest, artifact, usage).
- `replay`: answering a reused idempotency key with the recorded result.
"""

from retrieval_host.core.runs.engine import RunEngine
from retrieval_host.core.runs.request import (
    MAX_GENERATION_STEPS,
    MAX_INPUT_BYTES,
    request_fingerprint,
)
from retrieval_host.core.runs.retrieval import SEARCH_TOOL
from retrieval_host.core.runs.state import EventSink

__all__ = [
    "MAX_GENERATION_STEPS",
    "MAX_INPUT_BYTES",
    "SEARCH_TOOL",
    "EventSink",
    "RunEngine",
    "request_fingerprint",
]
