"""Adapters that present other projects' verifiers through exactcheck's step contract."""
