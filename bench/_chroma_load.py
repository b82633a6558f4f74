"""Load the HTTP benchmark's passages into a running Chroma server (runs in Chroma's own venv).

    /opt/chroma-venv/bin/python bench/_chroma_load.py --port P --data DIR

Reads `vectors.npy`, `texts.json` and `ids.json` (chunk id, source id) from DIR, creates the
collection `bench` (cosine space, no embedding function: the vectors are given), adds
everything in the server's maximum batch size, and prints the collection id. Each record's
metadata carries `source`, `revision` and `sr` (`source@revision`), so an allowed set of
(source, revision) pairs is one `$in` filter on `sr`, the cheapest exact form for Chroma.
Imports only chromadb and numpy: it never runs in the project's environment.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import chromadb
import numpy as np
from chromadb.config import Settings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", type=Path, required=True)
    args = parser.parse_args()
    vectors = np.load(args.data / "vectors.npy")
    texts = json.loads((args.data / "texts.json").read_text())
    ids = json.loads((args.data / "ids.json").read_text())
    client = chromadb.HttpClient(
        host="127.0.0.1", port=args.port, settings=Settings(anonymized_telemetry=False)
    )
    collection = client.create_collection(
        "bench", configuration={"hnsw": {"space": "cosine"}}, embedding_function=None
    )
    step = min(client.get_max_batch_size(), 5000)
    for start in range(0, len(ids), step):
        part = ids[start : start + step]
        collection.add(
            ids=[chunk for chunk, _ in part],
            embeddings=vectors[start : start + step],
            documents=texts[start : start + step],
            metadatas=[{"source": sid, "revision": "r1", "sr": f"{sid}@r1"} for _, sid in part],
        )
    if collection.count() != len(ids):
        raise SystemExit(f"chroma holds {collection.count()} records, expected {len(ids)}")
    print(collection.id)


if __name__ == "__main__":
    main()
