"""Drafters: each one file, all behind the interface in core.drafters.base."""
