"""fedauc against its peers (docs/performance.md "Against the peers"): ``python -m benchmarks.peers``."""
