"""Attach metadata when ingesting, then search only what matches it.

Against the quickstart host, from the directory that holds `state/`:
RETRIEVAL_HOST_TOKEN=$(cat state/token) python examples/metadata_filters.py \
    https://127.0.0.1:8443 state/ca.pem
"""

import sys

from retrieval_host_client import Client

BASE_URL, CA_BUNDLE = sys.argv[1], sys.argv[2]
CORPUS = "library"

REPORTS = {
    "inspection-2019": (b"# 2019\n\nThe turbine blades show light corrosion.", 2019, "en"),
    "inspection-2022": (b"# 2022\n\nThe turbine blades show two hairline cracks.", 2022, "en"),
    "inspection-2024": (b"# 2024\n\nDie Turbinenschaufeln zeigen Risse.", 2024, "de"),
}

with Client(BASE_URL, ca_bundle=CA_BUNDLE) as client:  # the token: RETRIEVAL_HOST_TOKEN
    # 1. Ingest with metadata: a JSON object of at most 16 scalars, beside what the
    #    document yields itself (front matter, e-mail headers, ...).
    for source_id, (text, year, lang) in REPORTS.items():
        client.ingest_context(
            text,
            corpus=CORPUS,
            source_id=source_id,
            media_type="text/markdown",
            metadata={"kind": "inspection", "year": year, "lang": lang},
        )

    # 2. Search with filters: applied with authorization, before ranking. A scalar is
    #    equality; operators are eq, ne, in, nin, gt, gte, lt, lte; `and`/`or` combine.
    filters = {
        "kind": "inspection",
        "or": [{"year": {"gte": 2022}, "lang": "en"}, {"lang": {"in": ["de", "fr"]}}],
    }
    result = client.search_context(corpus=CORPUS, query="turbine blade cracks", filters=filters)
    for hit in result.hits:
        print(f"{hit.source.id}: year {hit.metadata['year']}, {hit.metadata['lang']}")
