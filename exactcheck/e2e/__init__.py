"""The end-to-end generator audits: the generator contract and decoding policy, the driver, the
reference speculative loop and its mutants, cache invariants, greedy identity, and the audits of
toy model worlds, real models and a real grammar engine."""
