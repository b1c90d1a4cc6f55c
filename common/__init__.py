"""What every layer of fedauc shares, below all of them: the error family a user can act on (``errors``), the
format version of every persisted file (``formats``), a process's lifetime (``lifetime``), small-count
suppression (``small_counts``), a site's declared privacy budget (``privacy_budget``), this machine's fedauc
folder (``home``), Markdown table cells (``markdown``) and a one-line notice on stderr (``notice``).

It imports nothing of fedauc (tests/test_imports.py): ``preprocessing``, ``models``, ``federated`` and
``pipelines`` may all import it, and it never pulls one of them, or their heavy dependencies, into a process.
"""
