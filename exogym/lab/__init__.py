"""What a researcher does with many runs: compare strategies (with their report and plots), sweep
a grid of settings, score a benchmark suite, check a strategy's conformance, estimate costs on
paper, sample from a trained language model.

The modules import one another in one direction only (no cycle, imports inside functions
included), from the runners down to the shared vocabulary:

- runners, which train: :mod:`~exogym.lab.bench` (over ``compare``), :mod:`~exogym.lab.sweep`
  (over ``compare``'s evaluation interval), :mod:`~exogym.lab.compare` (over
  :mod:`~exogym.lab.labels`, its strategies and their settings), and the independent
  :mod:`~exogym.lab.check` and :mod:`~exogym.lab.sample`;
- :mod:`~exogym.lab.estimate` (on paper; draws with ``plots``' matplotlib check);
- :mod:`~exogym.lab.plots`, which draws results and never imports a runner;
- the results and their texts: :mod:`~exogym.lab.report` (a comparison),
  :mod:`~exogym.lab.sweep_report` (a sweep);
- the shared vocabulary: :mod:`~exogym.lab.outcome` (one run, one quantity over repeats) and
  :mod:`~exogym.lab.formats` (how a table shows a number).
"""
