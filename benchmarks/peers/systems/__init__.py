"""The peers' own runs, each started by ``benchmarks.peers`` in a fresh process of its system's environment
(``python -m benchmarks.peers.systems.<system> --one <job JSON>``): not benchmarks of their own."""
