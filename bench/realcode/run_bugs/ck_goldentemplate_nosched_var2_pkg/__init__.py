"""A small training package for ck_goldentemplate_nosched_var2 (ours): io helpers and a trainer loop."""
