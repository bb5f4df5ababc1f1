"""Shared helpers: typed ``KEY=VALUE`` overrides of configs, and value validation."""
