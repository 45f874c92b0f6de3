"""Exit codes, documented in the README. One table for every command."""

OK = 0  # nothing at or above --fail-on
FINDINGS = 1  # a finding / measured symptom at or above --fail-on
USAGE = 2  # usage or input error (bad option, unreadable input, missing path)
QUESTION = 3  # `ask` needs an answer to one clarifying question
SCRIPT_FAILED = 4  # `run`: the script failed, was killed, timed out or hung
INTERNAL = 70  # a bug in torchdoctor itself (set TORCHDOCTOR_DEBUG=1 for the traceback)
INTERRUPTED = 130  # Ctrl-C
