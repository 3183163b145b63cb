"""Tree verifiers by name: the references, the mutants, SGLang's adapter, or MODULE:CALLABLE."""
from __future__ import annotations

from exactcheck.errors import UsageError

__all__ = ["load_tree_verifier", "builtin_tree_verifiers"]


def builtin_tree_verifiers() -> dict:
    from exactcheck.adapters.sglang_tree import SglangTreeGreedy, SglangTreeTargetOnly
    from exactcheck.tree.mutants import BOUNDARY_TREE_MUTANTS, TREE_MUTANTS, first_branch_only, pruned_by_target_top_k
    from exactcheck.contracts.tree_reference import LOSSY_TREE_VERIFIERS, REFERENCE_TREE_VERIFIERS
    out = {f"tree-reference:{name}": v for name, v in REFERENCE_TREE_VERIFIERS.items()}
    out.update({f"tree-lossy:{name}": v for name, v in LOSSY_TREE_VERIFIERS.items()})
    from exactcheck.corpus.trees import TREE_CORPUS
    out["tree-corpus:first_branch_only"] = first_branch_only
    out["tree-corpus:pruned_by_target_top_k"] = pruned_by_target_top_k
    out.update({f"tree-corpus:{name}": v for name, v in TREE_CORPUS.items()})
    out.update({f"tree-mutant:{name}": v for name, v in {**TREE_MUTANTS, **BOUNDARY_TREE_MUTANTS}.items()})
    out["sglang-tree-target-only"] = SglangTreeTargetOnly("layout")
    out["sglang-tree-target-only-cuda"] = SglangTreeTargetOnly("cuda")
    out["sglang-tree-greedy"] = SglangTreeGreedy("layout")
    out["sglang-tree-greedy-triton"] = SglangTreeGreedy("triton")
    from exactcheck.adapters.trtllm_tree import TrtllmDynamicTree
    out["trtllm-dynamic-tree"] = TrtllmDynamicTree()
    from exactcheck.adapters.medusa_tree import MedusaTree
    out["medusa-typical"] = MedusaTree("typical")
    out["medusa-greedy"] = MedusaTree("greedy")
    out["medusa-typical-github-padding"] = MedusaTree("typical", padding="medusa")
    return out


def load_tree_verifier(name: str):
    builtin = builtin_tree_verifiers()
    if name in builtin:
        subject = builtin[name]
        if name.startswith("medusa-"):
            from exactcheck.adapters.medusa_tree import medusa_available
            if medusa_available():
                raise UsageError(f"{name}: {medusa_available()}")
        if name.endswith("-cuda"):
            from exactcheck.adapters.sglang_tree import cuda_kernel_available
            why = cuda_kernel_available()
            if why:
                raise UsageError(f"{name}: {why} (sglang-tree-target-only runs the same walk in torch)")
        return subject
    if name.startswith(("tree-reference:", "tree-lossy:", "tree-mutant:", "tree-corpus:")):
        raise UsageError(f"unknown tree verifier {name!r}; built in: {sorted(builtin)}")
    from exactcheck.loading import load_subject
    return load_subject(name)
