"""Commands users run (not components): the offline render."""
