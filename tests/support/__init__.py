"""Builders of test inputs shared by several tiers (stdlib only)."""
