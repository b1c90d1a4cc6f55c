"""What the tests and the benchmarks share, on the product's own code with made-up data: a tiny federation of
phantom hospitals preprocessed into real shards (``federations``), a real Orthanc PACS (``orthanc``), a throwaway
PostgreSQL cluster (``postgres``) and a centre's records with synthetic numbers (``year_records``). Not shipped
(pyproject.toml packages the product only); it imports fedauc and never ``tests`` or ``benchmarks``, both of
which import it (tests/test_benchmark_imports.py)."""
