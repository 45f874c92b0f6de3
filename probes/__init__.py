"""Run-time instruments that live inside the user's process."""
