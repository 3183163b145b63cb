"""The contracts every audit kind, subject and world shares, at the bottom of the package: how a
step verifier, a tree verifier, an end-to-end generator and a tree generator are called and what
they must return; the reference verifiers; the decoding policy; sampling rows; the transformers
API both subjects and worlds speak; and the loopback transport a served world listens on. They
import nothing of exactcheck but its leaves (errors, options, subject_call), so toy_models may
import them and every kind builds on them without leaning on another kind."""
