"""Tree verification: a verifier of a tree of candidates (EAGLE, SpecInfer, SGLang, TensorRT-LLM),
its contract, the exact tree rules, mutants from the engines' bugs, and the audit by output law."""
