"""Statistics: goodness of fit, anytime-valid e-processes, budget planning, exact laws, chain-rule
tests. Pure maths over counts and exact laws; nothing here drives a subject."""
