"""The JSON of the host: the one place camelCase meets the core's snake_case.

- `retrieval`: search, index and delete requests and responses (the public wire).
- `runs`: run requests, run events, run results and the run record of `GET /v1/runs/{id}`
  (the public wire).
- `problems`: the `application/problem+json` document every error is rendered as.
- `run_storage`: how run stores keep a run result. A versioned format of its own, not the
  public wire: the wire may gain or rename fields without rewriting stored records.

Core never imports this package (tests/core/test_core_has_no_io_imports.py) and holds no
camelCase key (tests/core/test_core_has_no_wire_keys.py); the HTTP layer and the run stores
import it.
"""
