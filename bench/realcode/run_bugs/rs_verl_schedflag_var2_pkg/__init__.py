"""A small training package for rs_verl_schedflag_var2 (ours): a checkpoint module and an engine module."""
