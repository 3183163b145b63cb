"""The step-level verifier audit's parts: the contract, the reference verifier and its mutants,
the driver, forced randomness, the deterministic properties and their strategies, the
invalid-input probe, and the selftest."""
