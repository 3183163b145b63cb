"""Version compatibility (transformers 4.57 to 5.x), the device option everywhere, and the
large-vocabulary draft sampler."""
import numpy as np
import pytest
import torch

from exactcheck.cli import main
from exactcheck.contracts.sampling import AliasTable, CdfTable, state_sampler


def _law(vocab: int, states: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    law = rng.dirichlet(np.full(vocab, 0.5), size=states)
    law[:, ::7] = 0.0  # zero-mass tokens must never be drawn
    return torch.from_numpy(law / law.sum(1, keepdims=True))


def test_cdf_sampler_draws_the_law_on_a_grid_of_uniforms():
    """Deterministic: N evenly spaced uniforms give each token within 1/N of its probability."""
    law = _law(vocab=200, states=3, seed=0)
    table = CdfTable(law)
    n = 200_000
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    for state in range(3):
        tokens = table.sample(torch.full((n,), state), u)
        freq = torch.bincount(tokens, minlength=200).double() / n
        assert float((freq - law[state]).abs().max()) <= 1.0 / n + 1e-12
        assert int(tokens[law[state, tokens] == 0].numel()) == 0


def test_cdf_sampler_bisects_to_the_inverse_cdf_of_the_gathered_row():
    """The in-place bisection gives the token ``inverse_cdf`` gives on the state's gathered row,
    at u = 0, at u on a cumulative value, at u past the rounded total (the clamp to the last
    token of positive mass), with zero-mass tokens at the ends and a one-token row."""
    from exactcheck.contracts.sampling import inverse_cdf
    gen = torch.Generator().manual_seed(0)
    for vocab in (65, 128, 129, 1000, 32000):
        law = torch.rand(9, vocab, generator=gen, dtype=torch.float64) ** 4
        law[torch.rand(9, vocab, generator=gen) < 0.3] = 0.0
        law[3, -50:] = 0.0
        law[5] = 0.0
        law[5, 7] = 1.0
        table = CdfTable(law)
        states = torch.randint(0, 9, (6_000,), generator=gen)
        u = torch.rand(6_000, generator=gen, dtype=torch.float64)
        u[:500] = 0.0
        u[500:1000] = 1.0 - 2.0 ** -53
        on = table.cdf[states[1000:2000], torch.randint(0, vocab, (1000,), generator=gen)]
        u[1000:2000] = torch.where(on < 1, on, 0.5)
        assert torch.equal(table.sample(states, u), inverse_cdf(table.cdf.index_select(0, states), u))


def test_driver_keeps_walker_tables_where_the_builtin_worlds_are():
    assert isinstance(state_sampler(_law(64, 2, 1)), AliasTable)
    assert isinstance(state_sampler(_law(65, 2, 1)), CdfTable)


def test_device_is_checked_before_any_work():
    for argv in (["e2e", "reference-loop", "--device", "nonsense"],
                 ["greedy", "--device", "nonsense"],
                 ["grammar", "--device", "nonsense"]):
        assert main(argv + ["--quiet"]) == 2


def test_gate_reads_a_device_and_refuses_a_bad_one_before_auditing(tmp_path, capsys):
    from exactcheck.gate import read_config
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.exactcheck]\ndevice = "cpu"\n[[tool.exactcheck.subject]]\n'
                      'verifier = "exactcheck.contracts.reference_verifier:reference_verifier"\n'
                      '[[tool.exactcheck.subject]]\nname = "second"\ngenerator = "reference-loop"\n'
                      'device = "nonsense"\n')
    subjects = read_config(config)
    assert [s.options.device for s in subjects] == ["cpu", "nonsense"]
    assert main(["gate", "--config", str(config), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "second" in err and "not a torch device" in err and "Traceback" not in err
    assert [s.options.device for s in read_config(config, device="cpu")] == ["cpu", "cpu"]


def test_a_real_model_is_handed_its_cache_under_this_transformers():
    """transformers 5.17 silently drops ``cache=`` (its name is ``past_key_values`` there); the
    compat module hands the cache under the name this release reads, so it fills."""
    pytest.importorskip("transformers")
    from exactcheck.contracts import transformers_compat as compat
    from toy_models.real_models import tiny_llama_pair
    target, _ = tiny_llama_pair(vocab_size=32, hidden_size=16, layers=1)
    cache = compat.new_cache()
    with torch.no_grad():
        out = compat.forward(target, torch.tensor([[1, 2, 3]]), cache, use_cache=True)
    assert cache.get_seq_length() == 3
    assert compat.output_cache(out) is cache
    compat.require_supported()
