from exactcheck.pytest_plugin import verifier_tests

test_correct_verifier = verifier_tests("my_sampler:correct_verifier")
test_buggy_verifier = verifier_tests("my_sampler:buggy_verifier")
