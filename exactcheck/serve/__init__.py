"""The serve audit: a running server, black box, against a reference (``exactcheck.serve.runner``)."""
