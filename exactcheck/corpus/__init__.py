"""A corpus of correct implementations written differently from exactcheck's own reference.

The mutant corpus (``exactcheck.step.mutants``) proves the checks see bugs; this corpus proves they
see none where there is none. ``verifiers`` holds exact step-level verifiers, ``generators``
exact end-to-end generators (one keeps no cache at all).
"""
