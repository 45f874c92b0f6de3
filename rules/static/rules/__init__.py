"""Rule families, one module per specialist area (`memory.py` + `memory.toml`, ...).

Modules here are discovered by registry.py; see `torchdoctor.rules.static` for the rule API.
"""
