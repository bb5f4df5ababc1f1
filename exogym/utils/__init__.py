"""Shared helpers: typed ``KEY=VALUE`` overrides of configs, value validation, loading
``SOURCE:Name`` specs, signal handling, and a package's names imported on first use."""
