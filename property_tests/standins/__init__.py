"""Pure-torch stand-ins with the semantics of serving engines' verification code, for testing
exactcheck's engine adapters where the engines themselves cannot be installed or run (vLLM's
Triton kernels, sgl-kernel's CUDA kernels). Written from the engines' documented behaviour, not
copied; what each stand-in reproduces and what it cannot is said in its docstring."""
