"""The semantic model of a file, split by question (see rules/static/index.py, which composes it)."""
