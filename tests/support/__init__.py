"""What the test files share, one module a concern, imported as ``from support.NAME import ...``
(``pythonpath = ["tests"]`` in pyproject.toml's ``[tool.pytest.ini_options]`` puts ``tests/`` on
``sys.path``; a process a test starts gets it from :func:`support.scripts.child_env`).

- ``by_hand``: the closed-form strategy tests' scaffolding (tiny float64 models stacked on N
  nodes, gradients written by hand), a timeline that hears whom a test says.
- ``checkpoints``: the strategy-level checkpoint round trip.
- ``real_data``: where the tests find the real datasets (the fixtures of ``conftest.py``).
- ``resume_cases``: the exact-resume runs, importable by a fresh process, and how two runs'
  folders and checkpoints are compared.
- ``runs``: what several test files' runs share (a strategy's short-period overrides, models).
- ``async_runs``: the hand-computed traces of the asynchronous methods.
- ``toy_task``: the source of a task file, as a researcher writes one.
- ``scripts``: the repository's scripts (``bench/``, ``examples/``) imported by path, and the
  environment of a fresh process that imports these helpers.

Fixtures (the data folders, one intra-op thread, the registry restored) are in
``tests/conftest.py``.
"""
