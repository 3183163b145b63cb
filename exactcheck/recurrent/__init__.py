"""The recurrent-state audit (``exactcheck recurrent``): generators over hybrid models whose
linear-attention layers keep a state that must be rolled back after a rejected draft."""
