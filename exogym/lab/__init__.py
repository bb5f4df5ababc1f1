"""What a researcher does with many runs: compare strategies (with their report and plots),
estimate costs on paper, sample from a trained language model."""
