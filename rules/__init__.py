"""Diagnostic criteria: the symptom catalogue, the routing table, error
signatures and text-triage vocabulary (data, in `data/`), and the static rules.
"""
