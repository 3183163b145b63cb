"""Verdicts and reports: the ``Verdict`` record, the JSON envelope and Markdown (``json_md``), the
self-contained HTML page (``html``, rendered from the JSON), and writing them to disk (``files``)."""
